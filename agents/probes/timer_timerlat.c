/* timer --engine timerlat: wake-up latency measured by the kernel's timerlat tracer, split into
 * the IRQ part (timer expiry -> hrtimer handler) and the thread part (expiry -> the timerlat kernel
 * thread running). The tracer runs one kernel thread per CPU in osnoise/cpus with period
 * timerlat_period_us; we set its priority to --priority, read per_cpu/cpuN/trace_pipe (trace_clock
 * "mono", so timestamps are CLOCK_MONOTONIC), pair the IRQ and thread lines of each activation by
 * their sequence number and write one sample per activation: value = thread latency,
 * aux = IRQ latency, t_ns = the planned expiry (thread line time - thread latency; the trace time
 * stamps have microsecond resolution). The duration counts from the tracer's first activation; the
 * pipes are drained whole after every wait. Every tracefs setting we change is restored at the end. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "timer.h"

#define TRACEFS "/sys/kernel/tracing"

enum { STAT_UNPAIRED, STAT_LOST_EVENTS, STAT_OVERRUNS, STAT_RING_KB };
static const char *const stat_names[] = {"unpaired", "lost_events", "overruns", "ring_kb", NULL};

/* ---- tracefs files ---- */

static bool read_file(const char *name, char *buf, size_t size) {
    char path[256];
    snprintf(path, sizeof path, TRACEFS "/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) return false;
    buf[n] = 0;
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    return true;
}

/* Returns false with errno set when the file cannot be written. */
static bool write_file(const char *name, const char *value) {
    char path[256];
    snprintf(path, sizeof path, TRACEFS "/%s", name);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = write(fd, value, strlen(value)) >= 0;
    int saved_errno = errno;
    close(fd);
    errno = saved_errno;
    return ok;
}

static bool tracefs_ready(void) {
    struct stat st;
    if (stat(TRACEFS "/available_tracers", &st) == 0) return true;
    return mount("nodev", TRACEFS, "tracefs", 0, NULL) == 0 && stat(TRACEFS "/available_tracers", &st) == 0;
}

/* The selected value of a tracefs choice file such as trace_clock ("local [mono] global"). */
static void selected_choice(const char *text, char *out, size_t size) {
    const char *open_bracket = strchr(text, '['), *close_bracket = open_bracket ? strchr(open_bracket, ']') : NULL;
    if (!open_bracket || !close_bracket) {
        snprintf(out, size, "%s", text);
        return;
    }
    snprintf(out, size, "%.*s", (int)(close_bracket - open_bracket - 1), open_bracket + 1);
}

/* ---- validation: is the tracer there? ---- */

static int timerlat_validate(rtv_common *common) {
    char tracers[4096];
    if (!tracefs_ready())
        rtv_die(RTV_EXIT_USAGE, "'--engine timerlat' needs tracefs at " TRACEFS " and it could not be mounted (%s); "
                                "run as root, or use --engine cyclictest", strerror(errno));
    if (!read_file("available_tracers", tracers, sizeof tracers))
        rtv_die(RTV_EXIT_USAGE, "'--engine timerlat': cannot read " TRACEFS "/available_tracers (%s); run as root, "
                                "or use --engine cyclictest", strerror(errno));
    bool found = false;
    for (char *word = strtok(tracers, " \n"); word; word = strtok(NULL, " \n")) found |= !strcmp(word, "timerlat");
    if (!found) {
        read_file("available_tracers", tracers, sizeof tracers);
        rtv_die(RTV_EXIT_USAGE, "'--engine timerlat': this kernel offers no timerlat tracer (available_tracers: %s; "
                                "it needs CONFIG_TIMERLAT_TRACER); use --engine cyclictest", tracers);
    }
    if (common->affinity.count == 0) { /* one kernel thread per allowed CPU */
        cpu_set_t set;
        sched_getaffinity(0, sizeof set, &set);
        for (int cpu = 0; cpu < CPU_SETSIZE && common->affinity.count < RTV_MAX_CPUS; cpu++)
            if (CPU_ISSET(cpu, &set)) common->affinity.cpu[common->affinity.count++] = (uint16_t)cpu;
    }
    if (common->affinity.count > RTV_MAX_THREADS)
        rtv_die(RTV_EXIT_USAGE, "'--affinity': timerlat measures at most %d CPUs", RTV_MAX_THREADS);
    common->threads = (uint64_t)common->affinity.count; /* the samples of CPU list entry i go to thread i */
    return 0;
}

/* ---- the kernel threads' priority ---- */

static void set_kernel_thread_priority(int priority) {
    if (priority <= 0) return;
    DIR *proc = opendir("/proc");
    if (!proc) return;
    for (struct dirent *e; (e = readdir(proc));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], comm[64];
        snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        bool match = fgets(comm, sizeof comm, f) && !strncmp(comm, "timerlat/", 9);
        fclose(f);
        struct sched_param sp = {.sched_priority = priority};
        if (match && sched_setscheduler(atoi(e->d_name), SCHED_FIFO, &sp) != 0)
            fprintf(stderr, "rtvirt-agent: timerlat: cannot set priority %d on %s: %s\n", priority, comm,
                    strerror(errno));
    }
    closedir(proc);
}

/* ---- per-CPU readers ---- */

typedef struct {
    rtv_ctx *ctx;
    int index, cpu, fd; /* fd: the CPU's trace_pipe, opened before the readers start */
    uint64_t unpaired, lost, overruns, ring_kb; /* ring_kb: the CPU's ring as the kernel reported it in use */
} reader_arg;

/* One trace line: "<task>-<pid> [cpu] <flags> <secs>.<usecs>: #<seq> context <irq|thread> timer_latency <n> ns". */
static bool parse_line(const char *line, double *secs, unsigned *seq, char *context, uint64_t *latency) {
    const char *hash = strstr(line, ": #");
    if (!hash) return false;
    const char *start = hash;
    while (start > line && (isdigit((unsigned char)start[-1]) || start[-1] == '.')) start--;
    *secs = strtod(start, NULL);
    return sscanf(hash + 3, "%u context %15s timer_latency %" SCNu64 " ns", seq, context, latency) == 3;
}

/* Where one CPU's reader stands: the IRQ line waiting for its thread line, and the run's end on the trace. */
typedef struct {
    unsigned irq_seq;
    uint64_t irq_latency, taken;
    bool have_irq;
    uint64_t end_ns; /* planned expiries from here on are past the run (UINT64_MAX until the first sample) */
    uint64_t last_expiry;
    bool done;
} reader_state;

static void handle_line(reader_arg *a, const char *line, reader_state *st) {
    double secs;
    unsigned seq;
    char context[16];
    uint64_t latency;
    unsigned long long lost;
    if (strstr(line, "LOST") && sscanf(strstr(line, "LOST"), "LOST %llu EVENTS", &lost) == 1) {
        a->lost += lost;
        return;
    }
    if (!parse_line(line, &secs, &seq, context, &latency)) return;
    if (!strcmp(context, "irq")) {
        st->irq_seq = seq;
        st->irq_latency = latency;
        st->have_irq = true;
        return;
    }
    if (!st->have_irq || st->irq_seq != seq) { /* the IRQ line was lost: keep no half sample */
        a->unpaired++;
        return;
    }
    st->have_irq = false;
    uint64_t woke = (uint64_t)(secs * 1e9 + 0.5), expiry = woke - latency;
    rtv_ctx *ctx = a->ctx;
    /* The run's duration counts from the tracer's first activation, as a cyclictest thread's counts from the
     * period it joined at: setting up the tracer (its kernel threads start under a loaded vCPU) is not measured,
     * and every period of the duration is then a sample or an activation the tracer skipped. */
    if (st->end_ns == UINT64_MAX) st->end_ns = rtv_end_ns(ctx, expiry);
    /* the tracer skips the periods that passed while an activation was late (the cyclictest engine's overruns),
     * up to the run's end: every period of the duration is a sample or an overrun (a lost event would show as
     * a gap too; those are counted apart, lost_events) */
    const uint64_t period = timer_opt.interval_ns;
    const bool past = expiry + period / 2 >= st->end_ns; /* (expiries are read to the microsecond) */
    const uint64_t upto = past ? st->end_ns : expiry;
    if (st->taken && upto > st->last_expiry + period + period / 2)
        a->overruns += (upto - st->last_expiry + period / 2) / period - 1;
    if (past) {
        st->done = true;
        return;
    }
    st->last_expiry = expiry;
    rtv_sample(ctx, a->index, expiry, (int64_t)latency, st->irq_latency, a->cpu, 0);
    st->taken++;
    if (ctx->common.loops && st->taken >= ctx->common.loops) st->done = true;
}

/* Read the pipe until it is empty (or the run's end was read): each read returns at most one page of text (the
 * kernel formats trace_pipe a page at a time), about 20 activations, so reading once per wait kept up with
 * 200 activations a second, and a 1 kHz run stored its first fifth only. Returns whether it read anything. */
static bool drain(reader_arg *a, char *buf, size_t size, size_t *used, reader_state *st) {
    bool read_any = false;
    while (!st->done) {
        ssize_t n = read(a->fd, buf + *used, size - 1 - *used);
        if (n <= 0) break; /* EAGAIN: empty for now */
        read_any = true;
        *used += (size_t)n;
        buf[*used] = 0;
        char *line = buf, *newline;
        while (!st->done && (newline = strchr(line, '\n'))) {
            *newline = 0;
            handle_line(a, line, st);
            line = newline + 1;
        }
        *used = (size_t)(buf + *used - line);
        memmove(buf, line, *used);
        if (*used == size - 1) *used = 0; /* a line longer than the buffer is not ours */
    }
    return read_any;
}

/* How long after its end a run still waits for the tracer's lines of its last activations (a starved vCPU
 * formats and hands them over late). */
#define END_GRACE_NS 2000000000ull

static void *reader(void *p) {
    reader_arg *a = p;
    rtv_ctx *ctx = a->ctx;
    char buf[8192];
    size_t used = 0;
    reader_state st = {.end_ns = UINT64_MAX};
    while (!st.done && !rtv_signalled()) {
        /* Wait between drains, whatever poll() says: on kernels such as 6.1 poll() on a trace_pipe waits for
         * the buffer to be buffer_percent (default 50 %) full, which a run of a few seconds never reaches. The
         * pipe is non-blocking; the kernel's ring holds what comes meanwhile. */
        if (!drain(a, buf, sizeof buf, &used, &st)) {
            uint64_t deadline = st.end_ns != UINT64_MAX ? st.end_ns : ctx->end_ns ? ctx->end_ns : UINT64_MAX;
            if (deadline != UINT64_MAX && rtv_now_ns() >= deadline + END_GRACE_NS) break; /* the tracer fell silent */
            struct pollfd pfd = {.fd = a->fd, .events = POLLIN};
            poll(&pfd, 1, 100);
        }
    }
    close(a->fd);
    rtv_stat(ctx, a->index, STAT_UNPAIRED, (int64_t)a->unpaired);
    rtv_stat(ctx, a->index, STAT_LOST_EVENTS, (int64_t)a->lost);
    rtv_stat(ctx, a->index, STAT_OVERRUNS, (int64_t)a->overruns);
    rtv_stat(ctx, a->index, STAT_RING_KB, (int64_t)a->ring_kb);
    return NULL;
}

/* ---- run: configure, read, restore ---- */

static const char *const saved_files[] = {"current_tracer", "trace_clock", "buffer_size_kb", "osnoise/cpus",
                                          "osnoise/timerlat_period_us", "osnoise/stop_tracing_us",
                                          "osnoise/stop_tracing_total_us", "tracing_on"};
enum { NSAVED = sizeof saved_files / sizeof saved_files[0] };
static char saved[NSAVED][512];

/* The top-level ring's size per CPU for a run at ``interval_ns``: 4 s of activations (two events of under 48 bytes
 * each), at least the kernel's default 1408 KiB. Set, not left as found: kernels such as 6.1 expand the top-level
 * ring from its boot size (7 KiB) only while no instance was ever resized, so once the guest layer's instance was
 * (an explained run), the tracer wrote into 7 KiB and lost activations whenever its reader was late (113 events
 * lost in a 3 s run under CI's load). */
static unsigned long ring_kb(uint64_t interval_ns) {
    const uint64_t bytes = 2 * 48 * (4000000000ull / (interval_ns ? interval_ns : 1));
    const uint64_t kb = (bytes + 1023) / 1024;
    return kb > 1408 ? (unsigned long)kb : 1408;
}

static void restore_tracefs(void) {
    write_file("current_tracer", "nop");
    for (int i = 0; i < NSAVED; i++)
        if (saved[i][0]) write_file(saved_files[i], saved[i]);
}

/* Leave tracefs as we found it before reporting any failure. */
_Noreturn static void fail(const char *what, const char *detail) {
    int err = errno;
    restore_tracefs();
    rtv_die(RTV_EXIT_FAILURE, "timerlat: cannot %s%s: %s", what, detail, strerror(err));
}

static int timerlat_run(rtv_ctx *ctx) {
    rtv_common *c = &ctx->common;
    for (int i = 0; i < NSAVED; i++) {
        char raw[4096];
        if (!read_file(saved_files[i], raw, sizeof raw)) raw[0] = 0;
        selected_choice(raw, saved[i], sizeof saved[i]);
        if (!strcmp(saved_files[i], "buffer_size_kb")) saved[i][strspn(saved[i], "0123456789")] = 0; /* "7 (expanded: 1408)" */
    }
    char cpus[4 * RTV_MAX_CPUS + 1] = "", period[32];
    for (int i = 0; i < c->affinity.count; i++) {
        size_t len = strlen(cpus);
        snprintf(cpus + len, sizeof cpus - len, i ? ",%u" : "%u", c->affinity.cpu[i]);
    }
    snprintf(period, sizeof period, "%" PRIu64, timer_opt.interval_ns / 1000);
    char ring[32];
    snprintf(ring, sizeof ring, "%lu", ring_kb(timer_opt.interval_ns));
    const char *const settings[][2] = {
        {"current_tracer", "nop"}, {"trace_clock", "mono"}, {"buffer_size_kb", ring}, {"osnoise/cpus", cpus},
        {"osnoise/timerlat_period_us", period}, {"osnoise/stop_tracing_us", "0"},
        {"osnoise/stop_tracing_total_us", "0"}, {"trace", ""} /* empties the buffer */, {"tracing_on", "1"},
    };
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
        if (!write_file(settings[i][0], settings[i][1])) fail("set tracefs ", settings[i][0]);

    /* The tracer first, its pipes after: the kernel refuses to change the tracer (EBUSY) while any trace_pipe
     * of the instance is open. Nothing is lost meanwhile: the ring buffer keeps the first activations until
     * the pipes are read. */
    if (!write_file("current_tracer", "timerlat")) fail("start the tracer", "");
    reader_arg args[RTV_MAX_THREADS];
    for (int i = 0; i < c->affinity.count; i++) {
        char path[128];
        snprintf(path, sizeof path, TRACEFS "/per_cpu/cpu%u/trace_pipe", c->affinity.cpu[i]);
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            while (i-- > 0) close(args[i].fd); /* open pipes would keep the tracer from being switched off */
            errno = err;
            fail("open ", path);
        }
        char ring_path[64], ring_text[64] = "";
        snprintf(ring_path, sizeof ring_path, "per_cpu/cpu%u/buffer_size_kb", c->affinity.cpu[i]);
        read_file(ring_path, ring_text, sizeof ring_text);
        args[i] = (reader_arg){.ctx = ctx, .index = i, .cpu = c->affinity.cpu[i], .fd = fd,
                               .ring_kb = strtoull(ring_text, NULL, 10)};
    }
    set_kernel_thread_priority((int)c->priority);
    rtv_run_threads(c->affinity.count, reader, args, sizeof args[0]);
    restore_tracefs();
    return 0;
}

const rtv_probe timer_timerlat_engine = {
    .name = "timer",
    .summary = "periodic wake-up latency (kernel timerlat tracer: thread and IRQ parts)",
    .opts = NULL, /* the timer probe's table, already parsed */
    .value_field = "latency_ns",
    .aux_field = "irq_latency_ns",
    .kind_names = (const char *const[]){"wakeup", NULL},
    .stat_names = stat_names,
    .validate = timerlat_validate,
    .run = timerlat_run,
};
