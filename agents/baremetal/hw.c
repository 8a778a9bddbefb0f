/* Hardware: console (16550 COM1, else Xen's PV console, else the debug port 0xe9), TSC frequency, local APIC timer, RTC,
 * and leaving the VM (QEMU's isa-debug-exit, else a triple fault). */
#include "kernel.h"

enum { COM1 = 0x3f8, DEBUG_PORT = 0xe9, DEBUG_EXIT_PORT = 0xf4 };
enum { LAPIC_BASE = 0xFEE00000u };
enum { LAPIC_EOI = 0xB0, LAPIC_SVR = 0xF0, LAPIC_ICR_LO = 0x300, LAPIC_ICR_HI = 0x310, LAPIC_LVT_TIMER = 0x320,
       LAPIC_INITIAL = 0x380, LAPIC_CURRENT = 0x390, LAPIC_DIVIDE = 0x3E0, LAPIC_TPR = 0x80 };
enum { MSR_TSC_DEADLINE = 0x6E0 };

uint64_t tsc_hz;
const char *tsc_source = "none";
bool has_tsc_deadline;
bool has_serial;
static uint64_t ns_per_tsc_q32, tsc_per_ns_q32, apic_per_tsc_q32;
extern uint64_t page_dirs[2048];

static inline void wrmsr(uint32_t msr, uint64_t v) {
    __asm__ volatile("wrmsr" ::"c"(msr), "a"((uint32_t)v), "d"((uint32_t)(v >> 32)));
}
static inline volatile uint32_t *lapic(uint32_t reg) { return (volatile uint32_t *)(uintptr_t)(LAPIC_BASE + reg); }

static void serial_init(void) {
    outb(COM1 + 7, 0x5a); /* the scratch register answers only if a UART is there */
    if (inb(COM1 + 7) != 0x5a) return;
    outb(COM1 + 1, 0x00); /* no UART interrupts: we poll */
    outb(COM1 + 3, 0x80); /* divisor latch: 115200 baud */
    outb(COM1 + 0, 0x01);
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03); /* 8N1 */
    outb(COM1 + 2, 0x07); /* FIFO on */
    has_serial = true;
}

void console_write(const char *s, size_t n) {
    if (xen_console()) { /* Xen PVH: no UART, the PV console carries text and stream */
        xen_console_text(s, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (has_serial) {
            for (int spins = 0; !(inb(COM1 + 5) & 0x20) && spins < 100000; spins++) {}
            outb(COM1, (uint8_t)s[i]);
        } else {
            outb(DEBUG_PORT, (uint8_t)s[i]);
        }
    }
}

void console_line(const char *s) {
    console_write(s, strlen(s));
    console_write("\n", 1);
}

/* ---- TSC ---- */

static uint64_t q32_ratio(uint64_t num, uint64_t den) { return (uint64_t)(((__uint128_t)num << 32) / den); }
static uint64_t q32_mul(uint64_t v, uint64_t q) { return (uint64_t)(((__uint128_t)v * q) >> 32); }
uint64_t tsc_to_ns(uint64_t cycles) { return q32_mul(cycles, ns_per_tsc_q32); }
uint64_t ns_to_tsc(uint64_t ns) { return q32_mul(ns, tsc_per_ns_q32); }
uint64_t now_ns(void) { return tsc_to_ns(rdtsc()); }

static bool plausible(uint64_t hz) { return hz >= 100000000ull && hz <= 20000000000ull; }

/* The hypervisor's word for the TSC frequency (KVM's leaf 0x40000010, Xen's leaf 3), if it gives one. */
static uint64_t hypervisor_tsc_hz(void) {
    uint32_t r[4];
    for (uint32_t base = 0x40000000; base <= 0x40010000; base += 0x100) {
        cpuid(base, 0, r);
        char sig[13];
        memcpy(sig, &r[1], 4);
        memcpy(sig + 4, &r[2], 4);
        memcpy(sig + 8, &r[3], 4);
        sig[12] = 0;
        uint32_t max_leaf = r[0];
        if (!memcmp(sig, "KVMKVMKVM", 9) && max_leaf >= base + 0x10) {
            cpuid(base + 0x10, 0, r);
            if (plausible((uint64_t)r[0] * 1000)) { tsc_source = "kvm-cpuid"; return (uint64_t)r[0] * 1000; }
        }
        if (!memcmp(sig, "XenVMMXenVMM", 12) && max_leaf >= base + 3) {
            cpuid(base + 3, 0, r);
            if (plausible((uint64_t)r[2] * 1000)) { tsc_source = "xen-cpuid"; return (uint64_t)r[2] * 1000; }
        }
    }
    return 0;
}

/* PIT channel 2 counting down 10 ms with the speaker gate as the reference. */
static uint64_t pit_tsc_hz(void) {
    const uint32_t pit_hz = 1193182, ticks = pit_hz / 100;
    uint8_t gate = inb(0x61);
    outb(0x61, (uint8_t)((gate & ~0x02) | 0x01)); /* gate on, speaker off */
    outb(0x43, 0xB0);                               /* channel 2, lo/hi, mode 0 */
    outb(0x42, (uint8_t)(ticks & 0xff));
    outb(0x42, (uint8_t)(ticks >> 8));
    uint64_t start = rdtsc();
    uint64_t spins = 0;
    while (!(inb(0x61) & 0x20))
        if (++spins > 100000000ull) return 0; /* no PIT (Xen PVH) */
    uint64_t cycles = rdtsc() - start;
    outb(0x61, gate);
    tsc_source = "pit";
    return cycles * 100;
}

static void tsc_init(void) {
    tsc_hz = hypervisor_tsc_hz();
    uint32_t r[4];
    if (!tsc_hz) {
        cpuid(0, 0, r);
        if (r[0] >= 0x15) {
            cpuid(0x15, 0, r);
            uint64_t hz = r[0] && r[1] && r[2] ? (uint64_t)r[2] * r[1] / r[0] : 0;
            if (plausible(hz)) { tsc_hz = hz; tsc_source = "cpuid-15h"; }
        }
    }
    /* The PIT: a vCPU descheduled inside the 10 ms window skews one measurement, so take the median of
     * three plausible ones (up to ten tries; a host under load here failed single measurements). */
    uint64_t found[3];
    int n = 0;
    for (int tries = 0; !tsc_hz && n < 3 && tries < 10; tries++) {
        uint64_t hz = pit_tsc_hz();
        if (!hz) break; /* no PIT at all */
        if (plausible(hz)) found[n++] = hz;
    }
    if (!tsc_hz && n) {
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && found[j] < found[j - 1]; j--) {
                uint64_t swap = found[j];
                found[j] = found[j - 1];
                found[j - 1] = swap;
            }
        tsc_hz = found[n / 2];
    }
    if (!plausible(tsc_hz)) run_error("cannot determine the TSC frequency (no hypervisor leaf, CPUID 15h or PIT)");
    ns_per_tsc_q32 = q32_ratio(1000000000ull, tsc_hz);
    tsc_per_ns_q32 = q32_ratio(tsc_hz, 1000000000ull);
    cpuid(1, 0, r);
    has_tsc_deadline = (r[2] >> 24) & 1;
}

/* ---- local APIC ---- */

void lapic_eoi(void) { *lapic(LAPIC_EOI) = 0; }

void lapic_init(void) {
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
    uint64_t start = rdtsc(), span = tsc_hz / 200;
    while (rdtsc() - start < span) {}
    uint32_t elapsed = 0xFFFFFFFFu - *lapic(LAPIC_CURRENT);
    uint64_t cycles = rdtsc() - start;
    *lapic(LAPIC_INITIAL) = 0;
    apic_per_tsc_q32 = q32_ratio(elapsed, cycles);
    *lapic(LAPIC_LVT_TIMER) = LAPIC_TIMER_VECTOR; /* one-shot, unmasked */
}

const char *timer_mode(void) { return has_tsc_deadline ? "tsc-deadline" : "lapic-oneshot"; }

void lapic_arm(uint64_t deadline_tsc) {
    if (has_tsc_deadline) {
        wrmsr(MSR_TSC_DEADLINE, deadline_tsc);
        return;
    }
    uint64_t now = rdtsc();
    uint64_t ticks = deadline_tsc > now ? q32_mul(deadline_tsc - now, apic_per_tsc_q32) : 0;
    /* an early interrupt (count clamped) re-arms for the rest: the timer code checks the TSC */
    *lapic(LAPIC_INITIAL) = ticks == 0 ? 1 : ticks > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)ticks;
}

void lapic_disarm(void) {
    if (has_tsc_deadline) wrmsr(MSR_TSC_DEADLINE, 0);
    else *lapic(LAPIC_INITIAL) = 0;
}

void lapic_self_ipi(uint8_t vector) {
    *lapic(LAPIC_ICR_HI) = 0;
    *lapic(LAPIC_ICR_LO) = (1u << 18) | vector; /* shorthand: self, fixed delivery */
}

/* ---- CMOS RTC ---- */

static uint8_t cmos(uint8_t reg) {
    outb(0x70, reg);
    return inb(0x71);
}

uint64_t rtc_unix_ns(void) {
    if (cmos(0x0A) == 0xff) return 0; /* no RTC (Xen PVH): no port to wait on */
    for (int tries = 0; (cmos(0x0A) & 0x80) && tries < 1000000; tries++) {}
    uint8_t raw[6] = {cmos(0x00), cmos(0x02), cmos(0x04), cmos(0x07), cmos(0x08), cmos(0x09)};
    uint8_t status_b = cmos(0x0B);
    if (raw[5] == 0xff && status_b == 0xff) return 0; /* no RTC */
    unsigned v[6];
    for (int i = 0; i < 6; i++) v[i] = (status_b & 0x04) ? raw[i] : (unsigned)(raw[i] & 15) + (raw[i] >> 4) * 10u;
    unsigned sec = v[0], min = v[1], hour = v[2], day = v[3], month = v[4], year = 2000 + v[5];
    if (!month || month > 12 || !day || day > 31) return 0;
    /* days since 1970 by the civil-from-days inverse (March-based year) */
    int y = (int)year - (month <= 2);
    int era = y / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    int64_t days = (int64_t)era * 146097 + doe - 719468;
    return ((uint64_t)days * 86400 + hour * 3600 + min * 60 + sec) * 1000000000ull;
}

void hw_init(void) {
    serial_init();
    if (!has_serial) xen_init(); /* a PVH domain has no UART: its console is Xen's */
    tsc_init();
}

_Noreturn void guest_exit(int status) {
    xen_console_flush();
    text t = {(char[32]){0}, 0, 32};
    text_str(&t, "RTVIRT-EXIT ");
    text_i64(&t, status);
    console_line(t.buf);
    if (on_xen) xen_shutdown(); /* poweroff: the status is on the console */
    outl(DEBUG_EXIT_PORT, (uint32_t)status); /* QEMU's isa-debug-exit: QEMU ends with (status << 1) | 1 */
    /* no debug-exit device (Xen, libvirt without it): a triple fault ends the VM */
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } none = {0, 0};
    __asm__ volatile("lidt %0; int3" ::"m"(none));
    for (;;) __asm__ volatile("cli; hlt");
}

/* ---- failing: say why on the console, let the layer above finish (the stream), leave the VM ---- */

const char *boot_kind = "none";

static void (*before_failure_exit)(int reason); /* stream_end, registered by main.c */

void on_guest_failure(void (*end)(int reason)) { before_failure_exit = end; }

static _Noreturn void fail(text *t, int status) {
    console_line(t->buf);
    if (before_failure_exit) before_failure_exit(2);
    guest_exit(status);
}

_Noreturn void usage_error(const char *option_name, const char *detail) {
    text t = {(char[400]){0}, 0, 400};
    text_str(&t, "rtvirt-baremetal: ");
    if (option_name) {
        text_str(&t, "invalid value for '--");
        text_str(&t, option_name);
        text_str(&t, "': ");
    }
    text_str(&t, detail);
    fail(&t, EXIT_USAGE);
}

_Noreturn void run_error(const char *detail) {
    text t = {(char[400]){0}, 0, 400};
    text_str(&t, "rtvirt-baremetal: ");
    text_str(&t, detail);
    fail(&t, EXIT_FAILURE);
}
