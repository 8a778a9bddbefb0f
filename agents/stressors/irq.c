/* irq: keep timer interrupts coming. Each worker sleeps to absolute deadlines --rate times a second
 * (clock_nanosleep on CLOCK_MONOTONIC, i.e. one hrtimer expiry, interrupt and wake-up per period)
 * on its CPU. It stands in for the interrupt-heavy neighbours (network, disk) the studies wanted
 * next: the interrupt and the softirq/scheduler work around it, not device DMA. */
#define _GNU_SOURCE
#include "stressors.h"

static struct {
    uint64_t rate;
} opt = {.rate = 10000};

static const rtv_opt irq_opts[] = {
    {"rate", RTV_OPT_U64, &opt.rate, 1, 1000000, "timer wake-ups per second per worker"},
    {0},
};

static void irq_work(rtv_worker *w) {
    rtv_ctx *ctx = &w->stress->ctx;
    const uint64_t period = UINT64_C(1000000000) / opt.rate;
    uint64_t next = rtv_now_ns() + period;
    while (rtv_sleep_until(ctx, next)) {
        atomic_fetch_add_explicit(&w->ops, 1, memory_order_relaxed);
        uint64_t now = rtv_now_ns();
        next += period;
        while (next <= now) { /* late: skip, do not burst to catch up */
            next += period;
            w->missed++;
        }
        if (rtv_stress_stopping(w)) break;
    }
}

static void irq_report(rtv_stress *s, FILE *out) {
    (void)s;
    fprintf(out, ",\"rate_hz\":%llu,\"period_ns\":%llu", (unsigned long long)opt.rate,
            (unsigned long long)(UINT64_C(1000000000) / opt.rate));
}

const rtv_stressor rtv_stressor_irq = {
    .name = "irq",
    .summary = "timer interrupts at --rate per worker (absolute clock_nanosleep)",
    .opts = irq_opts,
    .work = irq_work,
    .report = irq_report,
};
