/* The identity map's refinement: boot.S maps the first GiB (devices) as 2 MiB device blocks and the next three
 * (RAM) as 1 GiB write-back blocks. A page a hypervisor shares with us in the device GiB (Xen's console ring at
 * its magic pages, KVM's stolen-time structure beside QEMU's devices) must be ordinary cacheable memory, as the
 * other side maps it: its 2 MiB block is split into 4 KiB pages (a table from a small pool) and that page becomes
 * write-back memory. Break-before-make: the block's entry is invalid, and its TLB entries gone, before the table
 * takes its place; nothing touches that block meanwhile (one CPU, interrupts off). */
#include "kernel.h"

enum { PAGE = 4096, BLOCK_2M = 2u << 20, ENTRIES = 512, POOL = 8 };
#define DESC_VALID 1ull
#define DESC_TABLE 3ull /* L2: a next-level table; L3: a page */
#define DESC_AF (1ull << 10)
#define DESC_INNER_SHAREABLE (3ull << 8)
#define ATTR_NORMAL (1ull << 2) /* MAIR index 1: write-back (boot.S) */
#define ADDRESS_MASK 0x0000fffffffff000ull

extern uint64_t l2_device_gib[ENTRIES]; /* boot.S: the first GiB's 2 MiB blocks */
static _Alignas(PAGE) uint64_t pool[POOL][ENTRIES];
static unsigned used;

static void tlb_flush(void) { __asm__ volatile("dsb ishst; tlbi vmalle1; dsb ish; isb" ::: "memory"); }

void map_normal_page(uint64_t paddr) {
    if (paddr >= (1ull << 30)) return; /* RAM: mapped write-back already */
    irq_flags flags = irq_save();
    uint64_t *entry = &l2_device_gib[paddr / BLOCK_2M];
    if ((*entry & 3) == DESC_VALID) { /* a block: make it a table of pages with the block's attributes */
        if (used == POOL) run_error("out of page tables for pages the hypervisor shares");
        uint64_t *table = pool[used++];
        uint64_t base = *entry & ADDRESS_MASK & ~(uint64_t)(BLOCK_2M - 1), attrs = *entry & ~ADDRESS_MASK & ~3ull;
        for (unsigned i = 0; i < ENTRIES; i++) table[i] = (base + (uint64_t)i * PAGE) | attrs | DESC_TABLE;
        *entry = 0;
        tlb_flush();
        *entry = (uint64_t)(uintptr_t)table | DESC_TABLE;
        tlb_flush();
    }
    uint64_t *table = (uint64_t *)(uintptr_t)(*entry & ADDRESS_MASK);
    uint64_t *page = &table[(paddr % BLOCK_2M) / PAGE];
    *page = 0;
    tlb_flush();
    *page = (paddr & ~(uint64_t)(PAGE - 1)) | DESC_AF | DESC_INNER_SHAREABLE | ATTR_NORMAL | DESC_TABLE;
    tlb_flush();
    irq_restore(flags);
}
