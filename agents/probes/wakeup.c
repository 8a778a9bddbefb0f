/* wakeup: cross-CPU wake-up latency, the stand-in for interrupt latency without an external source.
 * A sender on one CPU sleeps to each period (absolute clock_nanosleep), takes a CLOCK_MONOTONIC
 * timestamp and wakes a receiver blocked on another CPU (the measured one, first --affinity CPU);
 * the receiver records its own wake time minus the sender's timestamp. Both clocks are
 * CLOCK_MONOTONIC, which the kernel keeps consistent across CPUs (also in guests).
 *
 * The wake-up is a bare futex: FUTEX_WAKE on the sender side sends the reschedule IPI to the
 * receiver's CPU and nothing else, so the figure is the scheduler's cross-CPU wake path, as close
 * to "interrupt arrives, handler thread runs" as user space gets (an eventfd would add its file and
 * wait-queue layers). A period in which the receiver has not yet taken the previous event is skipped
 * and counted, so one stall shows as one large sample, not as a queue of stale ones. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "probes.h"

static struct {
    uint64_t interval_ns;
    rtv_cpulist sender_cpu;
} opt = {.interval_ns = 1000000};

static const rtv_opt wakeup_opts[] = {
    {"interval", RTV_OPT_NS, &opt.interval_ns, 10000, 10000000000ull, "period between events in ns"},
    {"sender-cpu", RTV_OPT_CPUS, &opt.sender_cpu, 0, 0, "CPU of the sender (default: another allowed CPU)"},
    {0},
};

enum { STAT_SKIPPED, STAT_SENDER_CPU, STAT_OVERRUNS };
static const char *const stat_names[] = {"skipped", "sender_cpu", "overruns", NULL};

static struct {
    rtv_ctx *ctx;
    int sender_cpu, receiver_cpu;
    _Atomic uint32_t sent;     /* futex word: events sent so far */
    _Atomic uint32_t received; /* events the receiver has taken */
    _Atomic uint64_t sent_ns;
    atomic_bool quit;
    uint64_t skipped;
    uint64_t overruns; /* periods that passed while the sender itself was late (the timer probe's overruns) */
} shared;

static long futex(_Atomic uint32_t *word, int op, uint32_t value) {
    return syscall(SYS_futex, (uint32_t *)word, op, value, NULL, NULL, 0);
}

static void *receiver(void *arg) {
    (void)arg;
    rtv_ctx *ctx = shared.ctx;
    rtv_pin_cpu(shared.receiver_cpu, "the wakeup receiver");
    rtv_set_priority((int)ctx->common.priority);
    uint32_t seen = 0;
    for (;;) {
        uint32_t now_sent;
        while ((now_sent = atomic_load_explicit(&shared.sent, memory_order_acquire)) == seen)
            futex(&shared.sent, FUTEX_WAIT_PRIVATE, seen);
        uint64_t now = rtv_now_ns();
        if (atomic_load(&shared.quit)) break;
        uint64_t sent_ns = atomic_load_explicit(&shared.sent_ns, memory_order_relaxed);
        rtv_sample(ctx, 0, sent_ns, (int64_t)(now - sent_ns), now_sent, shared.receiver_cpu, 0);
        seen = now_sent;
        atomic_store_explicit(&shared.received, seen, memory_order_release);
    }
    return NULL;
}

static void *sender(void *arg) {
    (void)arg;
    rtv_ctx *ctx = shared.ctx;
    rtv_pin_cpu(shared.sender_cpu, "the wakeup sender");
    rtv_set_priority((int)ctx->common.priority);
    uint64_t next = rtv_now_ns() + 10 * 1000 * 1000, events = 0;
    const uint64_t end = rtv_end_ns(ctx, next);
    while (!ctx->common.loops || events < ctx->common.loops) {
        if (next >= end) break;
        if (!rtv_sleep_until(ctx, next)) break;
        uint32_t sent = atomic_load_explicit(&shared.sent, memory_order_relaxed);
        if (atomic_load_explicit(&shared.received, memory_order_acquire) != sent) {
            shared.skipped++;
        } else {
            atomic_store_explicit(&shared.sent_ns, rtv_now_ns(), memory_order_relaxed);
            atomic_store_explicit(&shared.sent, sent + 1, memory_order_release);
            futex(&shared.sent, FUTEX_WAKE_PRIVATE, 1);
            events++;
        }
        uint64_t now = rtv_now_ns(), passed = 0;
        do {
            next += opt.interval_ns;
            passed++;
        } while (next <= now);
        shared.overruns += passed - 1;
    }
    /* Let the receiver take the last event (bounded: it may be stalled) before telling it to quit. */
    uint32_t last = atomic_load(&shared.sent);
    for (int i = 0; i < 1000 && atomic_load(&shared.received) != last; i++) {
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    atomic_store(&shared.quit, true);
    atomic_fetch_add(&shared.sent, 1);
    futex(&shared.sent, FUTEX_WAKE_PRIVATE, 1);
    return NULL;
}

static int allowed_cpu_other_than(int avoid) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set) && cpu != avoid) return cpu;
    return -1;
}

static int wakeup_validate(rtv_common *common) {
    if (common->threads != 1) rtv_die(RTV_EXIT_USAGE, "wakeup runs one sender and one receiver; '--threads' must be 1");
    if (common->affinity.count > 1)
        rtv_die(RTV_EXIT_USAGE, "'--affinity' takes the one receiver CPU for wakeup (the sender goes on --sender-cpu)");
    if (opt.sender_cpu.count > 1) rtv_die(RTV_EXIT_USAGE, "'--sender-cpu' takes one CPU");
    return 0;
}

static int wakeup_run(rtv_ctx *ctx) {
    shared.ctx = ctx;
    /* The receiver is the measured CPU: by default the last allowed one, the sender the first other. */
    int receiver_cpu = ctx->common.affinity.count ? ctx->common.affinity.cpu[0] : -1;
    if (receiver_cpu < 0) {
        cpu_set_t set;
        sched_getaffinity(0, sizeof set, &set);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &set)) receiver_cpu = cpu;
    }
    int sender_cpu = opt.sender_cpu.count ? opt.sender_cpu.cpu[0] : allowed_cpu_other_than(receiver_cpu);
    if (sender_cpu < 0 || sender_cpu == receiver_cpu)
        rtv_die(RTV_EXIT_USAGE, "wakeup needs two different CPUs (receiver %d, sender %d): see '--affinity' and "
                                "'--sender-cpu'", receiver_cpu, sender_cpu);
    shared.receiver_cpu = receiver_cpu;
    shared.sender_cpu = sender_cpu;
    pthread_t rx = rtv_spawn(receiver, NULL), tx = rtv_spawn(sender, NULL);
    pthread_join(tx, NULL);
    pthread_join(rx, NULL);
    rtv_stat(ctx, 0, STAT_SKIPPED, (int64_t)shared.skipped);
    rtv_stat(ctx, 0, STAT_SENDER_CPU, sender_cpu);
    rtv_stat(ctx, 0, STAT_OVERRUNS, (int64_t)shared.overruns);
    return 0;
}

const rtv_probe rtv_probe_wakeup = {
    .name = "wakeup",
    .summary = "cross-CPU wake-up latency (stand-in for interrupt latency)",
    .opts = wakeup_opts,
    .value_field = "latency_ns",
    .aux_field = "event",
    .kind_names = (const char *const[]){"wakeup", NULL},
    .stat_names = stat_names,
    .validate = wakeup_validate,
    .run = wakeup_run,
};
