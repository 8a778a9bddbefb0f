/* rtvirt-baremetal: a minimal x86_64 guest kernel whose measurements belong to the hypervisor.
 *
 * No libc, no Linux: our own boot code (multiboot 1 for QEMU -kernel, PVH for Xen), LAPIC/TSC code,
 * 16550 and debug-port output, and a tiny preemptive kernel for the kops and threadmetric probes.
 * One CPU; every probe writes the rtvirt sample stream (docs/sample-stream.md) to the stream channel.
 */
#ifndef RTVIRT_BAREMETAL_KERNEL_H
#define RTVIRT_BAREMETAL_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RTVB_VERSION "1"

/* Statuses the guest ends with, as the Linux agents' exit codes (rtvirt.errors). */
enum { EXIT_OK = 0, EXIT_FAILURE = 1, EXIT_USAGE = 2 };

/* ---- lib.c ---- */
void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);

/* A bounded text buffer for JSON headers and console lines. */
typedef struct {
    char *buf;
    size_t len, cap;
} text;
void text_str(text *t, const char *s);
void text_char(text *t, char c);
void text_u64(text *t, uint64_t v);
void text_i64(text *t, int64_t v);
void text_json_str(text *t, const char *s); /* quoted, escaped */

/* ---- hw.c ---- */
static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline uint64_t rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
static inline void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
static inline uint64_t irq_save(void) {
    uint64_t flags;
    __asm__ volatile("pushfq; popq %0; cli" : "=r"(flags)::"memory");
    return flags;
}
static inline void irq_restore(uint64_t flags) {
    if (flags & 0x200) __asm__ volatile("sti" ::: "memory");
}
#define barrier() __asm__ volatile("" ::: "memory")

extern uint64_t tsc_hz;        /* measured or read from the hypervisor at boot */
extern const char *tsc_source; /* how tsc_hz was found */
extern bool has_tsc_deadline;
extern bool has_serial;        /* a 16550 answers at COM1 */

void hw_init(void);
void console_write(const char *s, size_t n); /* text: COM1, else the debug port */
void console_line(const char *s);
uint64_t tsc_to_ns(uint64_t cycles);
uint64_t ns_to_tsc(uint64_t ns);
uint64_t now_ns(void);     /* ns since the TSC was 0 (reset of the VM) */
uint64_t rtc_unix_ns(void); /* wall clock from the CMOS RTC, 0 if it has none */
void lapic_init(void);
void lapic_arm(uint64_t deadline_tsc); /* one interrupt on LAPIC_TIMER_VECTOR at deadline_tsc */
void lapic_disarm(void);
void lapic_eoi(void);
void lapic_self_ipi(uint8_t vector);
const char *timer_mode(void);
extern const char *boot_kind; /* how the guest booted: multiboot or pvh (main.c sets it) */
_Noreturn void guest_exit(int status);
/* Failing: the reason on the console, then ``end`` (registered by main.c: the stream's end, which hw cannot
 * call), then the VM ends with status 2 (usage_error: bad input, naming `option`) or 1 (run_error). */
void on_guest_failure(void (*end)(int reason));
_Noreturn void usage_error(const char *option, const char *detail);
_Noreturn void run_error(const char *detail);

/* ---- interrupts (isr.S, sched.c) ---- */
enum { NMI_VECTOR = 2, LAPIC_TIMER_VECTOR = 32, KOPS_IPI_VECTOR = 33, SWITCH_VECTOR = 34, STOP_VECTOR = 35,
       SPURIOUS_VECTOR = 255 };
/* Set by an NMI (the host's "stop": QMP inject-nmi): probes end their loops, the stream ends as a signal
 * ends a Linux agent's (every sample written, END reason 1). */
extern volatile bool stop_requested;
extern volatile uint64_t isr_entry_tsc; /* TSC read at the first instructions of the last IRQ stub */
void idt_init(void);
extern void (*kops_ipi_hook)(void); /* what KOPS_IPI_VECTOR runs (the kops probe's timestamps) */

/* ---- sched.c: the tiny preemptive kernel ---- */
typedef struct thread thread;
typedef struct wait_queue {
    thread *first;
} wait_queue;
typedef struct {
    int64_t count;
    wait_queue waiters;
} semaphore;
enum { MSG_BYTES = 16, MSGQ_SLOTS = 8 };
typedef struct {
    uint8_t slots[MSGQ_SLOTS][MSG_BYTES];
    unsigned head, count;
    wait_queue getters;
} msgq;
typedef struct ktimer {
    uint64_t expiry_tsc;
    semaphore *give; /* given when the timer fires */
    struct ktimer *next;
    bool active;
} ktimer;

void sched_init(void);
thread *thread_start(void (*entry)(void *), void *arg, int priority, const char *name);
_Noreturn void sched_run(void); /* the boot context becomes the idle thread */
void k_yield(void);
void k_reschedule(void);
void sem_init(semaphore *s, int64_t count);
void sem_take(semaphore *s);
void sem_give(semaphore *s);
void msgq_init(msgq *q);
void msgq_put(msgq *q, const void *msg); /* the queue never fills in our probes: a full one drops */
void msgq_get(msgq *q, void *msg);
void ktimer_start(ktimer *t, uint64_t expiry_tsc, semaphore *give);
void ktimer_stop(ktimer *t);
void sleep_until_tsc(uint64_t tsc);
uint64_t last_timer_irq_tsc(void); /* entry TSC of the interrupt that fired the last timer */
bool k_can_block(void);            /* a thread other than idle, not in an interrupt handler */
void thread_exit(void);
void set_idle_work(void (*work)(void)); /* what the idle thread does before halting */
/* What STOP_VECTOR (raised by the NMI) runs once the kernel's lists are consistent: stream_stop, registered by
 * main.c (the stream is a layer above the kernel). */
void on_stop_request(void (*handler)(void));

/* ---- virtio.c ---- */
bool virtio_console_init(void); /* a legacy virtio-console on PCI bus 0, set up for writing */
void virtio_console_write(const uint8_t *p, size_t n);
bool virtio_console_read_line(char *line, size_t size, uint64_t deadline_tsc); /* the host's line, bounded */

/* ---- xen.c: Xen PVH (hypercalls, the PV console, the start info's memory map) ---- */
extern bool on_xen;                         /* Xen's CPUID leaves answered and the hypercall page is set */
bool xen_init(void);                        /* true when the PV console is there */
bool xen_console(void);
void xen_console_text(const char *s, size_t n);
void xen_console_stream(const uint8_t *p, size_t n); /* framed: 00 'RVS' length16 bytes */
void xen_console_flush(void);               /* finish an open frame, write held text */
uint64_t pvh_memory_top(const void *start_info); /* 0 without a memory map */
void xen_shutdown(void);
/* Stolen time from vCPU 0's runstate area (ns): a mark is one consistent reading, as of its TSC */
typedef struct {
    uint64_t tsc;                     /* read just before the runstate (no wait between them) */
    uint64_t runnable_ns, offline_ns; /* the runstate's totals */
} xen_steal_mark;
bool xen_steal_init(void); /* registers the runstate area; false: not on Xen, or refused */
bool xen_steal_measured(void);
void xen_steal_mark_now(xen_steal_mark *mark);
/* stolen_ns, later_ns: runnable, offline (later: after the window, the next one's) */
void xen_stolen_in_window(const xen_steal_mark *before, uint64_t start_tsc, uint64_t end_tsc,
                          const xen_steal_mark *after, uint64_t stolen_ns[2], uint64_t later_ns[2]);

/* ---- stream.c ---- */
void stream_init(void); /* choose the channel: Xen PV console, virtio-console, debug console, COM2; none stops */
typedef struct {
    const char *name;
    const char *value_field;
    const char *aux_field; /* or NULL */
    const char *const *kinds;
    const char *const *stats;
} probe_desc;
void stream_begin(const probe_desc *probe, const char *params_json);
void stream_sample(uint64_t t_ns, int64_t value, uint64_t aux, uint16_t thread, uint16_t kind);
void stream_stat(uint16_t thread, uint16_t key, int64_t value);
/* The stolen time inside the window of the sample just written (t_ns), when there was any (META STOLEN) */
void stream_stolen(uint64_t t_ns, uint16_t thread, uint64_t runnable_ns, uint64_t offline_ns);
void stream_end(int reason); /* DROPPED + END, then flush everything */
void stream_drain(void);     /* write out what is buffered (idle work; preemptible) */
bool stream_room(size_t records);
uint64_t stream_pending(void); /* bytes not written out yet */
_Noreturn void stop_now(void); /* write everything out, END reason 1, leave the VM */
void stream_stop(void);        /* stop_now, unless a drain is writing: it stops between two of its writes */

/* ---- run.c: the probe's options as the Linux agent takes them (main.c parses them), the deadline, memory ---- */
typedef struct {
    uint64_t duration_ns, loops, threads, priority;
    /* probe options; each probe reads its own */
    uint64_t interval_ns, distance_ns, threshold_ns, work_unit, iterations, alloc_size, report_interval_ns, size;
    uint64_t confirm_timeout_ns;
    bool work;
    const char *kernel, *engine, *confirm;
} params;
extern params P;
void run_started(void);          /* the probe starts now: --duration counts from here */
uint64_t run_deadline_tsc(void); /* UINT64_MAX without --duration */
/* Memory above the image for probe data (never freed); too little stops the guest naming `option`. */
void arena_init(uint64_t memory_top);
void *arena_alloc(size_t bytes, const char *option);

/* ---- probes ---- */
typedef struct {
    const probe_desc *desc;
    int (*run)(void); /* returns the end status; runs as a thread of the tiny kernel */
} probe_entry;
extern const probe_desc timer_desc, gap_desc, kops_desc, threadmetric_desc, workload_desc;
int timer_run(void);
int gap_run(void);
int kops_run(void);
int threadmetric_run(void);
int workload_run(void);
/* stress.c: the stressor programs (cpu, cache) of a disturbing bare-metal guest */
extern const probe_desc stress_cpu_desc, stress_cache_desc;
extern uint64_t stress_level, stress_buffer;
int stress_cpu_run(void);
int stress_cache_run(void);

#endif
