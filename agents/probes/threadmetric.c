/* threadmetric: preemptive scheduling throughput (the Thread-Metric preemptive test).
 * Five SCHED_FIFO threads of distinct priorities on one CPU (the first --affinity CPU): the lowest
 * resumes the next one up, which preempts it at once and resumes the next, up to the highest; each
 * counts one and suspends itself, so one round = one pass down the chain and all five counters
 * advance together. A reporter above them samples the rounds done in every reporting interval.
 *
 * The counters are checked at every report: inside a round they may differ by at most one; more
 * means a resume did not preempt (the chain spans CPUs, or the scheduler is not strictly
 * priority-preemptive) and the run fails loudly. With several --affinity CPUs the threads are spread
 * over them (thread i on the i-th), which is exactly such a configuration. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <semaphore.h>
#include <stdio.h>

#include "probes.h"

enum { CHAIN = 5 };

static struct {
    uint64_t report_interval_ns;
} opt = {.report_interval_ns = 5000000000ull};

static const rtv_opt threadmetric_opts[] = {
    {"report-interval", RTV_OPT_NS, &opt.report_interval_ns, 1000000, 3600000000000ull, "reporting interval in ns"},
    {0},
};

enum { STAT_ROUNDS_TOTAL, STAT_COUNTER_SPREAD };
static const char *const stat_names[] = {"rounds_total", "counter_spread", NULL};

typedef struct {
    rtv_ctx *ctx;
    int home_cpu; /* where the chain runs unless --affinity spreads it */
    sem_t resume[CHAIN];
    _Atomic uint64_t count[CHAIN];
    atomic_bool quit;    /* thread 0 ends its round and stops */
    atomic_bool release; /* the suspended threads exit */
} chain;

typedef struct {
    chain *c;
    int index;
} link_arg;

static void suspend(chain *c, int index) {
    while (sem_wait(&c->resume[index]) != 0 && errno == EINTR) {}
}

static void *link_main(void *p) {
    link_arg *a = p;
    chain *c = a->c;
    int i = a->index;
    rtv_pin_cpu(c->ctx->common.affinity.count ? rtv_thread_cpu(c->ctx, i) : c->home_cpu, "a threadmetric thread");
    rtv_set_priority((int)c->ctx->common.priority - CHAIN + i);
    if (i == 0) {
        while (!atomic_load_explicit(&c->quit, memory_order_relaxed)) {
            sem_post(&c->resume[1]);
            atomic_fetch_add_explicit(&c->count[0], 1, memory_order_relaxed);
        }
        return NULL;
    }
    for (;;) {
        suspend(c, i);
        if (atomic_load(&c->release)) break;
        if (i + 1 < CHAIN) sem_post(&c->resume[i + 1]);
        atomic_fetch_add_explicit(&c->count[i], 1, memory_order_relaxed);
    }
    return NULL;
}

static uint64_t spread(chain *c) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < CHAIN; i++) {
        uint64_t v = atomic_load_explicit(&c->count[i], memory_order_relaxed);
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    return hi - lo;
}

static void report_counters(chain *c, const char *when) {
    fprintf(stderr, "rtvirt-agent: threadmetric: per-thread counters diverged %s:", when);
    for (int i = 0; i < CHAIN; i++) fprintf(stderr, " %" PRIu64, atomic_load(&c->count[i]));
    fprintf(stderr, " (a resume did not preempt: is the chain on one CPU under SCHED_FIFO?)\n");
}

static int threadmetric_validate(rtv_common *common) {
    if (common->threads != 1)
        rtv_die(RTV_EXIT_USAGE, "threadmetric runs its own five threads; '--threads' must be 1");
    if (common->priority < CHAIN + 1)
        rtv_die(RTV_EXIT_USAGE, "threadmetric needs SCHED_FIFO: '--priority' must be at least %d (the five threads "
                                "take the priorities below it), so --no-rt is not possible", CHAIN + 1);
    return 0;
}

static int threadmetric_run(rtv_ctx *ctx) {
    static chain c;
    c.ctx = ctx;
    for (int i = 0; i < CHAIN; i++) sem_init(&c.resume[i], 0, 0);
    int cpu = c.home_cpu = rtv_home_cpu(ctx);
    rtv_pin_cpu(cpu, "the threadmetric reporter");
    rtv_set_priority((int)ctx->common.priority);

    link_arg args[CHAIN];
    pthread_t tids[CHAIN];
    for (int i = CHAIN - 1; i >= 0; i--) { /* the suspended threads first, thread 0 starts the rounds */
        args[i] = (link_arg){&c, i};
        tids[i] = rtv_spawn(link_main, &args[i]);
    }

    int status = 0;
    uint64_t next = rtv_now_ns() + opt.report_interval_ns, before = 0, last = next - opt.report_interval_ns;
    const uint64_t end = rtv_end_ns(ctx, last);
    for (uint64_t n = 0; !ctx->common.loops || n < ctx->common.loops; n++) {
        if (next > end) break;
        if (!rtv_sleep_until(ctx, next)) break;
        uint64_t now = rtv_now_ns(), rounds = atomic_load_explicit(&c.count[0], memory_order_relaxed);
        rtv_sample(ctx, 0, next, (int64_t)(rounds - before), now - last, cpu, 0);
        before = rounds;
        last = now;
        if (spread(&c) > 1) {
            report_counters(&c, "during the run");
            status = RTV_EXIT_FAILURE;
            break;
        }
        next += opt.report_interval_ns;
    }

    atomic_store(&c.quit, true);
    pthread_join(tids[0], NULL); /* thread 0 finishes its round first */
    uint64_t final_spread = spread(&c);
    atomic_store(&c.release, true);
    for (int i = 1; i < CHAIN; i++) sem_post(&c.resume[i]);
    for (int i = 1; i < CHAIN; i++) pthread_join(tids[i], NULL);
    if (status == 0 && final_spread != 0) {
        report_counters(&c, "at the end");
        status = RTV_EXIT_FAILURE;
    }
    rtv_stat(ctx, 0, STAT_ROUNDS_TOTAL, (int64_t)atomic_load(&c.count[0]));
    rtv_stat(ctx, 0, STAT_COUNTER_SPREAD, (int64_t)final_spread);
    return status;
}

const rtv_probe rtv_probe_threadmetric = {
    .name = "threadmetric",
    .summary = "preemptive scheduling throughput (Thread-Metric): rounds per reporting interval",
    .opts = threadmetric_opts,
    .value_field = "rounds",
    .aux_field = "interval_ns",
    .kind_names = (const char *const[]){"rounds", NULL},
    .stat_names = stat_names,
    .validate = threadmetric_validate,
    .run = threadmetric_run,
};
