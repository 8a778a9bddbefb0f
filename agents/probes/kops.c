/* kops: kernel-operation latency, the Linux analogue of Zephyr's latency_measure.
 * Every operation runs --iterations times on one CPU (the first --affinity CPU, else the current
 * one) and every iteration is kept: value = ns, aux = cycles, kind = the operation.
 *
 * Operations "with a context switch" use a partner thread on the same CPU one priority above the
 * measuring thread, blocked on the object: the measuring thread reads the cycle counter and signals,
 * the partner preempts it at once and reads the counter first thing. The partner hands its reading
 * back and re-blocks before the measuring thread runs again, so only the measuring thread ever
 * writes samples (the rings are single-producer).
 *
 * The message queue is a pipe carrying 16-byte messages (atomic below PIPE_BUF): pipes exist in every
 * Linux kernel and libc, while POSIX message queues need CONFIG_POSIX_MQUEUE, which minimal guest
 * kernels often lack. The event is an eventfd: a kernel wait-queue object woken by a write, the path
 * a driver uses to wake a reader, distinct from the futex path the semaphore already measures. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "probes.h"

static struct {
    uint64_t iterations;
    uint64_t alloc_size;
} opt = {.iterations = 1000, .alloc_size = 256};

static const rtv_opt kops_opts[] = {
    {"iterations", RTV_OPT_U64, &opt.iterations, 1, 100000000ull, "iterations per operation"},
    {"alloc-size", RTV_OPT_U64, &opt.alloc_size, 1, 1ull << 30, "bytes per malloc in malloc_free"},
    {0},
};

enum {
    OP_YIELD_SWITCH,
    OP_SEM_SWITCH,
    OP_SEM_NOSWITCH,
    OP_MUTEX,
    OP_THREAD_CREATE,
    OP_THREAD_FIRST_RUN,
    OP_THREAD_JOIN,
    OP_MSGQ_SWITCH,
    OP_MSGQ_NOSWITCH,
    OP_EVENT_SWITCH,
    OP_MALLOC_FREE,
};
static const char *const kind_names[] = {
    "yield_switch", "sem_switch", "sem_noswitch", "mutex_lock_unlock", "thread_create", "thread_first_run",
    "thread_join", "msgq_switch", "msgq_noswitch", "event_switch", "malloc_free", NULL,
};
enum { STAT_YIELD_NO_SWITCH };
static const char *const stat_names[] = {"yield_no_switch", NULL};

typedef struct {
    rtv_ctx *ctx;
    int cpu;
    int partner_priority;
} kops_env;

static void record(const kops_env *env, int op, uint64_t start, uint64_t end) {
    uint64_t cycles = end - start;
    rtv_sample(env->ctx, 0, rtv_cycles_to_mono(start), (int64_t)rtv_cycles_to_ns(cycles), cycles, env->cpu,
               op);
}

static void sem_wait_retry(sem_t *s) {
    while (sem_wait(s) != 0 && errno == EINTR) {}
}

static void full_read(int fd, void *buf, size_t n) {
    while (read(fd, buf, n) < 0 && errno == EINTR) {}
}

static void full_write(int fd, const void *buf, size_t n) {
    while (write(fd, buf, n) < 0 && errno == EINTR) {}
}

/* ---- switch pairs: signal an object a higher-priority partner is blocked on ---- */

typedef enum { OBJ_SEM, OBJ_PIPE, OBJ_EVENTFD } object_type;

typedef struct {
    const kops_env *env;
    object_type type;
    sem_t sem, back;
    int fds[2];
    _Atomic uint64_t woke;
    atomic_bool quit;
} switch_pair;

typedef struct {
    uint64_t seq, pad;
} message;
_Static_assert(sizeof(message) == 16, "message size is documented");

static void object_wait(switch_pair *p) {
    if (p->type == OBJ_SEM) sem_wait_retry(&p->sem);
    else if (p->type == OBJ_PIPE) {
        message m;
        full_read(p->fds[0], &m, sizeof m);
    } else {
        uint64_t count;
        full_read(p->fds[0], &count, sizeof count);
    }
}

static void object_signal(switch_pair *p) {
    if (p->type == OBJ_SEM) sem_post(&p->sem);
    else if (p->type == OBJ_PIPE) {
        message m = {0, 0};
        full_write(p->fds[1], &m, sizeof m);
    } else {
        uint64_t one = 1;
        full_write(p->fds[0], &one, sizeof one);
    }
}

static void *partner(void *arg) {
    switch_pair *p = arg;
    rtv_pin_cpu(p->env->cpu, "the kops partner thread");
    rtv_set_priority(p->env->partner_priority);
    for (;;) {
        object_wait(p);
        uint64_t now = rtv_cycles();
        if (atomic_load(&p->quit)) break;
        atomic_store_explicit(&p->woke, now, memory_order_release);
        sem_post(&p->back);
    }
    return NULL;
}

static void run_switch_pair(const kops_env *env, object_type type, int op) {
    switch_pair p = {.env = env, .type = type, .fds = {-1, -1}};
    sem_init(&p.sem, 0, 0);
    sem_init(&p.back, 0, 0);
    if (type == OBJ_PIPE && pipe(p.fds) != 0) rtv_die(RTV_EXIT_FAILURE, "cannot create a pipe");
    if (type == OBJ_EVENTFD && (p.fds[0] = eventfd(0, 0)) < 0) rtv_die(RTV_EXIT_FAILURE, "cannot create an eventfd");
    pthread_t tid = rtv_spawn(partner, &p);
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        uint64_t start = rtv_cycles();
        object_signal(&p);
        sem_wait_retry(&p.back); /* returns at once when the partner preempted us */
        record(env, op, start, atomic_load_explicit(&p.woke, memory_order_acquire));
    }
    atomic_store(&p.quit, true);
    object_signal(&p);
    pthread_join(tid, NULL);
    for (int i = 0; i < 2; i++)
        if (p.fds[i] >= 0) close(p.fds[i]);
    sem_destroy(&p.sem);
    sem_destroy(&p.back);
}

/* ---- yield: two threads of equal priority hand the CPU to each other ---- */

typedef struct {
    const kops_env *env;
    _Atomic uint64_t ran;
    atomic_bool started, quit;
} yield_pair;

static void *yield_partner(void *arg) {
    yield_pair *y = arg;
    rtv_pin_cpu(y->env->cpu, "the kops partner thread");
    rtv_set_priority(y->env->partner_priority - 1); /* same priority as the measuring thread */
    atomic_store(&y->started, true);
    while (!atomic_load(&y->quit)) {
        atomic_store_explicit(&y->ran, rtv_cycles(), memory_order_release);
        sched_yield();
    }
    return NULL;
}

static void run_yield(const kops_env *env) {
    yield_pair y = {.env = env};
    pthread_t tid = rtv_spawn(yield_partner, &y);
    while (!atomic_load(&y.started)) sched_yield();
    uint64_t no_switch = 0;
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled();) {
        uint64_t start = rtv_cycles();
        sched_yield();
        uint64_t back = rtv_cycles();
        uint64_t ran = atomic_load_explicit(&y.ran, memory_order_acquire);
        if (ran < start) { /* the partner did not run in between: no switch happened */
            no_switch++;
            continue;
        }
        record(env, OP_YIELD_SWITCH, start, ran); /* us -> partner */
        record(env, OP_YIELD_SWITCH, ran, back);  /* partner -> us */
        i += 2;
    }
    atomic_store(&y.quit, true);
    pthread_join(tid, NULL);
    rtv_stat(env->ctx, 0, STAT_YIELD_NO_SWITCH, (int64_t)no_switch);
}

/* ---- thread create / first run / join ---- */

typedef struct {
    uint64_t first, last;
} thread_times;

static void *short_thread(void *arg) {
    thread_times *t = arg;
    t->first = rtv_cycles();
    t->last = rtv_cycles();
    return NULL;
}

static void run_threads(const kops_env *env) {
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        thread_times t = {0, 0};
        uint64_t start = rtv_cycles();
        pthread_t tid = rtv_spawn(short_thread, &t); /* inherits our CPU and priority */
        uint64_t created = rtv_cycles();
        pthread_join(tid, NULL);
        uint64_t joined = rtv_cycles();
        record(env, OP_THREAD_CREATE, start, created);
        record(env, OP_THREAD_FIRST_RUN, start, t.first); /* from the create call: the child may run before it returns */
        record(env, OP_THREAD_JOIN, t.last, joined);
    }
}

/* ---- operations without a context switch ---- */

static void run_no_switch(const kops_env *env) {
    sem_t sem;
    sem_init(&sem, 0, 0);
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        uint64_t start = rtv_cycles();
        sem_post(&sem);
        sem_wait_retry(&sem);
        record(env, OP_SEM_NOSWITCH, start, rtv_cycles());
    }
    sem_destroy(&sem);

    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        uint64_t start = rtv_cycles();
        pthread_mutex_lock(&mutex);
        pthread_mutex_unlock(&mutex);
        record(env, OP_MUTEX, start, rtv_cycles());
    }

    int fds[2];
    if (pipe(fds) != 0) rtv_die(RTV_EXIT_FAILURE, "cannot create a pipe");
    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        message m = {i, 0};
        uint64_t start = rtv_cycles();
        full_write(fds[1], &m, sizeof m);
        full_read(fds[0], &m, sizeof m);
        record(env, OP_MSGQ_NOSWITCH, start, rtv_cycles());
    }
    close(fds[0]);
    close(fds[1]);

    for (uint64_t i = 0; i < opt.iterations && !rtv_signalled(); i++) {
        uint64_t start = rtv_cycles();
        volatile char *block = malloc(opt.alloc_size);
        if (!block) rtv_die(RTV_EXIT_FAILURE, "malloc(%llu) failed", (unsigned long long)opt.alloc_size);
        block[0] = 1; /* the allocation is used, so it cannot be optimised away */
        free((void *)block);
        record(env, OP_MALLOC_FREE, start, rtv_cycles());
    }
}

static int kops_validate(rtv_common *common) {
    if (common->threads != 1) rtv_die(RTV_EXIT_USAGE, "kops measures with one thread; '--threads' must be 1");
    if (common->priority == 1)
        rtv_die(RTV_EXIT_USAGE, "kops needs '--priority' of at least 2 (the measuring thread runs one below it, "
                                "the partner thread at it), or 0 for SCHED_OTHER");
    return 0;
}

static int kops_run(rtv_ctx *ctx) {
    int priority = (int)ctx->common.priority;
    kops_env env = {.ctx = ctx, .cpu = rtv_home_cpu(ctx), .partner_priority = priority};
    rtv_pin_cpu(env.cpu, "the kops thread");
    rtv_set_priority(priority ? priority - 1 : 0);
    run_yield(&env);
    run_switch_pair(&env, OBJ_SEM, OP_SEM_SWITCH);
    run_switch_pair(&env, OBJ_PIPE, OP_MSGQ_SWITCH);
    run_switch_pair(&env, OBJ_EVENTFD, OP_EVENT_SWITCH);
    run_threads(&env);
    run_no_switch(&env);
    return 0;
}

const rtv_probe rtv_probe_kops = {
    .name = "kops",
    .summary = "kernel-operation latency (Zephyr latency_measure method), every iteration kept",
    .opts = kops_opts,
    .value_field = "duration_ns",
    .aux_field = "cycles",
    .kind_names = kind_names,
    .stat_names = stat_names,
    .validate = kops_validate,
    .run = kops_run,
};
