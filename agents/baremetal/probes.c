/* The bare-metal probes timer, gap, kops and threadmetric (workload is in workload.c: it alone uses SSE).
 * Each runs as the probe thread of the tiny kernel (sched.c) and writes samples with stream_sample; the
 * stream is written out by the idle thread, or by the probe itself between measurements when it
 * never idles (gap, threadmetric, kops). Times are readings of the arch's counter (x86 TSC, Arm CNTVCT)
 * converted with the rate found at boot. */
#include "kernel.h"

/* ---- timer: the arch's timer interrupt latency (x86 LAPIC timer, Arm generic timer) ---- */

static const char *const timer_kinds[] = {"wakeup", NULL};
static const char *const timer_stats[] = {"overruns", NULL};
const probe_desc timer_desc = {"timer", "latency_ns", "irq_latency_ns", timer_kinds, timer_stats};

/* Every --interval the probe thread arms a one-shot kernel timer for the planned expiry and blocks on
 * it. latency_ns: planned expiry to the thread running again; irq_latency_ns: planned expiry to the
 * counter read in the interrupt stub's first instructions. */
int timer_run(void) {
    const uint64_t period = ns_to_cycles(P.interval_ns);
    semaphore fired;
    ktimer timer = {0};
    sem_init(&fired, 0);
    /* --duration counts in whole periods from the first (k * interval < duration, in ns: the periods' cycle sum
     * rounds away from the duration's), not from the run's start: writing the header took 6 ms on a loaded
     * TCG host once, and the periods it ate were neither samples nor overruns */
    const uint64_t periods = P.duration_ns ? (P.duration_ns + P.interval_ns - 1) / P.interval_ns : UINT64_MAX;
    uint64_t overruns = 0, next = cycles() + period, counted = 0;
    const bool steal = steal_source() != NULL;
    steal_mark before, after;
    for (uint64_t n = 0; !P.loops || n < P.loops; n++) {
        if (counted >= periods) break;
        if (steal) steal_mark_now(&before); /* before the window: the expiry is still ahead */
        ktimer_start(&timer, next, &fired);
        sem_take(&fired);
        uint64_t now = cycles(), irq = last_timer_irq_cycles();
        if (steal) steal_mark_now(&after);
        /* a one-shot count rounds to APIC ticks: an entry a few cycles early counts as 0 */
        stream_sample(cycles_to_ns(next), (int64_t)cycles_to_ns(now - next), irq > next ? cycles_to_ns(irq - next) : 0, 0, 0);
        if (steal) { /* a wait after the window (later) is before the next arm: no window's */
            uint64_t stolen[2], later[2];
            stolen_in_window(&before, next, now, &after, stolen, later);
            stream_stolen(cycles_to_ns(next), 0, stolen[0], stolen[1]);
        }
        next += period;
        counted++;
        for (now = cycles(); next <= now && counted < periods; next += period, counted++)
            overruns++; /* missed: skipped */
    }
    stream_stat(0, 0, (int64_t)overruns);
    return 0;
}

/* ---- gap: what the hypervisor takes away from a counter spin ---- */

static const char *const gap_kinds[] = {"gap", "work", NULL};
static const char *const gap_stats[] = {"loop_min_ns", "loop_mean_ns", "cpu_share_ppm", "gaps", "unobserved_ns", NULL};
const probe_desc gap_desc = {"gap", "duration_ns", "cycles", gap_kinds, gap_stats};

enum { GAP_DRAIN_BYTES = 16384 };

/* Interrupts stay off while spinning: nothing in this guest may interrupt the loop, so every step
 * above --threshold between two counter reads is time the vCPU did not run. Writing the stream out
 * (every 512 gaps) is not observed time; its length is the unobserved_ns statistic. */
int gap_run(void) {
    const uint64_t deadline = run_deadline(), threshold = ns_to_cycles(P.threshold_ns);
    const bool steal = steal_source() != NULL;
    steal_mark before, after;
    irq_flags flags = irq_save();
    if (steal) steal_mark_now(&before);
    uint64_t start = cycles(), last = start, loops = 0, min = UINT64_MAX, gaps = 0, gap_cycles = 0, unobserved = 0;
    for (;;) {
        uint64_t now = cycles(), step = now - last;
        if (step > threshold) {
            stream_sample(cycles_to_ns(last), (int64_t)cycles_to_ns(step), step, 0, 0);
            if (steal) { /* what was stolen since the last gap, inside this one (reads only after a gap) */
                uint64_t stolen[2], later[2];
                steal_mark_now(&after);
                stolen_in_window(&before, last, now, &after, stolen, later);
                stream_stolen(cycles_to_ns(last), 0, stolen[0], stolen[1]);
                before = after; /* a wait since `now` lies in the next gap: it counts there */
                before.runnable_ns -= later[0];
                before.offline_ns -= later[1];
            }
            gap_cycles += step;
            if (++gaps == P.loops) break;
            if (stream_pending() >= GAP_DRAIN_BYTES) {
                stream_drain();
                if (steal) steal_mark_now(&before); /* before the window's start: a wait after it is inside */
                uint64_t after_drain = cycles();
                unobserved += after_drain - now;
                now = after_drain;
            }
        } else if (step < min) {
            min = step;
        }
        loops++;
        last = now;
        if (now >= deadline || stop_pending()) break;
    }
    uint64_t observed = last - start - unobserved;
    stream_stat(0, 0, (int64_t)cycles_to_ns(min == UINT64_MAX ? 0 : min));
    stream_stat(0, 1, loops ? (int64_t)cycles_to_ns((observed - gap_cycles) / loops) : 0);
    stream_stat(0, 2, observed ? (int64_t)((__uint128_t)(observed - gap_cycles) * 1000000 / observed) : 0);
    stream_stat(0, 3, (int64_t)gaps);
    stream_stat(0, 4, (int64_t)cycles_to_ns(unobserved));
    irq_restore(flags); /* a pending stop (an NMI came while spinning) ends the stream here, stats included */
    return 0;
}

/* ---- kops: the operations of our own tiny kernel ---- */

enum { K_IRQ_ENTRY, K_IRQ_EXIT, K_SWITCH, K_SEM_GIVE, K_SEM_TAKE, K_SEM_SWITCH, K_MSGQ_PUT, K_MSGQ_GET,
       K_MSGQ_SWITCH, K_TIMER_START, K_TIMER_STOP, K_OPS };
static const char *const kops_kinds[] = {"irq_entry", "irq_exit", "thread_switch", "sem_give", "sem_take",
                                         "sem_switch", "msgq_put", "msgq_get", "msgq_switch", "timer_start",
                                         "timer_stop", NULL};
static const char *const kops_stats[] = {"iterations", NULL};
const probe_desc kops_desc = {"kops", "duration_ns", "cycles", kops_kinds, kops_stats};

static volatile uint64_t ipi_entry_cycles, ipi_hook_cycles;
static volatile bool ipi_seen;
static volatile uint64_t partner_t0, partner_delta;
static semaphore partner_sem;
static msgq partner_q;

static void kops_ipi(void) {
    ipi_entry_cycles = isr_entry_cycles;
    ipi_seen = true;
    ipi_hook_cycles = cycles(); /* the handler's last word: from here to the interrupted thread is the exit */
}

/* The partners: a thread of the measurer's priority that yields back (thread_switch), and threads one
 * above it woken by a semaphore give or a message put (the switch variants). */
static void yield_partner(void *unused) {
    (void)unused;
    for (;;) {
        partner_delta = cycles() - partner_t0;
        k_yield();
    }
}
static void sem_partner(void *unused) {
    (void)unused;
    for (;;) {
        sem_take(&partner_sem);
        partner_delta = cycles() - partner_t0;
    }
}
static void msgq_partner(void *unused) {
    (void)unused;
    uint8_t msg[MSG_BYTES];
    for (;;) {
        msgq_get(&partner_q, msg);
        partner_delta = cycles() - partner_t0;
    }
}

static void kops_sample(int kind, uint64_t t0, uint64_t cycles) {
    stream_sample(cycles_to_ns(t0), (int64_t)cycles_to_ns(cycles), cycles, 0, (uint16_t)kind);
}

/* One iteration of operation `op`; returns false when the run's time is up. */
static void kops_once(int op) {
    static semaphore sem;
    static msgq q;
    static ktimer timer;
    static uint8_t msg[MSG_BYTES], got[MSG_BYTES];
    uint64_t t0, t1, t2;
    switch (op) {
    case K_IRQ_ENTRY: /* also gives K_IRQ_EXIT */
        ipi_seen = false;
        t0 = cycles();
        kops_self_ipi();
        while (!ipi_seen) {}
        t2 = cycles();
        kops_sample(K_IRQ_ENTRY, t0, ipi_entry_cycles - t0);
        kops_sample(K_IRQ_EXIT, ipi_hook_cycles, t2 - ipi_hook_cycles);
        return;
    case K_SWITCH:
        partner_t0 = cycles();
        k_yield();
        kops_sample(K_SWITCH, partner_t0, partner_delta);
        return;
    case K_SEM_GIVE: /* also gives K_SEM_TAKE */
        sem_init(&sem, 0);
        t0 = cycles();
        sem_give(&sem);
        t1 = cycles();
        sem_take(&sem);
        t2 = cycles();
        kops_sample(K_SEM_GIVE, t0, t1 - t0);
        kops_sample(K_SEM_TAKE, t1, t2 - t1);
        return;
    case K_SEM_SWITCH:
        partner_t0 = cycles();
        sem_give(&partner_sem);
        kops_sample(K_SEM_SWITCH, partner_t0, partner_delta);
        return;
    case K_MSGQ_PUT: /* also gives K_MSGQ_GET */
        t0 = cycles();
        msgq_put(&q, msg);
        t1 = cycles();
        msgq_get(&q, got);
        t2 = cycles();
        kops_sample(K_MSGQ_PUT, t0, t1 - t0);
        kops_sample(K_MSGQ_GET, t1, t2 - t1);
        return;
    case K_MSGQ_SWITCH:
        partner_t0 = cycles();
        msgq_put(&partner_q, msg);
        kops_sample(K_MSGQ_SWITCH, partner_t0, partner_delta);
        return;
    case K_TIMER_START: /* also gives K_TIMER_STOP */
        t0 = cycles();
        ktimer_start(&timer, t0 + cycles_hz, NULL); /* far enough never to fire */
        t1 = cycles();
        ktimer_stop(&timer);
        t2 = cycles();
        kops_sample(K_TIMER_START, t0, t1 - t0);
        kops_sample(K_TIMER_STOP, t1, t2 - t1);
        return;
    }
}

int kops_run(void) {
    static const int measured[] = {K_IRQ_ENTRY, K_SWITCH, K_SEM_GIVE, K_SEM_SWITCH, K_MSGQ_PUT, K_MSGQ_SWITCH,
                                   K_TIMER_START};
    const uint64_t deadline = run_deadline();
    const int mine = P.priority ? (int)P.priority : 1;
    sem_init(&partner_sem, 0);
    msgq_init(&partner_q);
    kops_ipi_hook = kops_ipi;
    thread_start(yield_partner, NULL, mine, "kops-yield");
    thread_start(sem_partner, NULL, mine + 1, "kops-sem");   /* runs at once and blocks */
    thread_start(msgq_partner, NULL, mine + 1, "kops-msgq"); /* likewise */
    uint64_t done = 0;
    for (size_t o = 0; o < sizeof measured / sizeof measured[0]; o++) {
        for (uint64_t i = 0; i < P.iterations; i++) {
            if (cycles() >= deadline || stop_pending()) goto out;
            kops_once(measured[o]);
            if (stream_pending() >= 16384) stream_drain(); /* between iterations: never inside one */
            done++;
        }
    }
out:
    kops_ipi_hook = NULL;
    stream_stat(0, 0, (int64_t)done);
    return 0;
}

/* ---- threadmetric: the Thread-Metric preemptive scheduling test on the tiny kernel ---- */

enum { CHAIN = 5 };
static const char *const tm_kinds[] = {"rounds", NULL};
static const char *const tm_stats[] = {"rounds_total", "counter_spread", NULL};
const probe_desc threadmetric_desc = {"threadmetric", "rounds", "interval_ns", tm_kinds, tm_stats};

static semaphore tm_resume[CHAIN];
static volatile uint64_t tm_count[CHAIN];

/* Thread 0 (lowest) resumes thread 1, which preempts it at once and resumes thread 2, ... up to
 * thread 4; each counts one and suspends, so one round is one pass up the chain and back. */
static void tm_link(void *arg) {
    int i = (int)(uintptr_t)arg;
    for (;;) {
        if (i) sem_take(&tm_resume[i]);
        if (i + 1 < CHAIN) sem_give(&tm_resume[i + 1]);
        tm_count[i]++;
    }
}

static uint64_t tm_spread(void) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < CHAIN; i++) {
        uint64_t v = tm_count[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    return hi - lo;
}

/* The reporter (the probe thread, above the chain) wakes every --report-interval, samples the rounds
 * of the interval, writes the stream out (a few records: microseconds taken from the chain) and
 * checks that the five counters moved together. */
int threadmetric_run(void) {
    const uint64_t deadline = run_deadline(), period = ns_to_cycles(P.report_interval_ns);
    const int top = (int)P.priority;
    for (int i = CHAIN - 1; i >= 0; i--) {
        sem_init(&tm_resume[i], 0);
        thread_start(tm_link, (void *)(uintptr_t)i, top - CHAIN + i, "threadmetric");
    }
    uint64_t next = cycles() + period, last = next - period, before = 0;
    int status = 0;
    for (uint64_t n = 0; !P.loops || n < P.loops; n++) {
        if (next > deadline || stop_pending()) break; /* the chain never idles: a polled stop is seen here */
        sleep_until(next);
        uint64_t now = cycles(), rounds = tm_count[0];
        stream_sample(cycles_to_ns(next), (int64_t)(rounds - before), cycles_to_ns(now - last), 0, 0);
        before = rounds;
        last = now;
        stream_drain();
        if (tm_spread() > 1) {
            console_line("rtvirt-baremetal: threadmetric: the per-thread counters diverged (a resume did not preempt)");
            status = EXIT_FAILURE;
            break;
        }
        next += period;
    }
    stream_stat(0, 0, (int64_t)tm_count[0]);
    stream_stat(0, 1, (int64_t)tm_spread());
    return status;
}
