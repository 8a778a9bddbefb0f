/* rtvirt-baremetal: a minimal guest kernel whose measurements belong to the hypervisor (x86_64 and aarch64).
 *
 * No libc, no Linux. One kernel source tree, two architectures: what every guest does (the probes, the sample
 * stream, the tiny scheduler, the workload and stressor programs, Xen's console and runstate area, virtqueues,
 * stolen time, the clock exchange) is here, beside this header; what an architecture does its own way (boot,
 * exceptions and interrupts, the timer, the interrupt controller, the console UART, the virtio transport,
 * hypercalls and paravirtual clocks) is in x86_64/ or aarch64/, behind <arch.h> and the functions declared
 * under "arch" below. One CPU; every probe writes the rtvirt sample stream (docs/sample-stream.md).
 */
#ifndef RTVIRT_BAREMETAL_KERNEL_H
#define RTVIRT_BAREMETAL_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden) /* one static image (aarch64's is position-independent): no GOT */

#include "arch.h" /* cycles(), irq_save/irq_restore, barriers, cpu_relax, ARCH_NAME */

#define RTVB_VERSION "1"

/* Statuses the guest ends with, as the Linux agents' exit codes (rtvirt.errors). */
enum { EXIT_OK = 0, EXIT_FAILURE = 1, EXIT_USAGE = 2 };

/* ---- lib.c (memcpy and memset are the arch's) ---- */
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
void text_hex(text *t, uint64_t v);
void text_json_str(text *t, const char *s); /* quoted, escaped */

/* ---- the clock: the architecture's cycle counter (x86 TSC, Arm CNTVCT), converted with its rate ---- */
extern uint64_t cycles_hz;        /* read from the hypervisor or the architecture, or measured, at boot */
extern const char *cycles_source; /* how cycles_hz was found (the header's guest.tsc_source / counter_source) */
void clock_init(uint64_t hz, const char *source);
uint64_t cycles_to_ns(uint64_t cycles);
uint64_t ns_to_cycles(uint64_t ns);
uint64_t now_ns(void); /* ns since the counter was 0 (the VM's reset; Xen on Arm: the domain's creation) */

/* ---- arch: what each architecture provides (x86_64/, aarch64/) ---- */
/* The boot hands the kernel this (kernel_main); the arch has set up its console and counter before. */
typedef struct {
    const char *kind;         /* multiboot, pvh (x86); image (Arm's Linux image protocol) */
    char *command_line;       /* PROBE --name=value ...; NULL: none */
    bool skip_first_word;     /* multiboot loaders put the kernel's file name first */
    uint64_t memory_top;      /* end of the RAM probes may take above the image */
} boot_info;
_Noreturn void kernel_main(const boot_info *boot);

void console_write(const char *s, size_t n); /* text: the UART, else the hypervisor's console */
void console_line(const char *s);
uint64_t rtc_unix_ns(void);                  /* wall clock, 0 if the platform has none */
void interrupts_init(void);                  /* vectors, the interrupt controller, the stop source */
void timer_init(void);
void timer_arm(uint64_t deadline_cycles);    /* one interrupt (EV_TIMER) at the deadline */
void timer_disarm(void);
const char *timer_mode(void);
const char *interrupt_controller(void);      /* for the stream header */
void kops_self_ipi(void);                    /* raises EV_KOPS on this CPU */
/* A new thread's first frame on its stack: resuming it calls start(entry, arg) with interrupts on */
void *thread_frame(uint8_t *stack_top, void (*start)(void (*)(void *), void *), void (*entry)(void *), void *arg);
_Noreturn void platform_off(int status);     /* leave the VM: the status is on the console's EXIT line */
/* a cache level's size in bytes (0: the highest the CPU describes), *found_level the level it is; 0 unknown */
uint64_t cache_bytes(uint64_t level, uint64_t *found_level);
/* The stream's channels of the platform beyond virtio-console and Xen's console (x86: QEMU's debug console,
 * COM2): NULL if none, else its name, with *write set and *chunk the bytes per write. */
const char *fallback_channel(void (**write)(const uint8_t *p, size_t n), uint64_t *chunk);
/* Paravirtual stolen time of the hypervisor (KVM steal time), one consistent total (ns); false: none */
bool pv_steal_init(const char **source);
uint64_t pv_steal_ns(void);
/* The arch's stop request seen where interrupts are off (the gap probe's spin; Arm: the power button waiting
 * in the GIC); x86's NMI sets stop_requested itself. */
bool arch_stop_pending(void);

/* ---- interrupts and the kernel's events (the arch's handlers report them to sched.c) ---- */
enum kernel_event { EV_NONE, EV_TIMER, EV_KOPS, EV_STOP };
/* Set by the host's stop (x86: an NMI; Arm: the power button's interrupt; Xen: the console): probes end their
 * loops, the stream ends as a signal ends a Linux agent's (every sample written, END reason 1). */
extern volatile bool stop_requested;
extern volatile uint64_t isr_entry_cycles; /* the counter read at the first instructions of the last interrupt */
extern void (*kops_ipi_hook)(void);        /* what EV_KOPS runs (the kops probe's timestamps) */
/* Whether a stop was requested, by an interrupt or by what is polled (the arch's, Xen's console input): probes
 * that spin or never block ask it in their loops; the idle thread asks it too (and stops the run). */
bool stop_pending(void);
void kernel_event(enum kernel_event event); /* from the arch's handler, interrupts off */
void *sched_switch(void *frame);            /* then: the frame to resume (another thread's: a preemption) */
/* a fault: the run fails, saying "<what> <number> (code <code>) at <at> in thread <name>" */
_Noreturn void cpu_exception(const char *what, uint64_t number, uint64_t code, uint64_t at);

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
    uint64_t expiry;
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
void ktimer_start(ktimer *t, uint64_t expiry, semaphore *give);
void ktimer_stop(ktimer *t);
void sleep_until(uint64_t deadline);
uint64_t last_timer_irq_cycles(void); /* entry counter of the interrupt that fired the last timer */
bool k_can_block(void);               /* a thread other than idle, not in an interrupt handler */
void thread_exit(void);
void set_idle_work(void (*work)(void)); /* what the idle thread does before halting */
/* What EV_STOP runs once the kernel's lists are consistent: stream_stop, registered by main.c (the stream is a
 * layer above the kernel). */
void on_stop_request(void (*handler)(void));
/* Failing: the reason on the console, then ``end`` (registered by main.c: the stream's end, which the lower
 * layers cannot call), then the VM ends with status 2 (usage_error: bad input, naming `option`) or 1. */
void on_guest_failure(void (*end)(int reason));
_Noreturn void usage_error(const char *option, const char *detail);
_Noreturn void run_error(const char *detail);
_Noreturn void guest_exit(int status);

/* ---- virtio.c: virtio-console devices on the arch's transport (x86: legacy PCI; Arm: MMIO) ---- */
typedef struct virtio_transport virtio_transport; /* the arch's: one device's registers */
/* The arch's transport operations for one device (x86_64/virtio_pci.c, aarch64/virtio_mmio.c) */
virtio_transport *virtio_console_find(unsigned index); /* the index-th console device, in the platform's order */
/* reset, ACKNOWLEDGE | DRIVER, and of the device's first 32 feature bits those in `wanted` (returned) */
uint32_t virtio_reset_and_ack(virtio_transport *t, uint32_t wanted);
uint16_t virtio_queue_size(virtio_transport *t, uint16_t queue); /* selects it */
bool virtio_queue_place(virtio_transport *t, uint16_t queue, uint8_t *memory, uint16_t size);
void virtio_driver_ok(virtio_transport *t);
void virtio_notify(virtio_transport *t, uint16_t queue);
/* The consoles: the first is the stream's, the second (explained runs) the clock exchange's; each is port 1 of
 * its device when the device offers multiport (a virtserialport, which QEMU holds back while its chardev is full),
 * else port 0 (a virtconsole, whose overflow QEMU drops) */
typedef struct vconsole vconsole;
vconsole *vconsole_open(unsigned index); /* NULL: no such device */
void vconsole_write(vconsole *c, const uint8_t *p, size_t n);
bool vconsole_read_line(vconsole *c, char *line, size_t size, uint64_t deadline); /* the host's line, bounded */

/* ---- xen.c: Xen's PV console and runstate area (the arch gives the hypercall and finds Xen) ---- */
extern bool on_xen;                         /* Xen answered and hypercalls work */
long xen_hypercall(unsigned nr, uint64_t a1, uint64_t a2, uint64_t a3); /* the arch's (x86 page, Arm HVC) */
void xen_map_shared(uint64_t paddr);        /* the arch maps a page Xen shares as ordinary memory */
bool xen_console_init(void);                /* true when the PV console is there */
bool xen_console(void);
bool xen_console_stop_requested(void);      /* a ^C on the console's input: the host's stop (no NMI on Arm) */
void xen_console_text(const char *s, size_t n);
void xen_console_stream(const uint8_t *p, size_t n); /* framed: 00 'RVS' length16 bytes */
void xen_console_flush(void);               /* finish an open frame, write held text */
void xen_shutdown(void);
bool xen_runstate_init(void);               /* registers vCPU 0's runstate area; false: refused */
bool xen_runstate_read(uint64_t *runnable_ns, uint64_t *offline_ns); /* false: mid-update, read again */

/* ---- steal.c: stolen time per sample (Xen's runstate area, KVM's steal time) ---- */
typedef struct {
    uint64_t at;                      /* the counter, read just before the totals (no wait between them) */
    uint64_t runnable_ns, offline_ns; /* totals: runnable (KVM: steal), offline (KVM: 0) */
} steal_mark;
void steal_init(void);          /* the hypervisor's source, if any */
const char *steal_source(void); /* NULL: not measured; else the header's "stolen" */
void steal_mark_now(steal_mark *mark);
/* stolen_ns, later_ns: runnable, offline (later: after the window, the next one's) */
void stolen_in_window(const steal_mark *before, uint64_t start, uint64_t end, const steal_mark *after,
                      uint64_t stolen_ns[2], uint64_t later_ns[2]);

/* ---- clocksync.c: the host aligns its clock with the samples' over the second virtio console ---- */
void clock_exchange(const char *phase); /* "start" / "end"; nothing without the device */

/* ---- stream.c ---- */
void stream_init(void); /* choose the channel: Xen PV console, virtio-console, the platform's; none stops */
typedef struct {
    const char *name;
    const char *value_field;
    const char *aux_field; /* or NULL */
    const char *const *kinds;
    const char *const *stats;
} probe_desc;
extern const char *boot_kind; /* how the guest booted (the header's guest.boot) */
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
void run_started(void);       /* the probe starts now: --duration counts from here */
uint64_t run_deadline(void);  /* UINT64_MAX without --duration */
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
extern uint64_t stress_level, stress_buffer, stress_slice_ns, stress_period_ns;
int stress_cpu_run(void);
int stress_cache_run(void);

#endif
