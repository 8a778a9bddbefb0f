/* cpu: spin on square roots (the "sqrt" workers of the COTS-hypervisor study's reference load).
 *
 * Duty-cycle mode (--slice and --period): each worker is busy for `slice` from the start of every
 * period and sleeps for the rest, with absolute clock_nanosleep on CLOCK_MONOTONIC so that the
 * busy windows never drift. At a SCHED_FIFO priority above a probe on the same CPU this is a known
 * interferer: the probe must see holes of `slice` every `period`. A late wake-up shortens that
 * period's slice (the window ends at its planned time); periods missed entirely are skipped and
 * counted. */
#define _GNU_SOURCE
#include <math.h>

#include "stressors.h"

static struct {
    uint64_t slice_ns;
    uint64_t period_ns;
} opt;

static const rtv_opt cpu_opts[] = {
    {"slice", RTV_OPT_NS, &opt.slice_ns, 0, UINT64_C(3600000000000), "busy time per period in ns (duty mode)"},
    {"period", RTV_OPT_NS, &opt.period_ns, 0, UINT64_C(3600000000000), "duty-cycle period in ns, 0 = always busy"},
    {0},
};

/* One bogo operation: a dependent chain of square roots (a few hundred ns), so that duty mode
 * checks the clock often enough to end its window within a fraction of a microsecond. */
static double sqrt_round(double x) {
    for (int i = 0; i < 64; i++) x = sqrt(x + (double)i);
    return x;
}

static volatile double sink; /* keeps the compiler from dropping the work */

void rtv_cpu_work(rtv_worker *w) {
    double x = 1.0 + w->index;
    while (!rtv_stress_stopping(w)) {
        x = sqrt_round(x);
        atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
    }
    sink = x;
}

static void duty_work(rtv_worker *w) {
    rtv_ctx *ctx = &w->stress->ctx;
    /* Every worker's windows start on the same grid, one period after the run starts. */
    uint64_t next = ctx->start_ns + opt.period_ns;
    double x = 1.0 + w->index;
    while (rtv_sleep_until(ctx, next)) {
        uint64_t until = next + opt.slice_ns;
        while (rtv_now_ns() < until && !rtv_stress_stopping(w)) {
            x = sqrt_round(x);
            atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
        }
        uint64_t now = rtv_now_ns();
        next += opt.period_ns;
        while (next + opt.slice_ns <= now) { /* a whole window already passed: skip it */
            next += opt.period_ns;
            w->missed++;
        }
        if (rtv_stress_stopping(w)) break;
    }
    sink = x;
}

static void cpu_dispatch(rtv_worker *w) {
    if (opt.period_ns) duty_work(w);
    else rtv_cpu_work(w);
}

static int cpu_prepare(rtv_stress *s) {
    (void)s;
    if ((opt.slice_ns == 0) != (opt.period_ns == 0)) {
        fprintf(stderr, "rtvirt-agent: --slice and --period go together (duty mode needs both)\n");
        return RTV_EXIT_USAGE;
    }
    if (opt.period_ns && opt.slice_ns >= opt.period_ns) {
        fprintf(stderr, "rtvirt-agent: --slice must be shorter than --period (use neither for a 100%% load)\n");
        return RTV_EXIT_USAGE;
    }
    if (opt.period_ns && opt.period_ns < 10000) {
        fprintf(stderr, "rtvirt-agent: --period must be at least 10000 ns\n");
        return RTV_EXIT_USAGE;
    }
    return 0;
}

static void cpu_report(rtv_stress *s, FILE *out) {
    (void)s;
    fprintf(out, ",\"mode\":\"%s\",\"slice_ns\":%llu,\"period_ns\":%llu", opt.period_ns ? "duty" : "spin",
            (unsigned long long)opt.slice_ns, (unsigned long long)opt.period_ns);
}

const rtv_stressor rtv_stressor_cpu = {
    .name = "cpu",
    .summary = "spin on square roots; --slice/--period make a periodic duty-cycle interferer",
    .opts = cpu_opts,
    .prepare = cpu_prepare,
    .work = cpu_dispatch,
    .report = cpu_report,
};
