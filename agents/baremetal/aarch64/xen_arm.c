/* Xen on Arm: found by the device tree's /hypervisor node (compatible "xen,xen", fdt.c); hypercalls are HVC with
 * the immediate 0xEA1, the number in x16 and the arguments in x0-x4 (Xen's public arch-arm.h). Pages Xen shares
 * outside RAM (the console ring among its magic pages) are mapped as ordinary memory. */
#include "kernel.h"

long xen_hypercall(unsigned nr, uint64_t a1, uint64_t a2, uint64_t a3) {
    register uint64_t x0 __asm__("x0") = a1, x1 __asm__("x1") = a2, x2 __asm__("x2") = a3, x16 __asm__("x16") = nr;
    __asm__ volatile("hvc #0xea1" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x16) : : "x3", "x4", "memory");
    return (long)x0;
}

void xen_map_shared(uint64_t paddr) { map_normal_page(paddr); }
