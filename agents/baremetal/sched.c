/* The tiny preemptive kernel: strict fixed priorities (higher number runs first, FIFO among equals),
 * semaphores, a message queue, one-shot timers on the architecture's timer, and an idle thread that writes the
 * stream out while nothing else runs. One CPU. A thread's state is always an interrupt frame (the arch's): it
 * is switched only when an interrupt handler returns (sched_switch), on an interrupt or on the switch trap
 * (x86 int $34, Arm svc) that blocking calls and yields take; interrupts are off while the kernel's lists
 * change. */
#include "kernel.h"

enum { MAX_THREADS = 12, STACK_BYTES = 16384 };

struct thread {
    void *saved; /* the arch's interrupt frame */
    int priority;
    bool ready;
    uint64_t seq; /* FIFO order among equal priorities */
    const char *name;
    thread *next_waiter;
    void *msg; /* where msgq_get wants its message */
};

static thread threads[MAX_THREADS];
static int nthreads;
static _Alignas(16) uint8_t stacks[MAX_THREADS][STACK_BYTES];
static thread *current;
static uint64_t seq_counter;
static bool in_isr;
static void (*idle_work)(void);
volatile uint64_t isr_entry_cycles;
static uint64_t timer_irq_cycles;
static ktimer *timers; /* active timers, earliest first */
void (*kops_ipi_hook)(void);

volatile bool stop_requested;
static void (*stop_handler)(void); /* stream_stop, registered by main.c */

void on_stop_request(void (*handler)(void)) { stop_handler = handler; }

bool stop_pending(void) {
    if (!stop_requested && (arch_stop_pending() || xen_console_stop_requested())) stop_requested = true;
    return stop_requested;
}

static thread *pick(void) {
    thread *best = NULL;
    for (int i = 0; i < nthreads; i++) {
        thread *t = &threads[i];
        if (!t->ready) continue;
        if (!best || t->priority > best->priority || (t->priority == best->priority && t->seq < best->seq)) best = t;
    }
    return best;
}

static void make_ready(thread *t) {
    t->ready = true;
    t->seq = ++seq_counter;
}

static void timer_interrupt(void) {
    uint64_t now = cycles();
    while (timers && timers->expiry <= now) {
        ktimer *t = timers;
        timers = t->next;
        t->active = false;
        timer_irq_cycles = isr_entry_cycles;
        if (t->give) sem_give(t->give);
    }
    if (timers) timer_arm(timers->expiry); /* the next one, or the rest of a clamped one-shot count */
}

_Noreturn void cpu_exception(const char *what, uint64_t number, uint64_t code, uint64_t at) {
    text t = {(char[200]){0}, 0, 200};
    text_str(&t, what);
    text_char(&t, ' ');
    text_hex(&t, number);
    text_str(&t, " (code ");
    text_hex(&t, code);
    text_str(&t, ") at ");
    text_hex(&t, at);
    text_str(&t, " in thread ");
    text_str(&t, current ? current->name : "boot");
    run_error(t.buf);
}

void kernel_event(enum kernel_event event) {
    in_isr = true;
    switch (event) {
    case EV_TIMER: timer_interrupt(); break;
    case EV_KOPS:
        if (kops_ipi_hook) kops_ipi_hook();
        break;
    case EV_STOP:
        stop_requested = true;
        if (stop_handler) stop_handler();
        break;
    case EV_NONE: break;
    }
}

void *sched_switch(void *frame) {
    in_isr = false;
    if (!current) return frame;
    thread *next = pick();
    if (next && next != current) {
        current->saved = frame;
        current = next;
        return next->saved;
    }
    return frame;
}

void k_reschedule(void) {
    if (!in_isr) switch_trap();
}

void k_yield(void) {
    irq_flags flags = irq_save();
    current->seq = ++seq_counter; /* behind the other threads of its priority */
    k_reschedule();
    irq_restore(flags);
}

static void thread_entry(void (*entry)(void *), void *arg) {
    entry(arg);
    thread_exit();
}

thread *thread_start(void (*entry)(void *), void *arg, int priority, const char *name) {
    irq_flags flags = irq_save();
    if (nthreads == MAX_THREADS) run_error("the tiny kernel ran out of thread slots");
    thread *t = &threads[nthreads];
    uint8_t *top = stacks[nthreads] + STACK_BYTES;
    nthreads++;
    void *f = thread_frame(top, thread_entry, entry, arg);
    *t = (thread){.saved = f, .priority = priority, .name = name};
    make_ready(t);
    if (current && priority > current->priority) k_reschedule();
    irq_restore(flags);
    return t;
}

void thread_exit(void) {
    irq_disable();
    current->ready = false;
    k_reschedule();
    for (;;) {} /* not reached: a thread that is not ready is never picked */
}

void sched_init(void) {
    nthreads = 1;
    threads[0] = (thread){.priority = 0, .name = "idle"};
    make_ready(&threads[0]);
}

void set_idle_work(void (*work)(void)) { idle_work = work; }

_Noreturn void sched_run(void) {
    current = &threads[0]; /* the boot context is the idle thread from here on */
    irq_enable();
    k_yield();
    for (;;) {
        if (idle_work) idle_work();
        if (!stop_requested && stop_pending() && stop_handler) stop_handler(); /* a polled stop: ends the run */
        /* no wake-up is lost between the check and the wait: it ends the wait even while masked */
        irq_disable();
        if (pick() == current) idle_wait_and_enable();
        else irq_enable();
    }
}

/* ---- wait queues: highest priority first ---- */

static void wait_on(wait_queue *q) {
    current->ready = false;
    thread **at = &q->first;
    while (*at && (*at)->priority >= current->priority) at = &(*at)->next_waiter;
    current->next_waiter = *at;
    *at = current;
    k_reschedule();
}

static thread *wake_one(wait_queue *q) {
    thread *t = q->first;
    if (!t) return NULL;
    q->first = t->next_waiter;
    make_ready(t);
    return t;
}

void sem_init(semaphore *s, int64_t count) { *s = (semaphore){.count = count}; }

void sem_take(semaphore *s) {
    irq_flags flags = irq_save();
    if (s->count > 0) s->count--;
    else wait_on(&s->waiters); /* sem_give hands its unit straight to us */
    irq_restore(flags);
}

void sem_give(semaphore *s) {
    irq_flags flags = irq_save();
    thread *t = wake_one(&s->waiters);
    if (!t) s->count++;
    else if (t->priority > current->priority) k_reschedule();
    irq_restore(flags);
}

void msgq_init(msgq *q) { memset(q, 0, sizeof *q); }

void msgq_put(msgq *q, const void *msg) {
    irq_flags flags = irq_save();
    thread *t = q->getters.first;
    if (t) {
        memcpy(t->msg, msg, MSG_BYTES);
        wake_one(&q->getters);
        if (t->priority > current->priority) k_reschedule();
    } else if (q->count < MSGQ_SLOTS) {
        memcpy(q->slots[(q->head + q->count) % MSGQ_SLOTS], msg, MSG_BYTES);
        q->count++;
    }
    irq_restore(flags);
}

void msgq_get(msgq *q, void *msg) {
    irq_flags flags = irq_save();
    if (q->count) {
        memcpy(msg, q->slots[q->head], MSG_BYTES);
        q->head = (q->head + 1) % MSGQ_SLOTS;
        q->count--;
    } else {
        current->msg = msg;
        wait_on(&q->getters);
    }
    irq_restore(flags);
}

/* ---- timers ---- */

void ktimer_start(ktimer *t, uint64_t expiry, semaphore *give) {
    irq_flags flags = irq_save();
    if (t->active) ktimer_stop(t);
    t->expiry = expiry;
    t->give = give;
    t->active = true;
    ktimer **at = &timers;
    while (*at && (*at)->expiry <= expiry) at = &(*at)->next;
    t->next = *at;
    *at = t;
    if (timers == t) timer_arm(expiry);
    irq_restore(flags);
}

void ktimer_stop(ktimer *t) {
    irq_flags flags = irq_save();
    if (t->active) {
        bool was_first = timers == t;
        for (ktimer **at = &timers; *at; at = &(*at)->next)
            if (*at == t) {
                *at = t->next;
                break;
            }
        t->active = false;
        if (was_first) {
            if (timers) timer_arm(timers->expiry);
            else timer_disarm();
        }
    }
    irq_restore(flags);
}

void sleep_until(uint64_t deadline) {
    semaphore done;
    ktimer timer = {0};
    sem_init(&done, 0);
    ktimer_start(&timer, deadline, &done);
    sem_take(&done);
}

uint64_t last_timer_irq_cycles(void) { return timer_irq_cycles; }

bool k_can_block(void) { return current && current != &threads[0] && !in_isr; }
