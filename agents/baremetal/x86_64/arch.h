/* x86_64: the primitives the shared kernel inlines (the TSC, interrupt flags, port I/O, barriers). */
#ifndef RTVIRT_BAREMETAL_ARCH_H
#define RTVIRT_BAREMETAL_ARCH_H

#include <stdint.h>

#define ARCH_NAME "x86_64"
#define ARCH_CYCLES_KEY "tsc_source" /* the header's name for how the counter's rate was found */
#define TIMER_NAME "LAPIC timer"
#define TIMER_COUNTER "TSC"

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(uint16_t port, uint16_t v) { __asm__ volatile("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint16_t inw(uint16_t port) {
    uint16_t v;
    __asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint32_t inl(uint16_t port) {
    uint32_t v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint64_t cycles(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
static inline void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
static inline void wrmsr(uint32_t msr, uint64_t v) {
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32)));
}

typedef uint64_t irq_flags;
static inline irq_flags irq_save(void) {
    uint64_t flags;
    __asm__ volatile("pushfq; popq %0; cli" : "=r"(flags)::"memory");
    return flags;
}
static inline void irq_restore(irq_flags flags) {
    if (flags & 0x200) __asm__ volatile("sti" ::: "memory");
}
static inline void irq_disable(void) { __asm__ volatile("cli" ::: "memory"); }
static inline void irq_enable(void) { __asm__ volatile("sti" ::: "memory"); }
/* Interrupts are off: halt until one comes, then take it (sti takes effect after hlt has started, so no
 * wake-up is lost between the caller's check and the halt). */
static inline void idle_wait_and_enable(void) { __asm__ volatile("sti; hlt" ::: "memory"); }
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }
enum { SWITCH_VECTOR = 34 };
/* What `int $34` does, done by a function (isr.S): an interrupt frame, then the vector's stub. KVM's instruction
 * emulator cannot run `int` in long mode, and a KVM that emulates the guest (a nested host without hardware
 * virtualization) stops the VM there. */
void switch_trap(void);

/* x86 keeps stores in order and loads in order (TSO): only the compiler must not reorder */
#define barrier() __asm__ volatile("" ::: "memory")
#define wmb() barrier()
#define rmb() barrier()
#define mb() __asm__ volatile("mfence" ::: "memory")

#endif
