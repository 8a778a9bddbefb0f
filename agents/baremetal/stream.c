/* The sample stream (docs/sample-stream.md) from the guest: the same header and 32-byte records as
 * the Linux agents. Records go into a RAM ring first; the idle thread writes the ring out to the
 * stream channel while nothing else runs, and probes that never idle (gap, workload) write between
 * measurements or at the end. Channels (stream_init chooses): Xen's PV console (xen.c, framed), virtio-console
 * (virtio.c, on the arch's transport), or the platform's fallback (x86: QEMU's debug console, COM2). */
#include "kernel.h"

typedef struct {
    uint64_t t_ns;
    int64_t value;
    uint64_t aux;
    uint16_t cpu, thread, kind, flags;
} record;
_Static_assert(sizeof(record) == 32, "record layout is part of the file format");

enum { META = 1, META_DROPPED = 1, META_END = 2, META_STAT = 3, META_STOLEN = 4 };
enum { RING_BYTES = 32u << 20 };

static const char *stream_channel = "none";
static uint8_t ring[RING_BYTES];
static volatile uint64_t head, tail; /* bytes produced / written out */
static uint64_t written_records, dropped;
static const probe_desc *probe;
static bool draining, ending;
static uint64_t chunk = 512;             /* bytes per write: a virtio buffer is one host write */
static vconsole *stream_console;
static void (*fallback_write)(const uint8_t *p, size_t n);

static void channel_write(const uint8_t *p, size_t n) {
    if (xen_console()) xen_console_stream(p, n);
    else if (stream_console) vconsole_write(stream_console, p, n);
    else fallback_write(p, n);
}

/* Xen's console when there is one (it carries the text too); else the first virtio-console; else what the
 * platform has. */
void stream_init(void) {
    if (xen_console()) { /* framed beside the console text (xen.c) */
        stream_channel = "xen-console";
        chunk = 4096;
        return;
    }
    stream_console = vconsole_open(0);
    if (stream_console) {
        stream_channel = "virtio-console";
        chunk = 65536;
        return;
    }
    const char *name = fallback_channel(&fallback_write, &chunk);
    if (!name) run_error("no stream channel: no virtio-console, and none of the platform's fallbacks (x86: QEMU's "
                         "debug console at port 0xe9, a 16550 at COM2) answers");
    stream_channel = name;
}

static void put(const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) ring[(head + i) % RING_BYTES] = p[i];
    barrier();
    head += n;
}

uint64_t stream_pending(void) { return head - tail; }

_Noreturn void stop_now(void) {
    irq_disable();
    stream_end(1);
    guest_exit(EXIT_OK);
}

void stream_stop(void) {
    if (!draining) stop_now(); /* else the drain stops between two of its writes */
}

bool stream_room(size_t records) { return RING_BYTES - (head - tail) >= records * sizeof(record); }

/* Writes out what is buffered, a chunk at a time, interruptible between chunks (and within them:
 * rep outsb takes interrupts between iterations). Only the idle thread or the producing thread drain. */
void stream_drain(void) {
    if (draining) return;
    draining = true;
    while (tail != head) {
        if (stop_requested && probe && !ending) {
            draining = false;
            stop_now();
        }
        uint64_t start = tail % RING_BYTES, avail = head - tail;
        uint64_t n = avail < chunk ? avail : chunk;
        if (n > RING_BYTES - start) n = RING_BYTES - start;
        channel_write(ring + start, n);
        barrier();
        tail += n;
    }
    draining = false;
}

static void push(const record *r) {
    if (!stream_room(1)) {
        dropped++;
        return;
    }
    put(r, sizeof *r);
}

static void json_names(text *t, const char *const *names) {
    text_char(t, '[');
    for (int i = 0; names && names[i]; i++) {
        if (i) text_char(t, ',');
        text_json_str(t, names[i]);
    }
    text_char(t, ']');
}

void stream_begin(const probe_desc *desc, const char *params_json) {
    static char buf[4096];
    probe = desc;
    text t = {buf, 0, sizeof buf};
    text_str(&t, "{\"format\":1,\"probe\":");
    text_json_str(&t, desc->name);
    text_str(&t, ",\"value_field\":");
    text_json_str(&t, desc->value_field);
    text_str(&t, ",\"aux_field\":");
    if (desc->aux_field) text_json_str(&t, desc->aux_field);
    else text_str(&t, "null");
    text_str(&t, ",\"kinds\":");
    json_names(&t, desc->kinds);
    text_str(&t, ",\"stats\":");
    json_names(&t, desc->stats);
    text_str(&t, ",\"params\":");
    text_str(&t, params_json);
    /* CLOCK_MONOTONIC of this guest: counter time since the VM's reset (there is no other clock here) */
    text_str(&t, ",\"clock\":\"CLOCK_MONOTONIC\",\"start_monotonic_ns\":");
    text_u64(&t, now_ns());
    text_str(&t, ",\"start_realtime_ns\":");
    text_u64(&t, rtc_unix_ns());
    text_str(&t, ",\"cycles_hz\":");
    text_u64(&t, cycles_hz);
    /* no paging and a strictly priority-preemptive kernel: what SCHED_FIFO and mlockall give a Linux agent */
    text_str(&t, ",\"rt\":{\"fifo\":true,\"mlockall\":true,\"cpu_dma_latency\":null}");
    text_str(&t, ",\"host\":{\"hostname\":\"rtvirt-baremetal\",\"kernel\":\"rtvirt-baremetal-" RTVB_VERSION "\"");
    text_str(&t, ",\"version\":\"rtvirt bare-metal guest " RTVB_VERSION "\",\"machine\":\"" ARCH_NAME "\",\"cpus\":1}");
    text_str(&t, ",\"guest\":{\"kind\":\"baremetal\",\"boot\":");
    text_json_str(&t, boot_kind);
    text_str(&t, ",\"timer\":");
    text_json_str(&t, timer_mode());
    text_str(&t, ",\"interrupt_controller\":");
    text_json_str(&t, interrupt_controller());
    text_str(&t, ",\"" ARCH_CYCLES_KEY "\":");
    text_json_str(&t, cycles_source);
    text_str(&t, ",\"channel\":");
    text_json_str(&t, stream_channel);
    text_char(&t, '}');
    /* declares the STOLEN meta records (docs/sample-stream.md): readers accept kind 4 only then */
    if (steal_source()) {
        text_str(&t, ",\"stolen\":");
        text_json_str(&t, steal_source());
    }
    text_char(&t, '}');
    if (t.len + 1 >= t.cap) run_error("the stream header does not fit its buffer");
    uint32_t version = 1, len = (uint32_t)t.len;
    put("RTVIRT\0S", 8);
    put(&version, 4);
    put(&len, 4);
    put(t.buf, t.len);
    static const uint8_t zeros[8];
    put(zeros, (8 - (16 + t.len) % 8) % 8);
}

void stream_sample(uint64_t t_ns, int64_t value, uint64_t aux, uint16_t thread, uint16_t kind) {
    record r = {t_ns, value, aux, 0, thread, kind, 0};
    push(&r);
    written_records++;
}

void stream_stat(uint16_t thread, uint16_t key, int64_t value) {
    record r = {now_ns(), value, key, 0, thread, META_STAT, META};
    push(&r);
}

void stream_stolen(uint64_t t_ns, uint16_t thread, uint64_t runnable_ns, uint64_t offline_ns) {
    if (!runnable_ns && !offline_ns) return; /* only samples that lost time carry one */
    record r = {t_ns, (int64_t)runnable_ns, offline_ns, 0, thread, META_STOLEN, META};
    push(&r);
}

/* With --confirm=virtio the host writes "RTVIRT-ACK <records it holds>" on the virtio console once it has the
 * END record: wait for it (bounded) before the guest leaves its VM, whose end would take with it what the host
 * side had not read yet, and say on the console what came of it, in the Linux agent's words (--confirm). */
static void await_confirmation(void) {
    char line[48];
    bool heard = stream_console &&
                 vconsole_read_line(stream_console, line, sizeof line, cycles() + ns_to_cycles(P.confirm_timeout_ns));
    uint64_t held = 0;
    bool readable = heard && !strncmp(line, "RTVIRT-ACK ", 11) && line[11];
    for (const char *c = line + 11; readable && *c; c++) {
        readable = *c >= '0' && *c <= '9' && held < UINT64_MAX / 10 - 9;
        held = held * 10 + (uint64_t)(*c - '0');
    }
    text t = {(char[96]){0}, 0, 96};
    text_str(&t, !heard ? "RTVIRT-DELIVERY unconfirmed " : !readable ? "RTVIRT-DELIVERY unreadable "
                 : held == written_records ? "RTVIRT-DELIVERY confirmed " : "RTVIRT-DELIVERY short ");
    text_u64(&t, written_records);
    if (readable && held != written_records) {
        text_char(&t, ' ');
        text_u64(&t, held);
    }
    console_line(t.buf);
}

void stream_end(int reason) {
    if (!probe) return;
    /* The idle thread may be preempted inside a write: let it finish (its chunk is not yet counted in
     * tail, and writing from tail again would repeat it). Error and stop paths that cannot block go on. */
    while (draining && k_can_block()) sleep_until(cycles() + ns_to_cycles(100000));
    ending = true;
    written_records -= dropped;
    /* the trailer always fits: keep room by writing out first */
    stream_drain();
    record drop = {now_ns(), (int64_t)dropped, 0, 0, 0, META_DROPPED, META};
    record end = {now_ns(), (int64_t)written_records, (uint64_t)reason, 0, 0, META_END, META};
    put(&drop, sizeof drop);
    put(&end, sizeof end);
    draining = false; /* an error may have stopped a drain half-way: finish it here */
    stream_drain();
    probe = NULL;
    /* a stopped or failed run leaves at once (the host is tearing it down): its END count is checked */
    if (*P.confirm && reason == 0) await_confirmation();
}
