/* timer: periodic wake-up latency by the cyclictest method.
 * Each thread sleeps with an absolute clock_nanosleep to its next period on CLOCK_MONOTONIC and
 * records actual wake - planned wake. Missed periods are skipped (and counted), not queued, so one
 * long stall shows as one large sample rather than a burst of catch-up wake-ups. */
#define _GNU_SOURCE
#include <sched.h>

#include "probes.h"

static struct {
    uint64_t interval_ns;
    uint64_t distance_ns;
} opt = {.interval_ns = 1000000, .distance_ns = 500000};

static const rtv_opt timer_opts[] = {
    {"interval", RTV_OPT_NS, &opt.interval_ns, 10000, 10000000000ull, "period of thread 0 in ns"},
    {"distance", RTV_OPT_NS, &opt.distance_ns, 0, 10000000000ull, "period increment per further thread in ns"},
    {0},
};

enum { STAT_OVERRUNS };
static const char *const stat_names[] = {"overruns", NULL};

typedef struct {
    rtv_ctx *ctx;
    int index;
    uint64_t first_ns;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    rtv_setup_thread(ctx, a->index, (int)ctx->common.priority);
    const uint64_t interval = opt.interval_ns + (uint64_t)a->index * opt.distance_ns;
    uint64_t next = a->first_ns, overruns = 0;
    for (uint64_t n = 0; !ctx->common.loops || n < ctx->common.loops; n++) {
        if (!rtv_sleep_until(ctx, next)) break;
        uint64_t now = rtv_now_ns();
        rtv_sample(ctx, a->index, next, (int64_t)(now - next), 0, sched_getcpu(), 0);
        next += interval;
        while (next <= now) { /* skip periods that already passed */
            next += interval;
            overruns++;
        }
        if (ctx->end_ns && next > ctx->end_ns) break;
    }
    rtv_stat(ctx, a->index, STAT_OVERRUNS, (int64_t)overruns);
    return NULL;
}

static int timer_run(rtv_ctx *ctx) {
    int n = (int)ctx->common.threads;
    pthread_t tids[RTV_MAX_THREADS];
    worker_arg args[RTV_MAX_THREADS];
    /* All threads share a start a little in the future so set-up cost is not measured. */
    uint64_t first = rtv_now_ns() + 10 * 1000 * 1000;
    for (int i = 0; i < n; i++) {
        args[i] = (worker_arg){ctx, i, first};
        if (pthread_create(&tids[i], NULL, worker, &args[i]) != 0) rtv_die(RTV_EXIT_FAILURE, "cannot start thread %d", i);
    }
    for (int i = 0; i < n; i++) pthread_join(tids[i], NULL);
    return 0;
}

const rtv_probe rtv_probe_timer = {
    .name = "timer",
    .summary = "periodic wake-up latency (cyclictest method)",
    .opts = timer_opts,
    .value_field = "latency_ns",
    .aux_field = NULL,
    .kind_names = (const char *const[]){"wakeup", NULL},
    .stat_names = stat_names,
    .run = timer_run,
};
