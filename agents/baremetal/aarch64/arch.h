/* aarch64: the primitives the shared kernel inlines (the virtual counter, interrupt masking, barriers, MMIO). */
#ifndef RTVIRT_BAREMETAL_ARCH_H
#define RTVIRT_BAREMETAL_ARCH_H

#include <stdint.h>

#define ARCH_NAME "aarch64"
#define ARCH_CYCLES_KEY "counter_source" /* the header's name for how the counter's rate was found */
#define TIMER_NAME "generic timer"
#define TIMER_COUNTER "CNTVCT"

#define sysreg_read(name)                                                                                             \
    ({                                                                                                                \
        uint64_t _v;                                                                                                  \
        __asm__ volatile("mrs %0, " #name : "=r"(_v));                                                                \
        _v;                                                                                                           \
    })
#define sysreg_write(name, v) __asm__ volatile("msr " #name ", %0" ::"r"((uint64_t)(v)) : "memory")
#define isb() __asm__ volatile("isb" ::: "memory")

/* The virtual counter: what a guest's timer counts (CNTVOFF applied by the hypervisor); the isb keeps the
 * read from being taken early, before the instructions it is meant to follow. */
static inline uint64_t cycles(void) {
    uint64_t v;
    __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v)::"memory");
    return v;
}

typedef uint64_t irq_flags;
static inline irq_flags irq_save(void) {
    uint64_t flags;
    __asm__ volatile("mrs %0, daif; msr daifset, #2" : "=r"(flags)::"memory");
    return flags;
}
static inline void irq_restore(irq_flags flags) { __asm__ volatile("msr daif, %0" ::"r"(flags) : "memory"); }
static inline void irq_disable(void) { __asm__ volatile("msr daifset, #2" ::: "memory"); }
static inline void irq_enable(void) { __asm__ volatile("msr daifclr, #2" ::: "memory"); }
/* Interrupts are masked: wfi returns once one is pending (masked or not), then unmasking takes it. */
static inline void idle_wait_and_enable(void) { __asm__ volatile("dsb sy; wfi; msr daifclr, #2" ::: "memory"); }
static inline void cpu_relax(void) { __asm__ volatile("yield" ::: "memory"); }
static inline void switch_trap(void) { __asm__ volatile("svc #0" ::: "memory"); }

#define barrier() __asm__ volatile("" ::: "memory")
/* ordering towards another CPU (the host's device model, Xen's console daemon): inner-shareable barriers */
#define wmb() __asm__ volatile("dmb ishst" ::: "memory")
#define rmb() __asm__ volatile("dmb ishld" ::: "memory")
#define mb() __asm__ volatile("dmb ish" ::: "memory")

static inline uint32_t mmio_read32(uintptr_t addr) {
    uint32_t v;
    __asm__ volatile("ldr %w0, [%1]" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
static inline void mmio_write32(uintptr_t addr, uint32_t v) {
    __asm__ volatile("str %w0, [%1]" ::"r"(v), "r"(addr) : "memory");
}
static inline void mmio_write64(uintptr_t addr, uint64_t v) {
    __asm__ volatile("str %0, [%1]" ::"r"(v), "r"(addr) : "memory");
}
static inline uint8_t mmio_read8(uintptr_t addr) {
    uint8_t v;
    __asm__ volatile("ldrb %w0, [%1]" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
static inline void mmio_write8(uintptr_t addr, uint8_t v) {
    __asm__ volatile("strb %w0, [%1]" ::"r"(v), "r"(addr) : "memory");
}

/* ---- the platform, as the device tree describes it (aarch64/fdt.c fills it in at boot) ---- */
typedef struct {
    uint64_t base, size;
    uint32_t irq; /* GIC INTID (SPI: +32, PPI: +16), 0 if none */
} fdt_device;
/* the devices found, by kind: the console UART, the RTC, virtio-mmio slots, the power key's GPIO controller */
enum { MAX_VIRTIO_MMIO = 32 };
typedef struct {
    uint64_t ram_base, ram_size;
    char *bootargs;
    fdt_device uart, rtc, gpio;
    unsigned power_key_pin; /* the GPIO line of the power button (QEMU's system_powerdown) */
    bool has_power_key;
    fdt_device virtio[MAX_VIRTIO_MMIO]; /* in the device tree's order */
    unsigned nvirtio;
    int gic_version; /* 2, 3; 0: none */
    uint64_t gicd, gicc, gicr; /* distributor, v2 CPU interface, v3 redistributors */
    uint32_t timer_irq;        /* the virtual timer's PPI (INTID) */
    bool psci_hvc, has_psci;   /* PSCI (and SMCCC) through HVC or SMC */
    bool xen;                  /* a /hypervisor node compatible "xen,xen" */
    uint64_t dtb, dtb_size;
} platform_info;
extern platform_info platform;
void fdt_scan(const void *dtb); /* fills platform; stops the guest if the blob is not a device tree */

/* aarch64/mmu.c: the identity map built at boot maps the first GiB as device memory and the rest as RAM; a page the
 * hypervisor shares with us inside the device GiB (Xen's console ring, KVM's stolen-time structure) must be
 * ordinary memory for both sides to see the same bytes. */
void map_normal_page(uint64_t paddr);

/* aarch64/hw.c: SMCCC calls through the PSCI conduit; returns x0 */
uint64_t smccc_call(uint32_t function, uint64_t a1, uint64_t a2, uint64_t a3);

#endif
