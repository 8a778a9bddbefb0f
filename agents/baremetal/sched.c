/* The tiny preemptive kernel: strict fixed priorities (higher number runs first, FIFO among equals),
 * semaphores, a message queue, one-shot timers on the LAPIC, and an idle thread that writes the
 * stream out while nothing else runs. One CPU. A thread's state is always an interrupt frame: it is
 * switched only in isr_dispatch, on an interrupt or on the switch trap (int $SWITCH_VECTOR) that
 * blocking calls and yields take; interrupts are off while the kernel's lists change. */
#include "kernel.h"

typedef struct {
    uint64_t r15, r14, r13, r12, r11, r10, r9, r8, rbp, rdi, rsi, rdx, rcx, rbx, rax;
    uint64_t vector, error, rip, cs, rflags, rsp, ss;
} frame;

enum { MAX_THREADS = 12, STACK_BYTES = 16384 };

struct thread {
    frame *saved;
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
volatile uint64_t isr_entry_tsc;
static uint64_t timer_irq_tsc;
static ktimer *timers; /* active timers, earliest first */
void (*kops_ipi_hook)(void);

struct __attribute__((packed)) idt_entry {
    uint16_t offset_lo, selector;
    uint8_t ist, type;
    uint16_t offset_mid;
    uint32_t offset_hi, zero;
};
static struct idt_entry idt[256];
extern const uint64_t isr_stubs[37];
volatile bool stop_requested;
static void (*stop_handler)(void); /* stream_stop, registered by main.c */

void on_stop_request(void (*handler)(void)) { stop_handler = handler; }

void idt_init(void) {
    for (int i = 0; i < 37; i++) {
        int vector = i < 36 ? i : SPURIOUS_VECTOR;
        uint64_t a = isr_stubs[i];
        idt[vector] = (struct idt_entry){(uint16_t)a, 0x08, 0, 0x8E, (uint16_t)(a >> 16), (uint32_t)(a >> 32), 0};
    }
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } pointer = {sizeof idt - 1, (uint64_t)idt};
    __asm__ volatile("lidt %0" ::"m"(pointer));
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
    uint64_t now = rdtsc();
    while (timers && timers->expiry_tsc <= now) {
        ktimer *t = timers;
        timers = t->next;
        t->active = false;
        timer_irq_tsc = isr_entry_tsc;
        if (t->give) sem_give(t->give);
    }
    if (timers) lapic_arm(timers->expiry_tsc); /* the next one, or the rest of a clamped one-shot count */
}

static void exception(const frame *f) {
    text t = {(char[160]){0}, 0, 160};
    text_str(&t, "CPU exception ");
    text_u64(&t, f->vector);
    text_str(&t, " (error code ");
    text_u64(&t, f->error);
    text_str(&t, ") at rip ");
    text_u64(&t, f->rip);
    text_str(&t, " in thread ");
    text_str(&t, current ? current->name : "boot");
    run_error(t.buf);
}

frame *isr_dispatch(frame *f) {
    in_isr = true;
    switch (f->vector) {
    case LAPIC_TIMER_VECTOR:
        lapic_eoi();
        timer_interrupt();
        break;
    case KOPS_IPI_VECTOR:
        if (kops_ipi_hook) kops_ipi_hook();
        lapic_eoi();
        break;
    case NMI_VECTOR: /* may interrupt anything, even cli sections: only a flag and a self-IPI here */
        stop_requested = true;
        lapic_self_ipi(STOP_VECTOR);
        break;
    case STOP_VECTOR: /* an ordinary interrupt: the kernel's lists are consistent here */
        lapic_eoi();
        if (stop_handler) stop_handler();
        break;
    case SWITCH_VECTOR:
    case SPURIOUS_VECTOR:
        break;
    default:
        exception(f);
    }
    in_isr = false;
    if (!current) return f;
    thread *next = pick();
    if (next && next != current) {
        current->saved = f;
        current = next;
        return next->saved;
    }
    return f;
}

void k_reschedule(void) {
    if (!in_isr) __asm__ volatile("int %0" ::"i"(SWITCH_VECTOR) : "memory");
}

void k_yield(void) {
    uint64_t flags = irq_save();
    current->seq = ++seq_counter; /* behind the other threads of its priority */
    k_reschedule();
    irq_restore(flags);
}

static void thread_entry(void (*entry)(void *), void *arg) {
    entry(arg);
    thread_exit();
}

thread *thread_start(void (*entry)(void *), void *arg, int priority, const char *name) {
    uint64_t flags = irq_save();
    if (nthreads == MAX_THREADS) run_error("the tiny kernel ran out of thread slots");
    thread *t = &threads[nthreads];
    uint8_t *top = stacks[nthreads] + STACK_BYTES;
    nthreads++;
    frame *f = (frame *)(top - 64 - sizeof(frame));
    memset(f, 0, sizeof *f);
    f->rip = (uint64_t)thread_entry;
    f->rdi = (uint64_t)entry;
    f->rsi = (uint64_t)arg;
    f->cs = 0x08;
    f->ss = 0x10;
    f->rflags = 0x202;          /* interrupts on */
    f->rsp = (uint64_t)top - 8; /* as after a call: rsp + 8 is 16-byte aligned */
    *t = (thread){.saved = f, .priority = priority, .name = name};
    make_ready(t);
    if (current && priority > current->priority) k_reschedule();
    irq_restore(flags);
    return t;
}

void thread_exit(void) {
    __asm__ volatile("cli");
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
    __asm__ volatile("sti");
    k_yield();
    for (;;) {
        if (idle_work) idle_work();
        /* sti takes effect after hlt has started: no wake-up is lost between the check and the halt */
        __asm__ volatile("cli");
        if (pick() == current) __asm__ volatile("sti; hlt" ::: "memory");
        else __asm__ volatile("sti" ::: "memory");
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
    uint64_t flags = irq_save();
    if (s->count > 0) s->count--;
    else wait_on(&s->waiters); /* sem_give hands its unit straight to us */
    irq_restore(flags);
}

void sem_give(semaphore *s) {
    uint64_t flags = irq_save();
    thread *t = wake_one(&s->waiters);
    if (!t) s->count++;
    else if (t->priority > current->priority) k_reschedule();
    irq_restore(flags);
}

void msgq_init(msgq *q) { memset(q, 0, sizeof *q); }

void msgq_put(msgq *q, const void *msg) {
    uint64_t flags = irq_save();
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
    uint64_t flags = irq_save();
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

void ktimer_start(ktimer *t, uint64_t expiry_tsc, semaphore *give) {
    uint64_t flags = irq_save();
    if (t->active) ktimer_stop(t);
    t->expiry_tsc = expiry_tsc;
    t->give = give;
    t->active = true;
    ktimer **at = &timers;
    while (*at && (*at)->expiry_tsc <= expiry_tsc) at = &(*at)->next;
    t->next = *at;
    *at = t;
    if (timers == t) lapic_arm(expiry_tsc);
    irq_restore(flags);
}

void ktimer_stop(ktimer *t) {
    uint64_t flags = irq_save();
    if (t->active) {
        bool was_first = timers == t;
        for (ktimer **at = &timers; *at; at = &(*at)->next)
            if (*at == t) {
                *at = t->next;
                break;
            }
        t->active = false;
        if (was_first) {
            if (timers) lapic_arm(timers->expiry_tsc);
            else lapic_disarm();
        }
    }
    irq_restore(flags);
}

void sleep_until_tsc(uint64_t tsc) {
    semaphore done;
    ktimer timer = {0};
    sem_init(&done, 0);
    ktimer_start(&timer, tsc, &done);
    sem_take(&done);
}

uint64_t last_timer_irq_tsc(void) { return timer_irq_tsc; }

bool k_can_block(void) { return current && current != &threads[0] && !in_isr; }
