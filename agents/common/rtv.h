/* rtvirt agents: shared runtime for probes and stressors.
 *
 * Every probe writes one sample stream (docs/sample-stream.md): a header carrying JSON metadata,
 * then fixed 32-byte little-endian records. Measuring threads never do I/O: they push records
 * into their own single-producer ring; one writer thread drains every ring to the output fd.
 */
#ifndef RTV_H
#define RTV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define RTV_STREAM_MAGIC "RTVIRT\0S"
#define RTV_STREAM_VERSION 1u
#define RTV_MAX_THREADS 256
#define RTV_MAX_CPUS 1024

/* Exit codes shared with the Python side (rtvirt.errors). */
enum { RTV_EXIT_OK = 0, RTV_EXIT_FAILURE = 1, RTV_EXIT_USAGE = 2 };

typedef struct {
    uint64_t t_ns;   /* CLOCK_MONOTONIC time the sample refers to (planned wake, gap start...) */
    int64_t value;   /* the measured quantity in ns (latency or duration), or a count */
    uint64_t aux;    /* probe-specific second quantity (cycles, IRQ part...) */
    uint16_t cpu;    /* CPU the sample was taken on */
    uint16_t thread; /* measuring thread index */
    uint16_t kind;   /* probe-specific kind (operation, kernel...), names in the header */
    uint16_t flags;  /* RTV_FLAG_* */
} rtv_record;
_Static_assert(sizeof(rtv_record) == 32, "record layout is part of the file format");

enum { RTV_FLAG_META = 1 };
/* Meta record kinds (flags & RTV_FLAG_META). */
enum {
    RTV_META_DROPPED = 1, /* thread, value = samples dropped because its ring was full */
    RTV_META_END = 2,     /* value = data (non-meta) records written, aux = rtv_end_reason */
    RTV_META_STAT = 3,    /* thread, aux = index into the probe's stat_names, value */
};
typedef enum { RTV_END_COMPLETE = 0, RTV_END_SIGNAL = 1, RTV_END_ERROR = 2 } rtv_end_reason;

/* ---- options: one declarative table per probe/stressor, parsed and echoed into the header ---- */
typedef enum { RTV_OPT_U64, RTV_OPT_NS, RTV_OPT_BOOL, RTV_OPT_CPUS, RTV_OPT_STR } rtv_opt_type;

typedef struct {
    int count;
    uint16_t cpu[RTV_MAX_CPUS];
} rtv_cpulist;

typedef struct {
    const char *name;
    rtv_opt_type type;
    void *dest; /* uint64_t*, bool*, rtv_cpulist*, const char** */
    uint64_t min, max;
    const char *help;
} rtv_opt;

/* Options every probe understands (the cyclictest core set). */
typedef struct {
    uint64_t duration_ns; /* 0: until loops reached or signalled */
    uint64_t loops;       /* samples per thread, 0: unlimited */
    uint64_t threads;
    uint64_t priority; /* SCHED_FIFO priority, 0 = SCHED_OTHER */
    bool mlock;
    bool dma_latency; /* hold /dev/cpu_dma_latency at 0 */
    rtv_cpulist affinity; /* thread i runs on affinity.cpu[i % count] */
    const char *out;
    const char *tee;      /* "" or a file that receives a copy of the stream (kept on an SSH target) */
    bool watch_stdin;     /* stop (flushing) when stdin reaches its end: the agent dies with its session */
    const char *confirm;  /* "" or a channel where the host confirms, after END, how many records it holds */
    uint64_t confirm_timeout_ns;
    uint64_t ring_order; /* ring capacity 2^order records per thread */
} rtv_common;

typedef struct rtv_ctx rtv_ctx;

typedef struct rtv_probe {
    const char *name;
    const char *summary;
    const rtv_opt *opts;            /* NULL-name terminated */
    const char *value_field;        /* "latency_ns", "duration_ns", "rounds" */
    const char *aux_field;          /* NULL or e.g. "cycles" */
    const char *const *kind_names;  /* NULL-terminated; kind i's name */
    const char *const *stat_names;  /* NULL-terminated; names for RTV_META_STAT keys */
    int (*validate)(rtv_common *common); /* cross-check options, may adjust defaults */
    int (*run)(rtv_ctx *ctx);
    /* Optional: after parsing, the descriptor that actually runs (an engine variant with other fields). */
    const struct rtv_probe *(*resolve)(void);
} rtv_probe;

/* ---- time ---- */
static inline uint64_t rtv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}
static inline struct timespec rtv_ts(uint64_t ns) {
    struct timespec ts = {.tv_sec = (time_t)(ns / UINT64_C(1000000000)), .tv_nsec = (long)(ns % UINT64_C(1000000000))};
    return ts;
}
/* Sleep until an absolute CLOCK_MONOTONIC time; returns false if interrupted by a stop request. */
bool rtv_sleep_until(rtv_ctx *ctx, uint64_t t_ns);

/* Cycle counter: TSC on x86-64, the virtual counter on AArch64, ns elsewhere. */
static inline uint64_t rtv_cycles(void) {
#if defined(__x86_64__) || defined(__i386__)
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return rtv_now_ns();
#endif
}
/* Cycles per second: the architectural counter frequency on AArch64, else measured once against
 * CLOCK_MONOTONIC_RAW (cached). */
double rtv_cycles_hz(void);
/* A reading of `clock` and the cycle counter taken together (the tightest pair of a few tries); the cycle
 * count is the one at the clock read. */
void rtv_clock_and_cycles(clockid_t clock, uint64_t *ns, uint64_t *cycles);
static inline uint64_t rtv_cycles_to_ns(uint64_t cycles) {
    return (uint64_t)((double)cycles * 1e9 / rtv_cycles_hz());
}

/* ---- context shared by a probe run ---- */
typedef struct {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint64_t dropped;
    uint64_t mask;
    rtv_record *buf;
} rtv_ring;

struct rtv_ctx {
    const rtv_probe *probe;
    rtv_common common;
    int nrings;
    rtv_ring *rings;
    int out_fd;
    int tee_fd;      /* -1: no copy */
    bool out_broken; /* the output went away (a dropped SSH channel): the tee file carries on alone */
    int confirm_fd;  /* -1: the host confirms nothing */
    pthread_t writer;
    uint64_t written;
    uint64_t start_ns;
    uint64_t start_cycles; /* rtv_cycles() read together with start_ns */
    uint64_t end_ns; /* 0: no deadline */
    int dma_fd;
    bool rt_ok; /* whether SCHED_FIFO and mlockall were applied */
};

/* Push one sample from thread `ring` (never blocks; counts a drop when the ring is full). */
static inline void rtv_push(rtv_ctx *ctx, int ring, const rtv_record *rec) {
    rtv_ring *r = &ctx->rings[ring];
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (head - tail > r->mask) {
        atomic_store_explicit(&r->dropped, atomic_load_explicit(&r->dropped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        return;
    }
    r->buf[head & r->mask] = *rec;
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
}
static inline void rtv_sample(rtv_ctx *ctx, int thread, uint64_t t_ns, int64_t value, uint64_t aux, int cpu,
                              int kind) {
    rtv_record rec = {.t_ns = t_ns, .value = value, .aux = aux, .cpu = (uint16_t)cpu,
                      .thread = (uint16_t)thread, .kind = (uint16_t)kind, .flags = 0};
    rtv_push(ctx, thread, &rec);
}
/* Record a named end-of-run statistic (key indexes probe->stat_names). */
void rtv_stat(rtv_ctx *ctx, int thread, int key, int64_t value);

extern atomic_int rtv_stop_requested;
/* True once a signal (or a thread that failed) asked every thread to stop. */
static inline bool rtv_signalled(void) { return atomic_load_explicit(&rtv_stop_requested, memory_order_relaxed); }
/* True once a signal arrived or the duration elapsed. */
static inline bool rtv_should_stop(const rtv_ctx *ctx) {
    if (rtv_signalled()) return true;
    return ctx->end_ns && rtv_now_ns() >= ctx->end_ns;
}

/* Apply the common real-time settings to the calling thread: CPU of thread `index`, SCHED_FIFO
 * priority `priority` (0 = leave SCHED_OTHER). Exits the process with a clear message on failure. */
void rtv_setup_thread(rtv_ctx *ctx, int index, int priority);
/* The CPU thread `index` is pinned to, or -1 when no affinity was given. */
int rtv_thread_cpu(const rtv_ctx *ctx, int index);
/* The building blocks of rtv_setup_thread, for probes that place helper threads themselves. Both exit
 * with a clear message on failure; cpu < 0 and priority 0 leave the thread as it is. */
void rtv_pin_cpu(int cpu, const char *who);
void rtv_set_priority(int priority);
/* The first --affinity CPU, else the CPU the caller runs on: where single-CPU probes (kops...) run. */
int rtv_home_cpu(const rtv_ctx *ctx);

/* Cycle count at which a spinning thread whose first reading was `first` ends (UINT64_MAX: no duration). It
 * counts from the thread's own first read, not from the probe's start: a thread whose CPU is starved while the
 * probe sets up (a vCPU on an overloaded RTDS pCPU began spinning 1.2 s late; a 500 ms selftest on a host
 * loaded by TCG guests pushed nothing) still runs its whole duration. */
static inline uint64_t rtv_end_cycles(const rtv_ctx *ctx, uint64_t first) {
    if (!ctx->end_ns) return UINT64_MAX;
    return first + (uint64_t)((double)(ctx->end_ns - ctx->start_ns) * rtv_cycles_hz() / 1e9);
}

/* CLOCK_MONOTONIC time at which a periodic thread that began measuring at `start_ns` ends (UINT64_MAX: no
 * duration): like rtv_end_cycles it counts from the thread's own start, so a thread that got its CPU late (a CI
 * worker's timer thread joined 250 ms into a 300 ms run and took one sample) still measures its whole duration. */
static inline uint64_t rtv_end_ns(const rtv_ctx *ctx, uint64_t start_ns) {
    return ctx->end_ns ? start_ns + (ctx->end_ns - ctx->start_ns) : UINT64_MAX;
}

/* CLOCK_MONOTONIC time of a recent cycle-counter reading (for timestamps taken with rtv_cycles): counted from a
 * (cycles, CLOCK_MONOTONIC) pair of the calling thread's own, read again once it is over 10 ms old. The cycle
 * counter's rate is measured once against CLOCK_MONOTONIC_RAW, which NTP does not slew while it slews
 * CLOCK_MONOTONIC (the trace clock, other probes' clock) by up to 500 ppm: counted from the run's start, a
 * sample drifted by that much times the run's age (ms after a minute); from a fresh pair, by nanoseconds. */
uint64_t rtv_cycles_to_mono(uint64_t cycles);

/* Start `n` threads running fn(args + i * arg_size) and wait for all of them; exits on failure. */
void rtv_run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size);
/* Start one thread with a small locked stack (under mlockall every stack byte is resident). */
pthread_t rtv_spawn(void *(*fn)(void *), void *arg);

/* Die with a message (prefixed with the program name) and the given exit code. */
_Noreturn void rtv_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- used by the probe driver (probe_main.c) ---- */
int rtv_parse_options(const rtv_opt *const *tables, int ntables, int argc, char **argv);
void rtv_print_options(const rtv_opt *opts);
int rtv_cpulist_parse(const char *text, rtv_cpulist *out);
void rtv_ctx_start(rtv_ctx *ctx, const rtv_opt *const *tables, int ntables);
int rtv_ctx_finish(rtv_ctx *ctx, int probe_status);
void rtv_install_signal_handlers(void);
/* Start a thread that sends this process SIGTERM once stdin reaches its end (or hangs up). */
void rtv_watch_stdin(void);

#endif
