/* Xen on x86: found by its CPUID leaves (XenVMMXenVMM), hypercalls through the page Xen fills (the MSR its
 * leaf names), and the PVH start info's memory map. Written from the ABI in Xen's public headers
 * (arch-x86/cpuid.h, arch-x86/hvm/start_info.h, xen.h). The console and the runstate area are xen.c's. */
#include "kernel.h"

enum { XEN_START_MAGIC = 0x336ec578, MEMMAP_RAM = 1 };

static _Alignas(4096) uint8_t hypercall_page[4096];

/* Hypercall NR with up to three arguments through the page Xen filled (32 bytes per hypercall). Xen may
 * clobber the argument registers, and rcx/r11 as a syscall would. */
long xen_hypercall(unsigned nr, uint64_t a1, uint64_t a2, uint64_t a3) {
    long ret;
    __asm__ volatile("call *%[entry]"
                     : "=a"(ret), "+D"(a1), "+S"(a2), "+d"(a3)
                     : [entry] "r"(hypercall_page + nr * 32)
                     : "rcx", "r8", "r9", "r10", "r11", "memory");
    return ret;
}

void xen_map_shared(uint64_t paddr) { (void)paddr; } /* the identity map covers all RAM, write-back */

/* Xen's CPUID leaves (the first base with its signature), the hypercall page through the MSR they name. */
bool xen_pvh_init(void) {
    uint32_t r[4];
    for (uint32_t base = 0x40000000; base <= 0x40010000 && !on_xen; base += 0x100) {
        cpuid(base, 0, r);
        if (r[1] != 0x566e6558 || r[2] != 0x65584d4d || r[3] != 0x4d4d566e || r[0] < base + 2) continue;
        cpuid(base + 2, 0, r);
        wrmsr(r[1], (uint64_t)(uintptr_t)hypercall_page);
        on_xen = true;
    }
    return on_xen;
}

/* The end of the RAM the kernel was loaded into, from hvm_start_info's memory map (version 1); 0 if none. */
uint64_t pvh_memory_top(const void *start_info) {
    const uint8_t *info = start_info;
    uint32_t magic, version, entries;
    uint64_t map;
    memcpy(&magic, info, 4);
    memcpy(&version, info + 4, 4);
    if (magic != XEN_START_MAGIC || version < 1) return 0;
    memcpy(&map, info + 40, 8); /* memmap_paddr, then memmap_entries */
    memcpy(&entries, info + 48, 4);
    if (!map || map >= (4ull << 30) || entries > 128) return 0; /* our identity map ends at 4 GiB */
    for (uint32_t i = 0; i < entries; i++) {
        const uint8_t *e = (const uint8_t *)(uintptr_t)(map + 24ull * i);
        uint64_t addr, size;
        uint32_t type;
        memcpy(&addr, e, 8);
        memcpy(&size, e + 8, 8);
        memcpy(&type, e + 16, 4);
        if (type == MEMMAP_RAM && addr <= (1u << 20) && addr + size > (1u << 20)) return addr + size;
    }
    return 0;
}
