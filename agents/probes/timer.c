/* timer: periodic wake-up latency by the cyclictest method.
 * Each thread sleeps with an absolute clock_nanosleep to its next period on CLOCK_MONOTONIC and
 * records actual wake - planned wake. Missed periods are skipped (and counted), not queued, so one
 * long stall shows as one large sample rather than a burst of catch-up wake-ups.
 * --engine timerlat hands the measurement to the kernel's timerlat tracer instead (timerlat.c). */
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>

#include "probes.h"
#include "timer.h"

struct timer_options timer_opt = {.interval_ns = 1000000, .distance_ns = 500000, .engine = "cyclictest"};

static const rtv_opt timer_opts[] = {
    {"interval", RTV_OPT_NS, &timer_opt.interval_ns, 10000, 10000000000ull, "period of thread 0 in ns"},
    {"distance", RTV_OPT_NS, &timer_opt.distance_ns, 0, 10000000000ull, "period increment per further thread in ns"},
    {"engine", RTV_OPT_STR, &timer_opt.engine, 0, 0, "cyclictest (our threads) or timerlat (the kernel tracer)"},
    {0},
};

enum { STAT_OVERRUNS, STAT_START_DELAY_NS };
static const char *const stat_names[] = {"overruns", "start_delay_ns", NULL};

typedef struct {
    rtv_ctx *ctx;
    int index;
    uint64_t first_ns;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    rtv_setup_thread(ctx, a->index, (int)ctx->common.priority);
    const uint64_t interval = timer_opt.interval_ns + (uint64_t)a->index * timer_opt.distance_ns;
    uint64_t next = a->first_ns, overruns = 0;
    /* A thread that got its CPU and priority only after the shared start (a busy machine can delay a new
     * SCHED_OTHER thread by hundreds of ms) joins at the next period: its set-up delay is not a wake-up
     * latency, and cyclictest does not measure its own start either. Its duration counts from there: every
     * period of it is then a sample or an overrun. */
    for (uint64_t ready = rtv_now_ns(); next <= ready;) next += interval;
    const uint64_t joined = next, end = rtv_end_ns(ctx, joined);
    for (uint64_t n = 0; !ctx->common.loops || n < ctx->common.loops; n++) {
        if (next >= end) break;
        if (!rtv_sleep_until(ctx, next)) break;
        uint64_t now = rtv_now_ns();
        rtv_sample(ctx, a->index, next, (int64_t)(now - next), 0, sched_getcpu(), 0);
        next += interval;
        while (next <= now && next < end) { /* skip periods that already passed */
            next += interval;
            overruns++;
        }
    }
    rtv_stat(ctx, a->index, STAT_OVERRUNS, (int64_t)overruns);
    rtv_stat(ctx, a->index, STAT_START_DELAY_NS, (int64_t)(joined - a->first_ns));
    return NULL;
}

static int timer_run(rtv_ctx *ctx) {
    int n = (int)ctx->common.threads;
    worker_arg args[RTV_MAX_THREADS];
    /* All threads share a start a little in the future so set-up cost is not measured. */
    uint64_t first = rtv_now_ns() + 10 * 1000 * 1000;
    for (int i = 0; i < n; i++) args[i] = (worker_arg){ctx, i, first};
    rtv_run_threads(n, worker, args, sizeof args[0]);
    return 0;
}

static const rtv_probe *timer_resolve(void) {
    if (!strcmp(timer_opt.engine, "timerlat")) return &timer_timerlat_engine;
    if (strcmp(timer_opt.engine, "cyclictest") != 0)
        rtv_die(RTV_EXIT_USAGE, "invalid value for '--engine': '%s' (choose cyclictest or timerlat)", timer_opt.engine);
    return &rtv_probe_timer;
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
    .resolve = timer_resolve,
};
