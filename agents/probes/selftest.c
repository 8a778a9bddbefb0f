/* selftest: the recorder's own throughput. Each thread pushes synthetic samples (value = the gap in
 * ns since its previous push) at --rate per second, paced on the cycle counter, or as fast as it can
 * with --rate=0; the drop counters then tell whether the rings and the writer kept up. */
#define _GNU_SOURCE
#include <sched.h>

#include "probes.h"

static struct {
    uint64_t rate;
} opt = {.rate = 100000};

static const rtv_opt selftest_opts[] = {
    {"rate", RTV_OPT_U64, &opt.rate, 0, 1000000000ull, "samples per second per thread, 0 = as fast as possible"},
    {0},
};

enum { STAT_PUSHED };
static const char *const stat_names[] = {"pushed", NULL};

typedef struct {
    rtv_ctx *ctx;
    int index;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    rtv_setup_thread(ctx, a->index, (int)ctx->common.priority);
    /* the n-th push is due n / rate after the start, computed from n rather than by adding a period truncated
     * to whole cycles (which paced a little fast: 50,002 pushes in 500 ms at 100,000/s) */
    const double cycles_per_push = opt.rate ? rtv_cycles_hz() / (double)opt.rate : 0.0;
    const int cpu = sched_getcpu();
    const uint64_t start = rtv_cycles();
    uint64_t pushed = 0, prev = start, next = start;
    const uint64_t deadline = rtv_end_cycles(ctx, start);
    while (!rtv_signalled() &&
           (!ctx->common.loops || pushed < ctx->common.loops)) {
        uint64_t now = rtv_cycles();
        if (now >= deadline) break;
        if (now < next) continue;
        rtv_sample(ctx, a->index, rtv_cycles_to_mono(now), (int64_t)rtv_cycles_to_ns(now - prev), pushed, cpu, 0);
        pushed++;
        prev = now;
        next = start + (uint64_t)((double)pushed * cycles_per_push);
    }
    rtv_stat(ctx, a->index, STAT_PUSHED, (int64_t)pushed);
    return NULL;
}

static int selftest_validate(rtv_common *common) {
    /* At millions of samples/s a 2^16 ring is 65 ms of buffer, shorter than the page-cache stalls of
     * a loaded machine; 2^20 records (32 MiB per thread) ride out a second of them. */
    if (common->ring_order < 20) common->ring_order = 20;
    return 0;
}

static int selftest_run(rtv_ctx *ctx) {
    worker_arg args[RTV_MAX_THREADS];
    for (int i = 0; i < (int)ctx->common.threads; i++) args[i] = (worker_arg){ctx, i};
    rtv_run_threads((int)ctx->common.threads, worker, args, sizeof args[0]);
    return 0;
}

const rtv_probe rtv_probe_selftest = {
    .name = "selftest",
    .summary = "recorder throughput: synthetic samples at a fixed rate (or as fast as possible)",
    .opts = selftest_opts,
    .value_field = "duration_ns",
    .aux_field = "seq",
    .kind_names = (const char *const[]){"push", NULL},
    .stat_names = stat_names,
    .validate = selftest_validate,
    .run = selftest_run,
};
