/* The timer probe's options and engines, shared by timer.c and timer_timerlat.c. */
#ifndef RTV_TIMER_H
#define RTV_TIMER_H
#include "rtv.h"

struct timer_options {
    uint64_t interval_ns;
    uint64_t distance_ns;
    const char *engine;
};
extern struct timer_options timer_opt;

/* The timer probe as measured by the kernel's timerlat tracer (value = thread latency, aux = IRQ latency). */
extern const rtv_probe timer_timerlat_engine;

#endif
