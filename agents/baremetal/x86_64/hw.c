/* x86_64 platform: the boot's hand-over to the kernel, the console (16550 COM1, else Xen's PV console, else the
 * debug port 0xe9), the TSC's rate, the RTC, the stream's fallback channels, cache sizes and leaving the VM (QEMU's
 * isa-debug-exit, else a triple fault). */
#include "kernel.h"

enum { COM1 = 0x3f8, COM2 = 0x2f8, DEBUG_PORT = 0xe9, DEBUG_EXIT_PORT = 0xf4 };

static bool has_serial; /* a 16550 answers at COM1 */

/* rep movsb/stosb: the CPU's own fast string copy */
void *memcpy(void *dst, const void *src, size_t n) {
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n)::"memory");
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    void *d = dst;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return dst;
}

static bool uart_init(uint16_t port, uint8_t probe) {
    outb(port + 7, probe); /* the scratch register answers only if a UART is there */
    if (inb(port + 7) != probe) return false;
    outb(port + 1, 0x00); /* no UART interrupts: we poll */
    outb(port + 3, 0x80); /* divisor latch: 115200 baud (an emulated UART does not pace a file chardev) */
    outb(port + 0, 0x01);
    outb(port + 1, 0x00);
    outb(port + 3, 0x03); /* 8N1 */
    outb(port + 2, 0x07); /* FIFO on */
    return true;
}

static void uart_put(uint16_t port, uint8_t c) {
    for (int spins = 0; !(inb(port + 5) & 0x20) && spins < 100000; spins++) {}
    outb(port, c);
}

void console_write(const char *s, size_t n) {
    if (xen_console()) { /* Xen PVH: no UART, the PV console carries text and stream */
        xen_console_text(s, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (has_serial) uart_put(COM1, (uint8_t)s[i]);
        else outb(DEBUG_PORT, (uint8_t)s[i]);
    }
}

/* ---- the stream's channels after virtio: QEMU's debug console (it reads back 0xe9), a 16550 at COM2 ---- */

static void debugcon_write(const uint8_t *p, size_t n) {
    __asm__ volatile("rep outsb" : "+S"(p), "+c"(n) : "d"((uint16_t)DEBUG_PORT) : "memory");
}

static void com2_write(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) uart_put(COM2, p[i]);
}

const char *fallback_channel(void (**write)(const uint8_t *p, size_t n), uint64_t *chunk) {
    *chunk = 512; /* port channels take interrupts between bytes anyway */
    if (inb(DEBUG_PORT) == DEBUG_PORT) {
        *write = debugcon_write;
        return "debugcon";
    }
    if (uart_init(COM2, 0xa5)) {
        *write = com2_write;
        return "com2";
    }
    return NULL;
}

/* ---- TSC ---- */

static bool plausible(uint64_t hz) { return hz >= 100000000ull && hz <= 20000000000ull; }

/* The hypervisor's word for the TSC frequency (KVM's leaf 0x40000010, Xen's leaf 3), if it gives one. */
static uint64_t hypervisor_tsc_hz(const char **source) {
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
            if (plausible((uint64_t)r[0] * 1000)) { *source = "kvm-cpuid"; return (uint64_t)r[0] * 1000; }
        }
        if (!memcmp(sig, "XenVMMXenVMM", 12) && max_leaf >= base + 3) {
            cpuid(base + 3, 0, r);
            if (plausible((uint64_t)r[2] * 1000)) { *source = "xen-cpuid"; return (uint64_t)r[2] * 1000; }
        }
    }
    return 0;
}

/* ---- the TSC's rate against the PIT (1.193182 MHz): channel 2, gated on, counting down from 0xFFFF ---- */

enum { PIT_HZ = 1193182, PIT_WINDOW_TICKS = 47727 /* 40 ms */ };

static uint16_t pit_count(void) {
    outb(0x43, 0x80); /* latch channel 2 */
    uint8_t lo = inb(0x42), hi = inb(0x42);
    return (uint16_t)(lo | hi << 8);
}

/* A (TSC, PIT count) pair: the tightest bracket of five reads, the TSC at its middle. A vCPU held off between
 * two pairs costs nothing (both clocks ran on); only a wait inside a bracket would, and the tightest has none. */
static void pit_pair(uint64_t *tsc, uint16_t *count) {
    uint64_t tightest = UINT64_MAX;
    for (int i = 0; i < 5; i++) {
        uint64_t before = cycles();
        uint16_t c = pit_count();
        uint64_t after = cycles();
        if (after - before < tightest) {
            tightest = after - before;
            *tsc = before + (after - before) / 2;
            *count = c;
        }
    }
}

/* 40 ms of PIT ticks between two pairs; 0 without a PIT (Xen PVH: the count never moves) or when the count
 * wrapped (the vCPU held off past the 55 ms the 16-bit count lasts: the count alone cannot tell). */
static uint64_t pit_tsc_hz(void) {
    uint8_t gate = inb(0x61);
    outb(0x61, (uint8_t)((gate & ~0x02) | 0x01)); /* gate on, speaker off */
    outb(0x43, 0xB0);                               /* channel 2, lo/hi, mode 0 */
    outb(0x42, 0xFF);
    outb(0x42, 0xFF);
    uint64_t t0, t1;
    uint16_t c0, c1;
    pit_pair(&t0, &c0);
    for (uint16_t last = c0, now, still = 0; (uint16_t)(c0 - (now = pit_count())) < PIT_WINDOW_TICKS;) {
        if (now != last) {
            last = now;
            still = 0;
        } else if (++still > 10000) { /* a count that stands still: no PIT */
            outb(0x61, gate);
            return 0;
        }
    }
    pit_pair(&t1, &c1);
    bool wrapped = inb(0x61) & 0x20; /* mode 0's output rises at the count's end: it passed 0 (held off long) */
    outb(0x61, gate);
    if (wrapped || c1 >= c0 || (uint16_t)(c0 - c1) < PIT_WINDOW_TICKS) return 0;
    return (uint64_t)((__uint128_t)(t1 - t0) * PIT_HZ / (uint16_t)(c0 - c1));
}

uint64_t kvm_tsc_hz(void); /* kvm.c */

static void tsc_init(void) {
    const char *source = "none";
    uint64_t hz = hypervisor_tsc_hz(&source);
    if (!hz) {
        uint64_t scale = kvm_tsc_hz();
        if (plausible(scale)) { hz = scale; source = "kvmclock"; }
    }
    uint32_t r[4];
    if (!hz) {
        cpuid(0, 0, r);
        if (r[0] >= 0x15) {
            cpuid(0x15, 0, r);
            uint64_t found = r[0] && r[1] && r[2] ? (uint64_t)r[2] * r[1] / r[0] : 0;
            if (plausible(found)) { hz = found; source = "cpuid-15h"; }
        }
    }
    /* a try fails when the vCPU is held off past the count's 55 ms; a TCG guest on a loaded host is, often (3 tries
     * all failed at load 8: a measuring guest that could not start), and a failed try costs only its 40 ms */
    for (int tries = 0; !hz && tries < 25; tries++) {
        uint64_t measured = pit_tsc_hz();
        if (plausible(measured)) { hz = measured; source = "pit"; }
    }
    if (!plausible(hz)) run_error("cannot determine the TSC frequency (no hypervisor leaf, CPUID 15h or PIT)");
    clock_init(hz, source);
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

/* ---- cache sizes (the cache stressor): CPUID leaf 4, else AMD's 0x80000006 ---- */

uint64_t cache_bytes(uint64_t level, uint64_t *found_level) {
    uint32_t r[4];
    uint64_t best = 0;
    *found_level = 0;
    cpuid(0, 0, r);
    if (r[0] >= 4) {
        for (uint32_t sub = 0; sub < 16; sub++) {
            cpuid(4, sub, r);
            uint32_t type = r[0] & 0x1f, this_level = (r[0] >> 5) & 7;
            if (type == 0) break;
            if (type == 2 || (level ? this_level != level : this_level <= *found_level)) continue;
            uint64_t ways = (r[1] >> 22) + 1, parts = ((r[1] >> 12) & 0x3ff) + 1, line = (r[1] & 0xfff) + 1;
            best = ways * parts * line * ((uint64_t)r[2] + 1);
            *found_level = this_level;
        }
    }
    if (best) return best;
    cpuid(0x80000000u, 0, r);
    if (r[0] >= 0x80000006u) { /* AMD: L2 in KiB, L3 in 512 KiB units */
        cpuid(0x80000006u, 0, r);
        uint64_t l2 = (uint64_t)(r[2] >> 16) << 10, l3 = (uint64_t)(r[3] >> 18) << 19;
        if ((level == 3 || level == 0) && l3) {
            *found_level = 3;
            return l3;
        }
        if ((level == 2 || level == 0) && l2) {
            *found_level = 2;
            return l2;
        }
    }
    return 0;
}

/* ---- leaving the VM ---- */

_Noreturn void platform_off(int status) {
    if (on_xen) xen_shutdown(); /* poweroff: the status is on the console */
    outl(DEBUG_EXIT_PORT, (uint32_t)status); /* QEMU's isa-debug-exit: QEMU ends with (status << 1) | 1 */
    /* no debug-exit device (Xen, libvirt without it): a triple fault ends the VM */
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } none = {0, 0};
    __asm__ volatile("lidt %0; int3" ::"m"(none));
    for (;;) __asm__ volatile("cli; hlt");
}

/* ---- boot: multiboot 1 (QEMU -kernel, GRUB) or Xen PVH ---- */

uint64_t pvh_memory_top(const void *start_info); /* xen_pvh.c */
bool xen_pvh_init(void);

/* The multiboot information: flags bit 2 says a command line is at offset 16. */
static char *multiboot_cmdline(const uint32_t *info) {
    return info && (info[0] & 4) ? (char *)(uintptr_t)info[4] : NULL;
}

/* PVH (Xen): hvm_start_info's cmdline_paddr at offset 24. */
static char *pvh_cmdline(const uint8_t *info) {
    uint64_t paddr;
    if (!info) return NULL;
    memcpy(&paddr, info + 24, 8);
    return paddr ? (char *)(uintptr_t)paddr : NULL;
}

/* From boot.S, in long mode: boot = 1 (multiboot, info = multiboot information) or 2 (PVH, hvm_start_info). */
_Noreturn void kmain(uint64_t boot, const void *info) {
    has_serial = uart_init(COM1, 0x5a);
    /* a PVH domain has no UART: its console is Xen's */
    if (xen_pvh_init() && !has_serial) xen_console_init();
    tsc_init();
    /* multiboot mem_upper (flags bit 0): KiB above 1 MiB; PVH: the start info's memory map, else 64 MiB */
    const uint32_t *mb = info;
    uint64_t pvh_top = boot == 2 && info ? pvh_memory_top(info) : 0;
    uint64_t memory_top = boot == 1 && mb && (mb[0] & 1) ? (1ull << 20) + (uint64_t)mb[2] * 1024
                          : pvh_top                      ? pvh_top
                                                         : 64ull << 20;
    if (memory_top > (4ull << 30) - (1ull << 30)) memory_top = 3ull << 30; /* below the APIC hole */
    boot_info bi = {.kind = boot == 1 ? "multiboot" : "pvh",
                    .command_line = boot == 1 ? multiboot_cmdline(info) : pvh_cmdline(info),
                    .skip_first_word = boot == 1, .memory_top = memory_top};
    kernel_main(&bi);
}
