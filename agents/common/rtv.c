#define _GNU_SOURCE
#include "rtv.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

atomic_int rtv_stop_requested;

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&rtv_stop_requested, 1);
}

void rtv_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: sleeps return EINTR so threads notice at once */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

_Noreturn void rtv_die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rtvirt-agent: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

bool rtv_sleep_until(rtv_ctx *ctx, uint64_t t_ns) {
    struct timespec ts = rtv_ts(t_ns);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        if (rtv_should_stop(ctx)) return false;
    return !rtv_signalled();
}

void rtv_clock_and_cycles(clockid_t clock, uint64_t *ns, uint64_t *cycles) {
    /* A preemption between the two reads pairs a cycle count with a later time: on an RTDS vCPU out of
     * budget that is 16 ms, and a 50 ms calibration read the TSC 24 % slow (seen in the nested Xen lab).
     * The tightest of eight tries is one no preemption split. */
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 8; i++) {
        struct timespec ts;
        uint64_t before = rtv_cycles();
        clock_gettime(clock, &ts);
        uint64_t after = rtv_cycles();
        if (after - before < best) {
            best = after - before;
            *ns = (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
            *cycles = before + (after - before) / 2;
        }
    }
}

double rtv_cycles_hz(void) {
    static double hz;
    if (hz > 0) return hz;
#if defined(__aarch64__)
    uint64_t frequency;
    __asm__ __volatile__("mrs %0, cntfrq_el0" : "=r"(frequency));
    if (frequency) return hz = (double)frequency;
#endif
    uint64_t ns0, c0, ns1, c1;
    rtv_clock_and_cycles(CLOCK_MONOTONIC_RAW, &ns0, &c0);
    struct timespec pause = {0, 50 * 1000 * 1000};
    while (nanosleep(&pause, &pause) == EINTR) {}
    rtv_clock_and_cycles(CLOCK_MONOTONIC_RAW, &ns1, &c1);
    hz = (double)(c1 - c0) * 1e9 / (double)(ns1 - ns0);
    return hz;
}

uint64_t rtv_cycles_to_mono(uint64_t cycles) {
    static __thread uint64_t anchor_cycles, anchor_ns;
    const double hz = rtv_cycles_hz();
    if (!anchor_ns || cycles - anchor_cycles > (uint64_t)(hz / 100)) { /* over 10 ms old (or before it) */
        uint64_t before = rtv_cycles(), ns = rtv_now_ns(), after = rtv_cycles();
        /* a pair split by a preemption would shift the next 10 ms of times: keep the old one then */
        if (!anchor_ns || after - before < (uint64_t)(hz / 1e6) + 1) {
            anchor_cycles = before + (after - before) / 2;
            anchor_ns = ns;
        }
    }
    return anchor_ns + (uint64_t)((double)(int64_t)(cycles - anchor_cycles) * 1e9 / hz);
}

/* ---------------- options ---------------- */

int rtv_cpulist_parse(const char *text, rtv_cpulist *out) {
    out->count = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long lo = strtoul(p, &end, 10);
        if (end == p || errno) return -1;
        unsigned long hi = lo;
        p = end;
        if (*p == '-') {
            hi = strtoul(p + 1, &end, 10);
            if (end == p + 1 || errno || hi < lo) return -1;
            p = end;
        }
        if (hi >= RTV_MAX_CPUS) return -1;
        for (unsigned long c = lo; c <= hi; c++) {
            if (out->count >= RTV_MAX_CPUS) return -1;
            out->cpu[out->count++] = (uint16_t)c;
        }
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return out->count > 0 ? 0 : -1;
}

static const rtv_opt *find_opt(const rtv_opt *const *tables, int ntables, const char *name, size_t len) {
    for (int t = 0; t < ntables; t++)
        for (const rtv_opt *o = tables[t]; o->name; o++)
            if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

static int set_opt(const rtv_opt *o, const char *val) {
    char *end;
    switch (o->type) {
    case RTV_OPT_U64:
    case RTV_OPT_NS: {
        if (!val || !*val || *val == '-') return -1;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (*end || errno || v < o->min || v > o->max) return -1;
        *(uint64_t *)o->dest = v;
        return 0;
    }
    case RTV_OPT_BOOL:
        if (!val || !strcmp(val, "1") || !strcmp(val, "true")) *(bool *)o->dest = true;
        else if (!strcmp(val, "0") || !strcmp(val, "false")) *(bool *)o->dest = false;
        else return -1;
        return 0;
    case RTV_OPT_CPUS:
        return val ? rtv_cpulist_parse(val, (rtv_cpulist *)o->dest) : -1;
    case RTV_OPT_STR:
        if (!val) return -1;
        *(const char **)o->dest = val;
        return 0;
    }
    return -1;
}

/* Options are only ever `--name=value` or `--name` (bool): the Python CLI validates and renders them. */
int rtv_parse_options(const rtv_opt *const *tables, int ntables, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) rtv_die(RTV_EXIT_USAGE, "unexpected argument '%s'", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const rtv_opt *o = find_opt(tables, ntables, name, len);
        if (!o) rtv_die(RTV_EXIT_USAGE, "unknown option '--%.*s'", (int)len, name);
        if (set_opt(o, eq ? eq + 1 : NULL) != 0)
            rtv_die(RTV_EXIT_USAGE, "invalid value for '--%s': '%s' (%s; range %" PRIu64 "..%" PRIu64 ")",
                    o->name, eq ? eq + 1 : "", o->help, o->min, o->max);
    }
    return 0;
}

void rtv_print_options(const rtv_opt *opts) {
    for (const rtv_opt *o = opts; o->name; o++) fprintf(stderr, "  --%-18s %s\n", o->name, o->help);
}

/* ---------------- JSON header ---------------- */

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *s, const char *text, size_t n) {
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->buf = realloc(s->buf, s->cap);
        if (!s->buf) rtv_die(RTV_EXIT_FAILURE, "out of memory");
    }
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    s->buf[s->len] = 0;
}
#define SB_LIT(s, lit) sb_put((s), (lit), sizeof(lit) - 1)
static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(s, tmp, (size_t)(n < (int)sizeof tmp ? n : (int)sizeof tmp - 1));
}
/* Strings from the system (hostname, kernel) are escaped and bounded. */
static void sb_json_str(sbuf *s, const char *str) {
    sb_put(s, "\"", 1);
    for (size_t i = 0; str && str[i] && i < 256; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(s, e, 2);
        } else if (c < 0x20 || c >= 0x7f) {
            sb_printf(s, "\\u%04x", c);
        } else {
            sb_put(s, (const char *)&c, 1);
        }
    }
    sb_put(s, "\"", 1);
}
static void sb_names(sbuf *s, const char *const *names) {
    sb_put(s, "[", 1);
    for (int i = 0; names && names[i]; i++) {
        if (i) sb_put(s, ",", 1);
        sb_json_str(s, names[i]);
    }
    sb_put(s, "]", 1);
}

static void sb_params(sbuf *s, const rtv_opt *const *tables, int ntables) {
    sb_put(s, "{", 1);
    int first = 1;
    for (int t = 0; t < ntables; t++) {
        for (const rtv_opt *o = tables[t]; o->name; o++) {
            if (!first) sb_put(s, ",", 1);
            first = 0;
            sb_json_str(s, o->name);
            sb_put(s, ":", 1);
            switch (o->type) {
            case RTV_OPT_U64:
            case RTV_OPT_NS: sb_printf(s, "%" PRIu64, *(uint64_t *)o->dest); break;
            case RTV_OPT_BOOL: sb_printf(s, "%s", *(bool *)o->dest ? "true" : "false"); break;
            case RTV_OPT_STR: sb_json_str(s, *(const char **)o->dest); break;
            case RTV_OPT_CPUS: {
                const rtv_cpulist *l = o->dest;
                sb_put(s, "[", 1);
                for (int i = 0; i < l->count; i++) sb_printf(s, i ? ",%u" : "%u", l->cpu[i]);
                sb_put(s, "]", 1);
                break;
            }
            }
        }
    }
    sb_put(s, "}", 1);
}

static int write_fully(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The stream goes to the output and, when --tee is given, to the copy as well. Once the output is
 * gone (its reader disconnected), the copy alone carries on and the run is stopped: the copy then
 * holds every sample, for the controller to fetch after it reconnects. */
static void write_all(rtv_ctx *ctx, const void *data, size_t n) {
    if (ctx->tee_fd >= 0 && write_fully(ctx->tee_fd, data, n) != 0) {
        /* the copy is the spare: while the output works, the run goes on without it */
        if (ctx->out_broken)
            rtv_die(RTV_EXIT_FAILURE, "cannot write the stream copy '%s': %s", ctx->common.tee, strerror(errno));
        fprintf(stderr, "rtvirt-agent: the stream copy '%s' stopped: %s\n", ctx->common.tee, strerror(errno));
        close(ctx->tee_fd);
        ctx->tee_fd = -1;
    }
    if (ctx->out_broken) return;
    if (write_fully(ctx->out_fd, data, n) != 0) {
        if (ctx->tee_fd < 0) rtv_die(RTV_EXIT_FAILURE, "cannot write the sample stream: %s", strerror(errno));
        ctx->out_broken = true;
        atomic_store(&rtv_stop_requested, 1);
    }
}

static void *watch_stdin_main(void *arg) {
    (void)arg;
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stops, NULL); /* the stop request is handled by the other threads */
    char buf[256];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    kill(getpid(), SIGTERM);
    return NULL;
}

void rtv_watch_stdin(void) {
    pthread_t tid = rtv_spawn(watch_stdin_main, NULL);
    pthread_detach(tid);
}

static void write_header(rtv_ctx *ctx, const rtv_opt *const *tables, int ntables) {
    struct utsname u;
    uname(&u);
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    sbuf s = {0};
    sb_printf(&s, "{\"format\":%u,\"probe\":", RTV_STREAM_VERSION);
    sb_json_str(&s, ctx->probe->name);
    SB_LIT(&s, ",\"value_field\":");
    sb_json_str(&s, ctx->probe->value_field);
    SB_LIT(&s, ",\"aux_field\":");
    if (ctx->probe->aux_field) sb_json_str(&s, ctx->probe->aux_field);
    else SB_LIT(&s, "null");
    SB_LIT(&s, ",\"kinds\":");
    sb_names(&s, ctx->probe->kind_names);
    SB_LIT(&s, ",\"stats\":");
    sb_names(&s, ctx->probe->stat_names);
    SB_LIT(&s, ",\"params\":");
    sb_params(&s, tables, ntables);
    sb_printf(&s, ",\"clock\":\"CLOCK_MONOTONIC\",\"start_monotonic_ns\":%" PRIu64
                  ",\"start_realtime_ns\":%" PRIu64 ",\"cycles_hz\":%.0f",
              ctx->start_ns, (uint64_t)real.tv_sec * UINT64_C(1000000000) + (uint64_t)real.tv_nsec, rtv_cycles_hz());
    sb_printf(&s, ",\"rt\":{\"fifo\":%s,\"mlockall\":%s,\"cpu_dma_latency\":%s}",
              ctx->rt_ok && ctx->common.priority ? "true" : "false", ctx->rt_ok && ctx->common.mlock ? "true" : "false",
              ctx->dma_fd >= 0 ? "0" : "null");
    SB_LIT(&s, ",\"host\":{\"hostname\":");
    sb_json_str(&s, u.nodename);
    SB_LIT(&s, ",\"kernel\":");
    sb_json_str(&s, u.release);
    SB_LIT(&s, ",\"version\":");
    sb_json_str(&s, u.version);
    SB_LIT(&s, ",\"machine\":");
    sb_json_str(&s, u.machine);
    sb_printf(&s, ",\"cpus\":%ld}}", sysconf(_SC_NPROCESSORS_ONLN));

    uint32_t version = RTV_STREAM_VERSION, len = (uint32_t)s.len;
    size_t pad = (8 - (16 + s.len) % 8) % 8; /* records start 8-byte aligned */
    char zeros[8] = {0};
    write_all(ctx, RTV_STREAM_MAGIC, 8);
    write_all(ctx, &version, 4);
    write_all(ctx, &len, 4);
    write_all(ctx, s.buf, s.len);
    write_all(ctx, zeros, pad);
    free(s.buf);
}

/* ---------------- rings and writer ---------------- */

static atomic_int writer_quit;
/* The writer's pause ends early when the run finishes (rtv_ctx_finish), so a long pause does not delay it. */
static pthread_mutex_t writer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t writer_wake;

static void writer_pause(uint64_t ns) {
    struct timespec until = rtv_ts(rtv_now_ns() + ns);
    pthread_mutex_lock(&writer_lock);
    while (!atomic_load(&writer_quit) && pthread_cond_timedwait(&writer_wake, &writer_lock, &until) == 0) {}
    pthread_mutex_unlock(&writer_lock);
}

static size_t drain(rtv_ctx *ctx, rtv_record *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < ctx->nrings && n < cap; i++) {
        rtv_ring *r = &ctx->rings[i];
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
        while (tail != head && n < cap) out[n++] = r->buf[tail++ & r->mask];
        atomic_store_explicit(&r->tail, tail, memory_order_release);
    }
    return n;
}

/* The writer is the instrument's own noise: keep it off the measured CPUs when others are usable. */
static void keep_writer_off_measured_cpus(const rtv_ctx *ctx) {
    cpu_set_t set;
    if (!ctx->common.affinity.count || sched_getaffinity(0, sizeof set, &set) != 0) return;
    for (int i = 0; i < ctx->common.affinity.count; i++) CPU_CLR(ctx->common.affinity.cpu[i], &set);
    if (CPU_COUNT(&set) > 0) pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *writer_main(void *arg) {
    rtv_ctx *ctx = arg;
    enum { CHUNK = 32768 };
    keep_writer_off_measured_cpus(ctx);
    rtv_record *batch = malloc(CHUNK * sizeof *batch);
    if (!batch) rtv_die(RTV_EXIT_FAILURE, "out of memory");
    uint64_t last_ns = rtv_now_ns(); /* start of the interval whose records the next drain collects */
    for (;;) {
        int quitting = atomic_load(&writer_quit);
        size_t n = drain(ctx, batch, CHUNK);
        if (n) {
            write_all(ctx, batch, n * sizeof *batch);
            for (size_t i = 0; i < n; i++) ctx->written += !(batch[i].flags & RTV_FLAG_META);
        } else if (quitting) {
            break;
        }
        /* A partial batch means the rings are nearly empty: pause for as long as the rate just seen
         * takes to fill an eighth of a ring (1 ms at 8 M samples/s, which leaves 8,000 records per ring
         * of the default 65,536; 250 ms at most). A slow probe (a 1 kHz timer) then writes 4 times a
         * second, as often as rtvirt reads: each wake-up is a timer interrupt and a context switch (inside
         * a VM, exits), and each write(2) to a file on ext4 dirties its inode and journal. At a 20 ms cap
         * (50 writes a second) the timer probe's mean wake-up latency was 4-10 % above cyclictest's
         * beside it on this project's VM; at 250 ms it is at or below (docs/sample-stream.md). */
        if (n < CHUNK / 8 && !quitting) {
            uint64_t now = rtv_now_ns(), pause_ns = 250 * 1000 * 1000;
            if (n && now > last_ns) {
                uint64_t fill_ns = (uint64_t)((double)(ctx->rings[0].mask + 1) / 8 * (double)(now - last_ns) / (double)n);
                if (fill_ns < pause_ns) pause_ns = fill_ns < 1000 * 1000 ? 1000 * 1000 : fill_ns;
            }
            last_ns = now;
            writer_pause(pause_ns);
        } else {
            last_ns = rtv_now_ns();
        }
    }
    free(batch);
    return NULL;
}

void rtv_stat(rtv_ctx *ctx, int thread, int key, int64_t value) {
    rtv_record rec = {.value = value, .aux = (uint64_t)key, .thread = (uint16_t)thread,
                      .kind = RTV_META_STAT, .flags = RTV_FLAG_META, .t_ns = rtv_now_ns()};
    /* End-of-run statistics may wait for ring space (up to ~1 s): measuring is over, losing them is not. */
    rtv_ring *r = &ctx->rings[thread];
    for (int tries = 0; tries < 10000; tries++) {
        uint64_t used = atomic_load(&r->head) - atomic_load(&r->tail);
        if (used <= r->mask) break;
        struct timespec pause = {0, 100 * 1000};
        nanosleep(&pause, NULL);
    }
    rtv_push(ctx, thread, &rec);
}

/* ---------------- real-time setup ---------------- */

int rtv_thread_cpu(const rtv_ctx *ctx, int index) {
    const rtv_cpulist *a = &ctx->common.affinity;
    return a->count ? a->cpu[index % a->count] : -1;
}

void rtv_pin_cpu(int cpu, const char *who) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (err) rtv_die(RTV_EXIT_USAGE, "cannot run %s on CPU %d: %s (does that CPU exist and is it allowed?)", who, cpu,
                     strerror(err));
}

void rtv_set_priority(int priority) {
    if (priority <= 0) return;
    struct sched_param sp = {.sched_priority = priority};
    int err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
    if (err) rtv_die(RTV_EXIT_USAGE,
                     "cannot set SCHED_FIFO priority %d: %s (run as root or with CAP_SYS_NICE, or use --no-rt)",
                     priority, strerror(err));
}

void rtv_setup_thread(rtv_ctx *ctx, int index, int priority) {
    char who[32];
    snprintf(who, sizeof who, "thread %d", index);
    rtv_pin_cpu(rtv_thread_cpu(ctx, index), who);
    rtv_set_priority(priority);
}

int rtv_home_cpu(const rtv_ctx *ctx) {
    int cpu = rtv_thread_cpu(ctx, 0);
    return cpu >= 0 ? cpu : sched_getcpu();
}

pthread_t rtv_spawn(void *(*fn)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t tid;
    int err = pthread_create(&tid, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (err) rtv_die(RTV_EXIT_FAILURE, "cannot start a thread: %s", strerror(err));
    return tid;
}

void rtv_run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size) {
    pthread_t tids[RTV_MAX_THREADS];
    for (int i = 0; i < n; i++) tids[i] = rtv_spawn(fn, (char *)args + (size_t)i * arg_size);
    for (int i = 0; i < n; i++) pthread_join(tids[i], NULL);
}

/* A device (a guest's virtio-serial port or disk) must exist: created as a plain file under /dev, the stream
 * would never leave the machine. Files are created, or emptied. */
static int creating(const char *path) {
    return strncmp(path, "/dev/", 5) == 0 ? 0 : O_CREAT | O_TRUNC;
}

static int hold_dma_latency(void) {
    int fd = open("/dev/cpu_dma_latency", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int32_t zero = 0;
    if (write(fd, &zero, sizeof zero) != sizeof zero) {
        close(fd);
        return -1;
    }
    return fd; /* the request holds while the fd stays open */
}

void rtv_ctx_start(rtv_ctx *ctx, const rtv_opt *const *tables, int ntables) {
    rtv_common *c = &ctx->common;
    ctx->dma_fd = -1;
    ctx->rt_ok = true;
    if (c->mlock && mlockall(MCL_CURRENT | MCL_FUTURE) != 0)
        rtv_die(RTV_EXIT_USAGE, "mlockall failed: %s (run as root or raise RLIMIT_MEMLOCK, or use --no-rt)",
                strerror(errno));
    if (c->priority > 0) {
        /* Probe the privilege once up front so the failure is reported before any output exists. */
        struct sched_param sp = {.sched_priority = (int)c->priority};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
            rtv_die(RTV_EXIT_USAGE,
                    "cannot set SCHED_FIFO priority %d: %s (run as root or with CAP_SYS_NICE, or use --no-rt)",
                    (int)c->priority, strerror(errno));
        sp.sched_priority = 0;
        sched_setscheduler(0, SCHED_OTHER, &sp); /* main and writer threads stay non-RT */
    }
    if (c->dma_latency) ctx->dma_fd = hold_dma_latency();

    if (strcmp(c->out, "-") == 0) ctx->out_fd = STDOUT_FILENO;
    else {
        ctx->out_fd = open(c->out, O_WRONLY | creating(c->out) | O_CLOEXEC, 0644);
        if (ctx->out_fd < 0) rtv_die(RTV_EXIT_USAGE, "cannot open output '%s': %s", c->out, strerror(errno));
    }
    ctx->confirm_fd = -1;
    if (c->confirm && *c->confirm) { /* opened now: a FIFO's writer can only open it once a reader has */
        ctx->confirm_fd = open(c->confirm, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (ctx->confirm_fd < 0)
            rtv_die(RTV_EXIT_USAGE, "cannot open the confirmation channel '%s': %s", c->confirm, strerror(errno));
    }
    ctx->tee_fd = -1;
    if (c->tee && *c->tee) {
        ctx->tee_fd = open(c->tee, O_WRONLY | creating(c->tee) | O_CLOEXEC, 0644);
        if (ctx->tee_fd < 0) rtv_die(RTV_EXIT_USAGE, "cannot open the stream copy '%s': %s", c->tee, strerror(errno));
    }
    if (c->watch_stdin) rtv_watch_stdin();

    ctx->nrings = (int)c->threads;
    ctx->rings = calloc((size_t)ctx->nrings, sizeof *ctx->rings);
    if (!ctx->rings) rtv_die(RTV_EXIT_FAILURE, "out of memory");
    for (int i = 0; i < ctx->nrings; i++) {
        ctx->rings[i].mask = (1ull << c->ring_order) - 1;
        ctx->rings[i].buf = calloc(1ull << c->ring_order, sizeof(rtv_record)); /* calloc + mlockall: pre-faulted */
        if (!ctx->rings[i].buf) rtv_die(RTV_EXIT_FAILURE, "out of memory for the sample rings");
        memset(ctx->rings[i].buf, 0, (1ull << c->ring_order) * sizeof(rtv_record));
    }
    rtv_cycles_hz(); /* calibrate before the clocks are paired */
    rtv_clock_and_cycles(CLOCK_MONOTONIC, &ctx->start_ns, &ctx->start_cycles);
    ctx->end_ns = c->duration_ns ? ctx->start_ns + c->duration_ns : 0;
    write_header(ctx, tables, ntables);
    pthread_condattr_t monotonic;  /* writer_pause counts on CLOCK_MONOTONIC, as every time here */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&writer_wake, &monotonic);
    pthread_condattr_destroy(&monotonic);
    if (pthread_create(&ctx->writer, NULL, writer_main, ctx) != 0)
        rtv_die(RTV_EXIT_FAILURE, "cannot start the writer thread");
}

/* The end-of-stream handshake (docs/sample-stream.md): a guest powers off when its agent ends, so the agent
 * waits, bounded, until the host says how many data records it holds, and says on stderr (the guest's
 * console) whether that is every record it wrote. The host's word is untrusted: one bounded line. */
static void await_confirmation(rtv_ctx *ctx) {
    char line[96];
    size_t used = 0;
    uint64_t deadline = rtv_now_ns() + ctx->common.confirm_timeout_ns;
    for (;;) {
        uint64_t now = rtv_now_ns();
        if (now >= deadline) break;
        struct pollfd p = {.fd = ctx->confirm_fd, .events = POLLIN};
        uint64_t left_ms = (deadline - now) / 1000000 + 1;
        int ready = poll(&p, 1, left_ms > 100 ? 100 : (int)left_ms);
        if (ready < 0 && errno != EINTR) break;
        ssize_t n = 0;
        if (ready > 0 && (p.revents & POLLIN)) n = read(ctx->confirm_fd, line + used, sizeof line - 1 - used);
        if (n <= 0) { /* nothing yet, or the host side is not connected (POLLHUP): wait on */
            if (ready > 0 && !(p.revents & POLLIN)) {
                struct timespec pause = {0, 10 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
            continue;
        }
        used += (size_t)n;
        line[used] = 0;
        char *newline = strchr(line, '\n');
        if (!newline && used < sizeof line - 1) continue;
        if (newline) *newline = 0;
        unsigned long long held;
        char tail;
        if (sscanf(line, "RTVIRT-ACK %llu%c", &held, &tail) != 1) {
            fprintf(stderr, "RTVIRT-DELIVERY unreadable %" PRIu64 "\n", ctx->written);
        } else if (held == ctx->written) {
            fprintf(stderr, "RTVIRT-DELIVERY confirmed %" PRIu64 "\n", ctx->written);
        } else {
            fprintf(stderr, "RTVIRT-DELIVERY short %" PRIu64 " %llu\n", ctx->written, held);
        }
        close(ctx->confirm_fd);
        return;
    }
    fprintf(stderr, "RTVIRT-DELIVERY unconfirmed %" PRIu64 "\n", ctx->written);
    close(ctx->confirm_fd);
}

int rtv_ctx_finish(rtv_ctx *ctx, int probe_status) {
    pthread_mutex_lock(&writer_lock);
    atomic_store(&writer_quit, 1);
    pthread_cond_signal(&writer_wake);
    pthread_mutex_unlock(&writer_lock);
    pthread_join(ctx->writer, NULL);
    /* Trailer: per-thread drops, then END. Written directly: the writer has stopped. */
    for (int i = 0; i < ctx->nrings; i++) {
        rtv_record d = {.t_ns = rtv_now_ns(), .value = (int64_t)atomic_load(&ctx->rings[i].dropped),
                        .thread = (uint16_t)i, .kind = RTV_META_DROPPED, .flags = RTV_FLAG_META};
        write_all(ctx, &d, sizeof d);
    }
    rtv_end_reason reason = probe_status != 0            ? RTV_END_ERROR
                            : atomic_load(&rtv_stop_requested) ? RTV_END_SIGNAL
                                                              : RTV_END_COMPLETE;
    rtv_record end = {.t_ns = rtv_now_ns(), .value = (int64_t)ctx->written, .aux = reason,
                      .kind = RTV_META_END, .flags = RTV_FLAG_META};
    write_all(ctx, &end, sizeof end);
    if (ctx->out_fd != STDOUT_FILENO) {
        fsync(ctx->out_fd); /* a file: on disk; a device or pipe: EINVAL, nothing to do */
        close(ctx->out_fd);
    }
    if (ctx->tee_fd >= 0) {
        fsync(ctx->tee_fd); /* a guest's disk: on the host before the guest powers off */
        close(ctx->tee_fd);
    }
    if (ctx->confirm_fd >= 0) await_confirmation(ctx);
    if (ctx->dma_fd >= 0) close(ctx->dma_fd);
    return probe_status;
}
