/* gap: interruption detector (clock-tick-duration method, as osnoise/sysjitter).
 * A thread per CPU spins reading the cycle counter; any step between two reads above the threshold
 * is time the thread did not get (an interrupt, a preempting thread, the hypervisor taking the vCPU):
 * it is recorded as (start, length). The smallest and mean step below the threshold are the loop's
 * own noise floor; the sum of those steps over the run time is the share of the CPU the thread got.
 * --work instead times a fixed busy-work unit again and again (get time, work, get time). */
#define _GNU_SOURCE
#include <sched.h>

#include "probes.h"

static struct {
    uint64_t threshold_ns;
    bool work;
    uint64_t work_unit;
} opt = {.threshold_ns = 1000, .work_unit = 20000};

static const rtv_opt gap_opts[] = {
    {"threshold", RTV_OPT_NS, &opt.threshold_ns, 1, 1000000000ull, "smallest step recorded as a gap, in ns"},
    {"work", RTV_OPT_BOOL, &opt.work, 0, 1, "time a fixed busy-work unit repeatedly instead of spinning"},
    {"work-unit", RTV_OPT_U64, &opt.work_unit, 1, 1000000000ull, "busy-work unit size in loop iterations"},
    {0},
};

enum { KIND_GAP, KIND_WORK };
enum { STAT_LOOP_MIN_NS, STAT_LOOP_MEAN_NS, STAT_CPU_SHARE_PPM, STAT_GAPS, STAT_START_DELAY_NS };
static const char *const stat_names[] = {"loop_min_ns", "loop_mean_ns", "cpu_share_ppm", "gaps", "start_delay_ns",
                                         NULL};

typedef struct {
    rtv_ctx *ctx;
    int index;
} worker_arg;

static void report_start_delay(rtv_ctx *ctx, int index, uint64_t first) {
    rtv_stat(ctx, index, STAT_START_DELAY_NS,
             first > ctx->start_cycles ? (int64_t)rtv_cycles_to_ns(first - ctx->start_cycles) : 0);
}

static void spin(rtv_ctx *ctx, int index) {
    const double hz = rtv_cycles_hz();
    const uint64_t threshold = (uint64_t)((double)opt.threshold_ns * hz / 1e9) + 1;
    /* The CPU a gap began on: a thread moves only while it is off its CPU, i.e. in a gap, so the CPU read
     * after each gap is where the next one begins (unpinned threads) */
    int cpu = sched_getcpu();
    uint64_t gaps = 0, loops = 0, got = 0, min_step = UINT64_MAX;
    const uint64_t first = rtv_cycles();
    const uint64_t deadline = rtv_end_cycles(ctx, first), limit = ctx->common.loops;
    uint64_t prev = first;
    while (!rtv_signalled() && prev < deadline && (!limit || gaps < limit)) {
        uint64_t now = rtv_cycles();
        uint64_t step = now - prev;
        if (step >= threshold) {
            /* the time and CPU reads after a gap are part of the next step (a few tens of ns) */
            rtv_sample(ctx, index, rtv_cycles_to_mono(prev), (int64_t)rtv_cycles_to_ns(step), step, cpu, KIND_GAP);
            cpu = sched_getcpu();
            gaps++;
        } else {
            got += step;
            loops++;
            if (step < min_step) min_step = step;
        }
        prev = now;
    }
    uint64_t total = prev - first;
    rtv_stat(ctx, index, STAT_LOOP_MIN_NS, loops ? (int64_t)rtv_cycles_to_ns(min_step) : -1);
    rtv_stat(ctx, index, STAT_LOOP_MEAN_NS, loops ? (int64_t)((double)got * 1e9 / hz / (double)loops) : -1);
    rtv_stat(ctx, index, STAT_CPU_SHARE_PPM, total ? (int64_t)((double)got * 1e6 / (double)total) : -1);
    rtv_stat(ctx, index, STAT_GAPS, (int64_t)gaps);
    report_start_delay(ctx, index, first);
}

/* The busy-work unit: a dependent integer chain the compiler cannot shorten. */
static uint64_t work_unit(uint64_t seed, uint64_t iterations) {
    uint64_t x = seed;
    for (uint64_t i = 0; i < iterations; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
}

static void work(rtv_ctx *ctx, int index) {
    const uint64_t first = rtv_cycles();
    const uint64_t deadline = rtv_end_cycles(ctx, first), limit = ctx->common.loops;
    const int cpu = sched_getcpu();
    volatile uint64_t sink = 0;
    for (uint64_t n = 0; !rtv_signalled() && (!limit || n < limit); n++) {
        uint64_t t0 = rtv_cycles();
        sink = work_unit(sink + n, opt.work_unit);
        uint64_t t1 = rtv_cycles();
        rtv_sample(ctx, index, rtv_cycles_to_mono(t0), (int64_t)rtv_cycles_to_ns(t1 - t0), t1 - t0, cpu,
                   KIND_WORK);
        if (t1 >= deadline) break;
    }
    report_start_delay(ctx, index, first);
}

static void *worker(void *p) {
    worker_arg *a = p;
    rtv_setup_thread(a->ctx, a->index, (int)a->ctx->common.priority);
    if (opt.work) work(a->ctx, a->index);
    else spin(a->ctx, a->index);
    return NULL;
}

static int gap_run(rtv_ctx *ctx) {
    worker_arg args[RTV_MAX_THREADS];
    for (int i = 0; i < (int)ctx->common.threads; i++) args[i] = (worker_arg){ctx, i};
    rtv_run_threads((int)ctx->common.threads, worker, args, sizeof args[0]);
    return 0;
}

const rtv_probe rtv_probe_gap = {
    .name = "gap",
    .summary = "interruption detector: gaps in a cycle-counter spin loop, or busy-work unit durations",
    .opts = gap_opts,
    .value_field = "duration_ns",
    .aux_field = "cycles",
    .kind_names = (const char *const[]){"gap", "work", NULL},
    .stat_names = stat_names,
    .run = gap_run,
};
