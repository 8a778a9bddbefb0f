/* The stressor registry and the descriptor every stressor file exports.
 *
 * A stressor is a set of worker threads, each running a work loop until told to stop. The driver
 * (stress_main.c) parses options, places worker i on cpus[i % n] at the requested priority, stops
 * everyone on SIGINT/SIGTERM/SIGHUP, at the deadline or when the parent dies, and prints a one-line
 * JSON summary on stdout. A stressor may be made of several parts (mix: cpu + mem workers).
 */
#ifndef RTV_STRESSORS_H
#define RTV_STRESSORS_H
#include <stdio.h>

#include "rtv.h"

#define RTV_STRESSOR_LIST(X) X(cpu) X(cache) X(mem) X(io) X(irq) X(mix)
#define RTV_STRESS_MAX_WORKERS 1024
#define RTV_STRESS_MAX_PARTS 4

typedef struct rtv_stress rtv_stress;

typedef struct {
    rtv_stress *stress;
    int index;  /* global worker index: decides the CPU */
    int part;   /* index into stress->parts */
    int cpu;    /* CPU it is pinned to, -1 when not placed */
    _Atomic uint64_t ops; /* bogo operations: one unit of the stressor's work */
    uint64_t missed;      /* periodic stressors: periods skipped because the worker was late */
    uint64_t bytes;       /* bytes moved (memory touched, file written + read) */
    uint64_t cpu_time_ns; /* thread CPU time used, taken when the loop ends */
} rtv_worker;

typedef void (*rtv_work_fn)(rtv_worker *w);

typedef struct {
    const char *name;
    rtv_work_fn work;
    int workers;
} rtv_stress_part;

typedef struct {
    const char *name;
    const char *summary;
    const rtv_opt *opts; /* NULL-name terminated */
    /* Check options and fill in the parts (by default one part running `work` on every worker).
     * Returns 0, or prints a message and returns RTV_EXIT_USAGE. */
    int (*prepare)(rtv_stress *s);
    rtv_work_fn work; /* frees what it allocated before returning */
    /* Extra JSON members for the summary, each written as ,"key":value */
    void (*report)(rtv_stress *s, FILE *out);
} rtv_stressor;

struct rtv_stress {
    const rtv_stressor *stressor;
    rtv_ctx ctx;            /* ctx.common.{duration_ns, priority, affinity} and the stop deadline */
    uint64_t workers;       /* --workers, 0 = one per CPU of --cpus (or per online CPU) */
    bool workers_given;     /* --workers was set explicitly (mix: that many of each kind) */
    int nparts;
    rtv_stress_part parts[RTV_STRESS_MAX_PARTS];
};

/* Ask the driver to stop: used by a worker that hit a fatal error. */
void rtv_stress_fail(rtv_stress *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline bool rtv_stress_stopping(const rtv_worker *w) { return rtv_should_stop(&w->stress->ctx); }

/* Work loops other stressors reuse (mix). */
void rtv_cpu_work(rtv_worker *w);
void rtv_mem_work(rtv_worker *w);
int rtv_mem_prepare(rtv_stress *s);
extern uint64_t rtv_mem_block_bytes;

#define RTV_DECLARE_STRESSOR(name) extern const rtv_stressor rtv_stressor_##name;
RTV_STRESSOR_LIST(RTV_DECLARE_STRESSOR)
#undef RTV_DECLARE_STRESSOR

#endif
