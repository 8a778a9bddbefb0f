/* mem: malloc a block, touch every page, free it, again and again (the malloc/free workers of the
 * COTS study's reference load, 64 MB blocks). Every cycle makes the kernel find, zero and map fresh
 * pages and then unmap them: page faults, zeroing bandwidth and TLB shootdowns, not just cache misses. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "stressors.h"

uint64_t rtv_mem_block_bytes = UINT64_C(64) << 20;

static const rtv_opt mem_opts[] = {
    {"block", RTV_OPT_U64, &rtv_mem_block_bytes, 4096, UINT64_C(1) << 40, "bytes per malloc/touch/free cycle"},
    {0},
};

int rtv_mem_prepare(rtv_stress *s) {
    (void)s;
    /* A fixed mmap threshold: glibc would otherwise raise it after the first free and start recycling
     * blocks below 32 MB from its heap, and the touches would stop faulting. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    return 0;
}

void rtv_mem_work(rtv_worker *w) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), block = rtv_mem_block_bytes;
    while (!rtv_stress_stopping(w)) {
        volatile unsigned char *p = malloc(block);
        if (!p) { /* memory is short: count it and let others free theirs */
            w->missed++;
            struct timespec pause = {0, 1000 * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        uint64_t off = 0;
        for (uint64_t n = 0; off < block; off += page, n++) {
            p[off] = (unsigned char)n;
            if ((n & 1023) == 1023 && rtv_stress_stopping(w)) break;
        }
        free((void *)p);
        w->bytes += off < block ? off : block;
        if (off >= block) atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
    }
}

const rtv_stressor rtv_stressor_mem = {
    .name = "mem",
    .summary = "malloc a block (default 64 MiB), touch every page, free it; repeat",
    .opts = mem_opts,
    .prepare = rtv_mem_prepare,
    .work = rtv_mem_work,
};
