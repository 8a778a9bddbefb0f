/* aarch64 platform: the boot's hand-over to the kernel (from the device tree), the console (a PL011 or an SBSA
 * UART, else Xen's PV console), the counter's rate (CNTFRQ_EL0), the PL031 RTC, PSCI and SMCCC calls, cache sizes
 * (CLIDR/CCSIDR) and leaving the VM (PSCI SYSTEM_OFF; under Xen, SCHEDOP_shutdown once the console is drained). */
#include "kernel.h"

enum { UART_DR = 0x00, UART_FR = 0x18, UART_FR_TXFF = 1 << 5 };
enum { PSCI_VERSION = 0x84000000u, PSCI_SYSTEM_OFF = 0x84000008u };

/* Word copies where both sides allow them: these run on every stream record and virtio buffer. Built without
 * loop-idiom recognition (CMakeLists.txt): these loops must not become calls to themselves. */
void *memcpy(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if ((((uintptr_t)d | (uintptr_t)s) & 7) == 0) {
        for (; n >= 8; n -= 8, d += 8, s += 8) *(uint64_t *)(void *)d = *(const uint64_t *)(const void *)s;
    }
    while (n--) *d++ = *s++;
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    uint8_t *d = dst;
    if (((uintptr_t)d & 7) == 0) {
        uint64_t word = (uint8_t)c * 0x0101010101010101ull;
        for (; n >= 8; n -= 8, d += 8) *(uint64_t *)(void *)d = word;
    }
    while (n--) *d++ = (uint8_t)c;
    return dst;
}

void console_write(const char *s, size_t n) {
    if (!platform.uart.base && xen_console()) { /* a Xen domU: the PV console carries text and stream */
        xen_console_text(s, n);
        return;
    }
    if (!platform.uart.base) return; /* nowhere to say it */
    for (size_t i = 0; i < n; i++) {
        for (int spins = 0; (mmio_read32(platform.uart.base + UART_FR) & UART_FR_TXFF) && spins < 1000000; spins++)
            cpu_relax();
        mmio_write32(platform.uart.base + UART_DR, (uint8_t)s[i]);
    }
}

/* No other stream channel on Arm than virtio-console and Xen's console. */
const char *fallback_channel(void (**write)(const uint8_t *p, size_t n), uint64_t *chunk) {
    (void)write;
    (void)chunk;
    return NULL;
}

uint64_t rtc_unix_ns(void) {
    return platform.rtc.base ? (uint64_t)mmio_read32(platform.rtc.base) * 1000000000ull : 0; /* PL031 RTCDR */
}

uint64_t smccc_call(uint32_t function, uint64_t a1, uint64_t a2, uint64_t a3) {
    register uint64_t x0 __asm__("x0") = function, x1 __asm__("x1") = a1, x2 __asm__("x2") = a2,
                                 x3 __asm__("x3") = a3;
    /* SMCCC 1.0 lets the callee use x4-x17 as it likes */
    if (platform.psci_hvc)
        __asm__ volatile("hvc #0"
                         : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3)
                         :
                         : "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14", "x15", "x16",
                           "x17", "memory");
    else
        __asm__ volatile("smc #0"
                         : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3)
                         :
                         : "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14", "x15", "x16",
                           "x17", "memory");
    return x0;
}

/* CLIDR_EL1 says which levels have a data or unified cache; CCSIDR_EL1 (selected by CSSELR_EL1) their geometry. */
uint64_t cache_bytes(uint64_t level, uint64_t *found_level) {
    uint64_t clidr = sysreg_read(clidr_el1), best = 0;
    *found_level = 0;
    for (unsigned l = 1; l <= 7; l++) {
        unsigned type = (clidr >> (3 * (l - 1))) & 7;
        if (type == 0) break;
        if (type < 2 || (level && l != level)) continue; /* none, or instructions only */
        sysreg_write(csselr_el1, (l - 1) << 1);
        isb();
        uint64_t ccsidr = sysreg_read(ccsidr_el1);
        uint64_t line = 1ull << ((ccsidr & 7) + 4), ways = ((ccsidr >> 3) & 0x3ff) + 1,
                 sets = ((ccsidr >> 13) & 0x7fff) + 1;
        best = line * ways * sets;
        *found_level = l;
    }
    return best;
}

_Noreturn void platform_off(int status) {
    (void)status; /* on the console's EXIT line: PSCI's SYSTEM_OFF carries none */
    if (on_xen) xen_shutdown();
    if (platform.has_psci) smccc_call(PSCI_SYSTEM_OFF, 0, 0, 0);
    for (;;) __asm__ volatile("msr daifset, #2; wfi");
}

/* From boot.S, the MMU on and the image relocated: x0 is the device tree. */
_Noreturn void arm_main(const void *dtb) {
    fdt_scan(dtb);
    if (platform.xen) {
        on_xen = true;
        if (!platform.uart.base) xen_console_init(); /* a domU built by xl: its console is Xen's */
    }
    if (!platform.ram_size) run_error("no device tree, or no memory in it (boot as an arm64 Image with a DTB in x0)");
    uint64_t hz = sysreg_read(cntfrq_el0) & 0xffffffffu;
    if (!hz) run_error("CNTFRQ_EL0 is 0: the counter's rate is not known");
    clock_init(hz, "cntfrq");
    /* the identity map ends at 4 GiB; the device tree is read (bootargs are copied before the arena hands out) */
    uint64_t top = platform.ram_base + platform.ram_size;
    if (top > (4ull << 30)) top = 4ull << 30;
    boot_info bi = {.kind = "image", .command_line = platform.bootargs, .skip_first_word = false, .memory_top = top};
    kernel_main(&bi);
}
