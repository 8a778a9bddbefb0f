/* x86_64 interrupts: the IDT, the local APIC and its timer (TSC-deadline where CPUID offers it, else one-shot),
 * self-IPIs, the NMI that stops a run, and the frame every interrupt stub (isr.S) saves, which is also a thread's
 * saved state: threads switch only in isr_dispatch. */
#include "kernel.h"

enum { NMI_VECTOR = 2, LAPIC_TIMER_VECTOR = 32, KOPS_IPI_VECTOR = 33, STOP_VECTOR = 35, SPURIOUS_VECTOR = 255 };
enum { LAPIC_BASE = 0xFEE00000u };
enum { LAPIC_EOI = 0xB0, LAPIC_SVR = 0xF0, LAPIC_ICR_LO = 0x300, LAPIC_ICR_HI = 0x310, LAPIC_LVT_TIMER = 0x320,
       LAPIC_INITIAL = 0x380, LAPIC_CURRENT = 0x390, LAPIC_DIVIDE = 0x3E0, LAPIC_TPR = 0x80 };
enum { MSR_TSC_DEADLINE = 0x6E0 };

typedef struct {
    uint64_t r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx, rcx, rbx, rax;
    uint64_t vector, error, rip, cs, rflags, rsp, ss;
} frame;

struct __attribute__((packed)) idt_entry {
    uint16_t offset_lo, selector;
    uint8_t ist, type;
    uint16_t offset_mid;
    uint32_t offset_hi, zero;
};
static struct idt_entry idt[256];
extern const uint64_t isr_stubs[37];
extern uint64_t page_dirs[2048];
static bool has_tsc_deadline;
static uint64_t apic_per_tsc_q32;

static inline volatile uint32_t *lapic(uint32_t reg) { return (volatile uint32_t *)(uintptr_t)(LAPIC_BASE + reg); }
static void lapic_eoi(void) { *lapic(LAPIC_EOI) = 0; }

static void lapic_self_ipi(uint8_t vector) {
    *lapic(LAPIC_ICR_HI) = 0;
    *lapic(LAPIC_ICR_LO) = (1u << 18) | vector; /* shorthand: self, fixed delivery */
}

void kops_self_ipi(void) { lapic_self_ipi(KOPS_IPI_VECTOR); }

bool arch_stop_pending(void) { return false; } /* the NMI sets stop_requested even with interrupts off */

void interrupts_init(void) {
    for (int i = 0; i < 37; i++) {
        int vector = i < 36 ? i : SPURIOUS_VECTOR;
        uint64_t a = isr_stubs[i];
        idt[vector] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8E, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
    }
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } pointer = {sizeof idt - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(pointer));
}

static uint64_t q32_ratio(uint64_t num, uint64_t den) { return (uint64_t)(((__uint128_t)num << 32) / den); }
static uint64_t q32_mul(uint64_t v, uint64_t q) { return (uint64_t)(((__uint128_t)v * q) >> 32); }

void timer_init(void) {
    uint32_t r[4];
    cpuid(1, 0, r);
    has_tsc_deadline = (r[2] >> 24) & 1;
    /* the APIC page is device memory: uncached (PCD|PWT) for the top GiB of the identity map */
    for (int i = 1536; i < 2048; i++) page_dirs[i] |= (1u << 3) | (1u << 4);
    __asm__ volatile("mov %%cr3, %%rax; mov %%rax, %%cr3" ::: "rax", "memory");
    outb(0x21, 0xff); /* mask the legacy PICs: only the LAPIC interrupts us */
    outb(0xa1, 0xff);
    *lapic(LAPIC_TPR) = 0;
    *lapic(LAPIC_SVR) = 0x100 | SPURIOUS_VECTOR;
    *lapic(LAPIC_DIVIDE) = 0xB; /* divide by 1 */
    if (has_tsc_deadline) {
        *lapic(LAPIC_LVT_TIMER) = (2u << 17) | LAPIC_TIMER_VECTOR;
        return;
    }
    /* one-shot mode: how many APIC ticks per TSC cycle (measured over 5 ms, masked) */
    *lapic(LAPIC_LVT_TIMER) = (1u << 16) | LAPIC_TIMER_VECTOR;
    *lapic(LAPIC_INITIAL) = 0xFFFFFFFFu;
    uint64_t start = cycles(), span = cycles_hz / 200;
    while (cycles() - start < span) {}
    uint32_t elapsed = 0xFFFFFFFFu - *lapic(LAPIC_CURRENT);
    uint64_t taken = cycles() - start;
    *lapic(LAPIC_INITIAL) = 0;
    apic_per_tsc_q32 = q32_ratio(elapsed, taken);
    *lapic(LAPIC_LVT_TIMER) = LAPIC_TIMER_VECTOR; /* one-shot, unmasked */
}

const char *timer_mode(void) { return has_tsc_deadline ? "tsc-deadline" : "lapic-oneshot"; }
const char *interrupt_controller(void) { return "lapic"; }

void timer_arm(uint64_t deadline) {
    if (has_tsc_deadline) {
        wrmsr(MSR_TSC_DEADLINE, deadline);
        return;
    }
    uint64_t now = cycles();
    uint64_t ticks = deadline > now ? q32_mul(deadline - now, apic_per_tsc_q32) : 0;
    /* an early interrupt (count clamped) re-arms for the rest: the timer code checks the TSC */
    *lapic(LAPIC_INITIAL) = ticks == 0 ? 1 : ticks > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)ticks;
}

void timer_disarm(void) {
    if (has_tsc_deadline) wrmsr(MSR_TSC_DEADLINE, 0);
    else *lapic(LAPIC_INITIAL) = 0;
}

void *thread_frame(uint8_t *top, void (*start)(void (*)(void *), void *), void (*entry)(void *), void *arg) {
    frame *f = (frame *)(top - 64 - sizeof(frame));
    memset(f, 0, sizeof *f);
    f->rip = (uint64_t)start;
    f->rdi = (uint64_t)entry;
    f->rsi = (uint64_t)arg;
    f->cs = 0x08;
    f->ss = 0x10;
    f->rflags = 0x202;          /* interrupts on */
    f->rsp = (uint64_t)top - 8; /* as after a call: rsp + 8 is 16-byte aligned */
    return f;
}

/* From isr.S: the event, then the frame to resume. */
frame *isr_dispatch(frame *f) {
    switch (f->vector) {
    case LAPIC_TIMER_VECTOR:
        lapic_eoi();
        kernel_event(EV_TIMER);
        break;
    case KOPS_IPI_VECTOR:
        kernel_event(EV_KOPS);
        lapic_eoi();
        break;
    case NMI_VECTOR: /* may interrupt anything, even cli sections: only a flag and a self-IPI, no switch */
        stop_requested = true;
        lapic_self_ipi(STOP_VECTOR);
        return f;
    case STOP_VECTOR: /* an ordinary interrupt: the kernel's lists are consistent here */
        lapic_eoi();
        kernel_event(EV_STOP);
        break;
    case SWITCH_VECTOR:
    case SPURIOUS_VECTOR:
        kernel_event(EV_NONE);
        break;
    default:
        cpu_exception("CPU exception", f->vector, f->error, f->rip);
    }
    return sched_switch(f);
}
