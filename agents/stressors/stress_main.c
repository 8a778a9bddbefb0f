/* rtvirt-stress NAME [--option=value ...]: run one stressor until the deadline or a signal. On
 * stdout: one JSON line once every worker is started, one JSON summary line at the end.
 *
 * Stopping: SIGINT/SIGTERM/SIGHUP, and SIGUSR2 (a worker failed), are blocked in every thread and taken by
 * the main thread with sigtimedwait, so the stop decision has one owner. It then raises the stop flag and
 * pokes every worker with SIGUSR1 (a no-op handler without SA_RESTART) so sleeping workers return at once.
 * Between start and stop the main thread sleeps without waking: at SCHED_FIFO 99 and unpinned, a periodic
 * wake-up would preempt whatever another CPU runs (the host explanation found it, every 100 ms, holding
 * the measured CPU beside a stressor pinned to the other one). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "stressors.h"

#define RTV_STRESSOR_ENTRY(name) &rtv_stressor_##name,
static const rtv_stressor *const stressors[] = {RTV_STRESSOR_LIST(RTV_STRESSOR_ENTRY)};
#undef RTV_STRESSOR_ENTRY
#define NSTRESSORS (sizeof stressors / sizeof stressors[0])

static rtv_stress stress;

static const rtv_opt common_opts[] = {
    {"workers", RTV_OPT_U64, &stress.workers, 0, RTV_STRESS_MAX_WORKERS,
     "worker threads, 0 = one per CPU of --cpus (or per online CPU)"},
    {"cpus", RTV_OPT_CPUS, &stress.ctx.common.affinity, 0, 0, "CPU list; worker i runs on the i-th (cycling)"},
    {"duration", RTV_OPT_NS, &stress.ctx.common.duration_ns, 0, UINT64_MAX, "run time in ns, 0 = until signalled"},
    {"priority", RTV_OPT_U64, &stress.ctx.common.priority, 0, 99, "SCHED_FIFO priority, 0 = SCHED_OTHER"},
    {"watch-stdin", RTV_OPT_BOOL, &stress.ctx.common.watch_stdin, 0, 1, "stop when stdin ends (dies with its session)"},
    {0},
};

static atomic_int failed;
static char failure[256];

void rtv_stress_fail(rtv_stress *s, const char *fmt, ...) {
    (void)s;
    if (atomic_exchange(&failed, 1)) return; /* keep the first reason */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
    atomic_store(&rtv_stop_requested, 1);
    kill(getpid(), SIGUSR2); /* wakes the main thread, which owns the stop */
}

static void on_poke(int sig) { (void)sig; }

typedef struct {
    pthread_t tid;
    _Atomic bool done;
} worker_slot;

static rtv_worker *workers;
static worker_slot *slots;
static int nworkers;

static void *worker_main(void *arg) {
    rtv_worker *w = arg;
    rtv_stress *s = w->stress;
    rtv_setup_thread(&s->ctx, w->index, (int)s->ctx.common.priority);
    w->cpu = rtv_thread_cpu(&s->ctx, w->index);
    s->parts[w->part].work(w);
    struct timespec used;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &used);
    w->cpu_time_ns = (uint64_t)used.tv_sec * UINT64_C(1000000000) + (uint64_t)used.tv_nsec;
    atomic_store(&slots[w->index].done, true);
    return NULL;
}

static void usage(void) {
    fprintf(stderr, "usage: rtvirt-stress NAME [--option=value ...]\n\ncommon options:\n");
    rtv_print_options(common_opts);
    for (size_t i = 0; i < NSTRESSORS; i++) {
        fprintf(stderr, "\n%s: %s\n", stressors[i]->name, stressors[i]->summary);
        rtv_print_options(stressors[i]->opts);
    }
}

/* Fail before any worker starts, with a message naming the option, rather than from a thread. */
static void preflight(rtv_stress *s) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_ZERO(&allowed);
    const rtv_cpulist *cpus = &s->ctx.common.affinity;
    for (int i = 0; i < cpus->count; i++)
        if (!CPU_ISSET(cpus->cpu[i], &allowed))
            rtv_die(RTV_EXIT_USAGE, "--cpus: CPU %u does not exist or is not allowed here", cpus->cpu[i]);
    if (s->ctx.common.priority > 0) {
        /* The main thread takes the top priority: it must be able to stop SCHED_FIFO workers. */
        struct sched_param sp = {.sched_priority = sched_get_priority_max(SCHED_FIFO)};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
            rtv_die(RTV_EXIT_USAGE, "--priority %d: cannot use SCHED_FIFO: %s (run as root or with CAP_SYS_NICE)",
                    (int)s->ctx.common.priority, strerror(errno));
    }
}

/* The stop signal taken, or 0 at the deadline or on a worker's failure (SIGUSR2). */
static int wait_for_stop(rtv_stress *s, const sigset_t *stop_signals) {
    for (;;) {
        if (atomic_load(&failed)) return 0;
        int sig;
        if (s->ctx.end_ns) {
            uint64_t now = rtv_now_ns();
            if (now >= s->ctx.end_ns) return 0;
            struct timespec timeout = rtv_ts(s->ctx.end_ns - now);
            sig = sigtimedwait(stop_signals, NULL, &timeout);
        } else {
            sig = sigwaitinfo(stop_signals, NULL);
        }
        if (sig == SIGUSR2) continue; /* a failure says so in `failed`; a stray SIGUSR2 from outside does not stop */
        if (sig > 0) return sig;
    }
}

static void stop_workers(void) {
    atomic_store(&rtv_stop_requested, 1);
    /* Poke until every worker has left its loop: one poke can land just before a worker sleeps. */
    for (;;) {
        int running = 0;
        for (int i = 0; i < nworkers; i++)
            if (!atomic_load(&slots[i].done)) {
                running++;
                pthread_kill(slots[i].tid, SIGUSR1);
            }
        if (!running) return;
        struct timespec pause = {0, 5 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static void print_summary(rtv_stress *s, const char *end, uint64_t elapsed_ns) {
    FILE *out = stdout;
    uint64_t total = 0;
    for (int i = 0; i < nworkers; i++) total += atomic_load(&workers[i].ops);
    fprintf(out, "{\"agent\":\"rtvirt-stress\",\"stressor\":\"%s\",\"end\":\"%s\",\"elapsed_ns\":%" PRIu64
                 ",\"workers\":%d,\"priority\":%" PRIu64 ",\"bogo_ops\":%" PRIu64 ",\"cpus\":[",
            s->stressor->name, end, elapsed_ns, nworkers, s->ctx.common.priority, total);
    for (int i = 0; i < s->ctx.common.affinity.count; i++)
        fprintf(out, i ? ",%u" : "%u", s->ctx.common.affinity.cpu[i]);
    fputs("],\"parts\":[", out);
    double secs = (double)elapsed_ns / 1e9;
    for (int p = 0; p < s->nparts; p++) {
        uint64_t ops = 0, missed = 0, bytes = 0, cpu_ns = 0;
        for (int i = 0; i < nworkers; i++) {
            if (workers[i].part != p) continue;
            ops += atomic_load(&workers[i].ops);
            missed += workers[i].missed;
            bytes += workers[i].bytes;
            cpu_ns += workers[i].cpu_time_ns;
        }
        fprintf(out, "%s{\"name\":\"%s\",\"workers\":%d,\"bogo_ops\":%" PRIu64 ",\"elapsed_ns\":%" PRIu64
                     ",\"bogo_ops_per_s\":%.3f,\"cpu_time_ns\":%" PRIu64 ",\"missed\":%" PRIu64
                     ",\"bytes\":%" PRIu64 "}",
                p ? "," : "", s->parts[p].name, s->parts[p].workers, ops, elapsed_ns, secs > 0 ? (double)ops / secs : 0.0,
                cpu_ns, missed, bytes);
    }
    fputs("],\"per_worker\":[", out);
    for (int i = 0; i < nworkers; i++)
        fprintf(out, "%s{\"index\":%d,\"part\":\"%s\",\"cpu\":%d,\"bogo_ops\":%" PRIu64 ",\"cpu_time_ns\":%" PRIu64
                     ",\"missed\":%" PRIu64 "}",
                i ? "," : "", i, s->parts[workers[i].part].name, workers[i].cpu, atomic_load(&workers[i].ops),
                workers[i].cpu_time_ns, workers[i].missed);
    fputc(']', out);
    if (s->stressor->report) s->stressor->report(s, out);
    fputs("}\n", out);
    fflush(out);
}

int main(int argc, char **argv) {
    /* First of all, so that a stop request arriving during start-up is queued, not fatal. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    sigaddset(&stop_signals, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL); /* inherited by every worker */
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        usage();
        return argc < 2 ? RTV_EXIT_USAGE : RTV_EXIT_OK;
    }
    if (!strcmp(argv[1], "--list")) {
        for (size_t i = 0; i < NSTRESSORS; i++) printf("%s\n", stressors[i]->name);
        return RTV_EXIT_OK;
    }
    /* Die with the parent: SIGTERM (not SIGKILL) so that files and memory are released cleanly. */
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) return RTV_EXIT_FAILURE; /* the parent died before the request took */

    rtv_stress *s = &stress;
    for (size_t i = 0; i < NSTRESSORS; i++)
        if (!strcmp(argv[1], stressors[i]->name)) s->stressor = stressors[i];
    if (!s->stressor) rtv_die(RTV_EXIT_USAGE, "unknown stressor '%s' (try --list)", argv[1]);

    const rtv_opt *const tables[] = {common_opts, s->stressor->opts};
    rtv_parse_options(tables, 2, argc - 2, argv + 2);
    s->workers_given = s->workers != 0;
    if (s->workers == 0)
        s->workers = s->ctx.common.affinity.count ? (uint64_t)s->ctx.common.affinity.count
                                                  : (uint64_t)sysconf(_SC_NPROCESSORS_ONLN);
    s->nparts = 1;
    s->parts[0] = (rtv_stress_part){s->stressor->name, s->stressor->work, (int)s->workers};
    if (s->stressor->prepare && s->stressor->prepare(s) != 0) return RTV_EXIT_USAGE;
    for (int p = 0; p < s->nparts; p++) nworkers += s->parts[p].workers;
    if (nworkers < 1 || nworkers > RTV_STRESS_MAX_WORKERS)
        rtv_die(RTV_EXIT_USAGE, "--workers: %d workers in total, allowed 1..%d", nworkers, RTV_STRESS_MAX_WORKERS);
    preflight(s);

    struct sigaction poke = {.sa_handler = on_poke};
    sigaction(SIGUSR1, &poke, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (s->ctx.common.watch_stdin) rtv_watch_stdin();

    workers = calloc((size_t)nworkers, sizeof *workers);
    slots = calloc((size_t)nworkers, sizeof *slots);
    if (!workers || !slots) rtv_die(RTV_EXIT_FAILURE, "out of memory");
    s->ctx.start_ns = rtv_now_ns();
    s->ctx.end_ns = s->ctx.common.duration_ns ? s->ctx.start_ns + s->ctx.common.duration_ns : 0;
    int started = 0;
    for (int p = 0; p < s->nparts && !atomic_load(&failed); p++)
        for (int k = 0; k < s->parts[p].workers; k++, started++) {
            workers[started] = (rtv_worker){.stress = s, .index = started, .part = p, .cpu = -1};
            if (pthread_create(&slots[started].tid, NULL, worker_main, &workers[started]) != 0) {
                rtv_stress_fail(s, "cannot start worker %d", started);
                break;
            }
        }
    nworkers = started; /* only these are stopped, joined and reported */

    /* Tell the caller the load is on (it may be waiting to start a measurement after it). */
    printf("{\"event\":\"started\",\"stressor\":\"%s\",\"workers\":%d}\n", s->stressor->name, nworkers);
    fflush(stdout);
    int sig = wait_for_stop(s, &stop_signals);
    stop_workers();
    for (int i = 0; i < nworkers; i++) pthread_join(slots[i].tid, NULL);
    uint64_t elapsed = rtv_now_ns() - s->ctx.start_ns;
    const char *end = atomic_load(&failed) ? "error" : sig ? "signal" : "complete";
    print_summary(s, end, elapsed);
    if (atomic_load(&failed)) {
        fprintf(stderr, "rtvirt-agent: %s\n", failure);
        return RTV_EXIT_FAILURE;
    }
    return RTV_EXIT_OK;
}
