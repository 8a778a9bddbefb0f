/* workload: application-level execution time in the MiBench automotive spirit (our own code).
 * Each iteration runs one kernel over the same input and records its duration (value, ns) and
 * cycles (aux). Kernels:
 *   qsort     sort --size bytes of 16-byte records (default 1.2 MB, more than a typical L2) with our
 *             own quicksort; the input comes from a fixed seed and is copied back before every
 *             iteration (the copy is not timed), so every iteration sorts the same data.
 *   basicmath solve a fixed family of cubic equations, take integer square roots of a fixed range and
 *             convert a sweep of angles between degrees and radians.
 *   bitcount  count the bits of a fixed array of 64-bit words by five methods and cross-check them.
 * Our own sort rather than libc qsort: the timing then does not depend on which libc the (static)
 * agent was built with, and the sort never allocates. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probes.h"
#include "workload_kernels.h"

static struct {
    const char *kernel;
    uint64_t size;
} opt = {.kernel = "qsort", .size = 1200000};

static const rtv_opt workload_opts[] = {
    {"kernel", RTV_OPT_STR, &opt.kernel, 0, 0, "qsort, basicmath or bitcount"},
    {"size", RTV_OPT_U64, &opt.size, 1024, 1ull << 32, "qsort data set in bytes"},
    {0},
};

static const char *const kind_names[] = {"qsort", "basicmath", "bitcount", NULL};
enum { KERNEL_QSORT, KERNEL_BASICMATH, KERNEL_BITCOUNT };
static int kernel_index = -1;

/* ---- driver ---- */

typedef struct {
    rtv_ctx *ctx;
    int index;
    int status;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    rtv_setup_thread(ctx, a->index, (int)ctx->common.priority);
    size_t count = opt.size / sizeof(item);
    size_t words = kernel_index == KERNEL_QSORT ? count * 4 : BITCOUNT_WORDS * 2;
    uint32_t *input = malloc(words * sizeof(uint32_t)), *scratch = malloc(words * sizeof(uint32_t));
    if (!input || !scratch) rtv_die(RTV_EXIT_FAILURE, "out of memory for the workload data");
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* same data in every thread and every run */
    for (size_t i = 0; i < words; i++) input[i] = (uint32_t)xorshift(&seed);
    const int cpu = sched_getcpu();
    volatile double sink = 0;
    const uint64_t deadline = rtv_end_cycles(ctx, rtv_cycles()); /* its whole duration, however late it began */
    for (uint64_t n = 0; !ctx->common.loops || n < ctx->common.loops; n++) {
        if (rtv_signalled() || rtv_cycles() >= deadline) break;
        memcpy(scratch, input, words * sizeof(uint32_t));
        uint64_t t0 = rtv_cycles();
        switch (kernel_index) {
        case KERNEL_QSORT: quicksort((item *)scratch, count); break;
        case KERNEL_BASICMATH: sink += basicmath(); break;
        case KERNEL_BITCOUNT: {
            int bits = bitcount((const uint64_t *)scratch);
            if (bits < 0) {
                a->status = RTV_EXIT_FAILURE;
                rtv_stop_requested = 1;
                fprintf(stderr, "rtvirt-agent: workload bitcount: the counting methods disagree\n");
            }
            sink += bits;
            break;
        }
        }
        uint64_t t1 = rtv_cycles();
        rtv_sample(ctx, a->index, rtv_cycles_to_mono(t0), (int64_t)rtv_cycles_to_ns(t1 - t0), t1 - t0, cpu,
                   kernel_index);
        if (n == 0 && kernel_index == KERNEL_QSORT) {
            const item *v = (const item *)scratch;
            for (size_t i = 1; i < count; i++)
                if (v[i - 1].key > v[i].key) {
                    fprintf(stderr, "rtvirt-agent: workload qsort: the output is not sorted\n");
                    a->status = RTV_EXIT_FAILURE;
                    rtv_stop_requested = 1;
                    break;
                }
        }
    }
    free(input);
    free(scratch);
    return NULL;
}

static int workload_validate(rtv_common *common) {
    (void)common;
    for (int i = 0; kind_names[i]; i++)
        if (!strcmp(opt.kernel, kind_names[i])) kernel_index = i;
    if (kernel_index < 0)
        rtv_die(RTV_EXIT_USAGE, "invalid value for '--kernel': '%s' (choose qsort, basicmath or bitcount)", opt.kernel);
    for (int i = 0; i < 256; i++) byte_bits[i] = (uint8_t)bits_swar((uint64_t)i);
    return 0;
}

static int workload_run(rtv_ctx *ctx) {
    worker_arg args[RTV_MAX_THREADS];
    int n = (int)ctx->common.threads;
    for (int i = 0; i < n; i++) args[i] = (worker_arg){ctx, i, 0};
    rtv_run_threads(n, worker, args, sizeof args[0]);
    for (int i = 0; i < n; i++)
        if (args[i].status) return args[i].status;
    return 0;
}

const rtv_probe rtv_probe_workload = {
    .name = "workload",
    .summary = "application-level execution time (qsort, basicmath, bitcount), per iteration",
    .opts = workload_opts,
    .value_field = "duration_ns",
    .aux_field = "cycles",
    .kind_names = kind_names,
    .stat_names = (const char *const[]){NULL},
    .validate = workload_validate,
    .run = workload_run,
};
