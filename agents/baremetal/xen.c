/* Xen, on either architecture: the PV console (the only device a PVH domU without a device model has, and an
 * Arm domU's console), the vCPU's runstate area and leaving the domain. The arch finds Xen and makes the
 * hypercalls (x86_64/xen_pvh.c: CPUID leaves and the hypercall page; aarch64/xen_arm.c: the device tree and
 * HVC). Written from the ABI the Xen public headers document (hvm/hvm_op.h, hvm/params.h, io/console.h,
 * event_channel.h, sched.h, vcpu.h, xen.h).
 *
 * One console carries both the text (READY/EXIT lines, errors) and the sample stream, so stream bytes
 * travel in frames: 0x00 'R' 'V' 'S', a 16-bit little-endian length, then the bytes. Text never holds a
 * 0x00 byte; the host (rtvirt.environments.baremetal.ConsoleDemux) splits dom0's console log into both.
 * A frame, once begun, is finished before anything else is written: text written meanwhile (an error
 * from a thread that preempted the writer) waits in a small buffer until the frame is closed. */
#include "kernel.h"

enum { HYPERVISOR_vm_assist = 21, HYPERVISOR_vcpu_op = 24, HYPERVISOR_sched_op = 29, HYPERVISOR_event_channel_op = 32,
       HYPERVISOR_hvm_op = 34 };
enum { VCPUOP_register_runstate_memory_area = 5, VMASST_CMD_enable = 0, VMASST_TYPE_runstate_update_flag = 5,
       RUNSTATE_runnable = 1, RUNSTATE_offline = 3 };
enum { HVMOP_get_param = 1, HVM_PARAM_CONSOLE_PFN = 17, HVM_PARAM_CONSOLE_EVTCHN = 18, DOMID_SELF = 0x7FF0 };
enum { EVTCHNOP_send = 4, SCHEDOP_shutdown = 2, SHUTDOWN_poweroff = 0 };
enum { FRAME_HEADER = 6, TEXT_HELD = 1024 };

struct xencons_interface {
    char in[1024];
    char out[2048];
    uint32_t in_cons, in_prod;
    uint32_t out_cons, out_prod;
};
/* vcpu.h: Xen copies the vCPU's runstate here each time it schedules the vCPU (in or out) */
struct vcpu_runstate_info {
    int32_t state;
    uint64_t state_entry_time; /* Xen system time (ns) the state was entered; bit 63: an update is under way */
    uint64_t time[4];          /* ns spent in running, runnable, blocked, offline */
};
_Static_assert(sizeof(struct vcpu_runstate_info) == 48, "Xen's layout (x86-64 and Arm: 64-bit fields 8-aligned)");
#define RUNSTATE_UPDATE (1ull << 63)
struct xen_hvm_param {
    uint16_t domid, pad;
    uint32_t index;
    uint64_t value;
};

bool on_xen;
static volatile struct xencons_interface *cons;
static uint32_t cons_port;
static size_t frame_left, frame_len; /* the open frame: bytes still to publish, its length */
static char held[TEXT_HELD];
static size_t held_len;
static bool after_frame; /* the last thing written was stream bytes: text starts on a new line */
static _Alignas(64) volatile struct vcpu_runstate_info runstate;

static bool hvm_param(uint32_t index, uint64_t *value) {
    struct xen_hvm_param p = {.domid = DOMID_SELF, .index = index};
    if (xen_hypercall(HYPERVISOR_hvm_op, HVMOP_get_param, (uint64_t)(uintptr_t)&p, 0) != 0) return false;
    *value = p.value;
    return true;
}

static void notify(void) {
    uint32_t port = cons_port;
    xen_hypercall(HYPERVISOR_event_channel_op, EVTCHNOP_send, (uint64_t)(uintptr_t)&port, 0);
}

/* The console's page and event channel (HVM parameters). False when Xen offers none (an Arm domU booted by Xen
 * itself, without a dom0 to run xenconsoled). */
bool xen_console_init(void) {
    uint64_t pfn, port;
    if (!on_xen || !hvm_param(HVM_PARAM_CONSOLE_PFN, &pfn) || !hvm_param(HVM_PARAM_CONSOLE_EVTCHN, &port) || !pfn)
        return false;
    xen_map_shared(pfn << 12);
    cons = (volatile struct xencons_interface *)(uintptr_t)(pfn << 12);
    cons_port = (uint32_t)port;
    return true;
}

bool xen_console(void) { return cons != NULL; }

/* The host asks the domain to stop by writing ^C (0x03) to its console (dom0: the console's pty, which
 * xenconsoled copies into the ring's input half): Xen on Arm gives a domU no NMI to take. Polled (the idle thread,
 * spinning probes); what else comes in is read and dropped. */
bool xen_console_stop_requested(void) {
    if (!cons) return false;
    uint32_t at = cons->in_cons, prod = cons->in_prod;
    if (at == prod) return false;
    rmb();
    bool stop = false;
    for (; at != prod; at++) stop |= cons->in[at & (sizeof cons->in - 1)] == 0x03;
    mb();
    cons->in_cons = at;
    notify();
    return stop;
}

/* Publish n bytes in the ring, waiting for xenconsoled to make room; *left counts down as they become
 * visible (an interrupted write resumes from there). Interrupts stay enabled. */
static void ring_put(const uint8_t *p, size_t n, size_t *left) {
    bool told = false;
    while (n) {
        uint32_t done = cons->out_cons, prod = cons->out_prod;
        rmb();
        size_t room = sizeof cons->out - (prod - done);
        if (!room) {
            if (!told) notify(); /* once: xenconsoled rate-limits a domain's events */
            told = true;
            cpu_relax();
            continue;
        }
        told = false;
        size_t k = n < room ? n : room;
        for (size_t i = 0; i < k; i++) cons->out[(prod + i) & (sizeof cons->out - 1)] = (char)p[i];
        wmb(); /* the bytes before the index that publishes them */
        cons->out_prod = prod + (uint32_t)k;
        if (left) *left -= k;
        p += k;
        n -= k;
    }
    notify();
}

static void text_now(const char *s, size_t n) {
    if (after_frame && n) {
        ring_put((const uint8_t *)"\n", 1, NULL);
        after_frame = false;
    }
    ring_put((const uint8_t *)s, n, NULL);
}

void xen_console_text(const char *s, size_t n) {
    if (frame_left) { /* a frame is open: keep the text for its end */
        for (size_t i = 0; i < n && held_len < sizeof held; i++) held[held_len++] = s[i];
        return;
    }
    text_now(s, n);
}

/* Stream bytes as frames. A call that finds a frame open is the same chunk again (the stream's tail did
 * not move while the first writer was interrupted): the bytes already published are skipped. */
void xen_console_stream(const uint8_t *p, size_t n) {
    if (frame_left) {
        size_t sent = frame_len - frame_left;
        ring_put(p + sent, frame_left, &frame_left);
        p += frame_len;
        n -= frame_len;
    }
    while (n) {
        size_t k = n < 0xFFFF ? n : 0xFFFF;
        uint8_t header[FRAME_HEADER] = {0, 'R', 'V', 'S', (uint8_t)k, (uint8_t)(k >> 8)};
        /* the header goes in whole or not at all: wait for its room first */
        while (sizeof cons->out - (cons->out_prod - cons->out_cons) < FRAME_HEADER) cpu_relax();
        ring_put(header, FRAME_HEADER, NULL);
        frame_len = frame_left = k;
        after_frame = true;
        ring_put(p, k, &frame_left);
        p += k;
        n -= k;
    }
    xen_console_flush();
}

/* Before the last text: an open frame (a writer that never came back) is finished with filler, which
 * the stream reader refuses after its valid prefix; held text goes out. */
void xen_console_flush(void) {
    if (!cons) return;
    static const uint8_t filler[64];
    while (frame_left) ring_put(filler, frame_left < sizeof filler ? frame_left : sizeof filler, &frame_left);
    if (held_len) {
        size_t n_held = held_len;
        held_len = 0;
        text_now(held, n_held);
    }
}

/* The domain ends itself (its status is on the console's EXIT line), once xenconsoled has taken every byte
 * of the ring: a domain destroyed with bytes still in it loses the stream's end (its END record). Bounded:
 * a dom0 that stopped reading must not keep the domain alive; the host then counts what is missing. */
enum { DRAIN_WAIT_NS = 10000000000ull };
void xen_shutdown(void) {
    uint64_t now = now_ns(), give_up = now + DRAIN_WAIT_NS, told = 0;
    while (cons && cons->out_cons != cons->out_prod && now < give_up) {
        if (now - told > 10000000ull) { /* every 10 ms: xenconsoled rate-limits a domain's events */
            notify();
            told = now;
        }
        cpu_relax();
        now = now_ns();
    }
    uint32_t reason = SHUTDOWN_poweroff;
    xen_hypercall(HYPERVISOR_sched_op, SCHEDOP_shutdown, (uint64_t)(uintptr_t)&reason, 0);
}

/* ---- stolen time: the vCPU's runstate area (steal.c places it in each sample's window) ---- */

/* Registers vCPU 0's runstate area. False when this is not Xen or it refuses: no stolen time is measured then. */
bool xen_runstate_init(void) {
    if (!on_xen) return false;
    /* Xen marks the area while it writes it (we also re-read until the entry time holds still) */
    xen_hypercall(HYPERVISOR_vm_assist, VMASST_CMD_enable, VMASST_TYPE_runstate_update_flag, 0);
    uint64_t area = (uint64_t)(uintptr_t)&runstate; /* a guest virtual address: our map is the identity */
    return xen_hypercall(HYPERVISOR_vcpu_op, VCPUOP_register_runstate_memory_area, 0, (uint64_t)(uintptr_t)&area) == 0;
}

/* One consistent copy of the totals: Xen rewrites the area when it switches the vCPU out and in again, which moves
 * the entry time, so a copy holds once the entry time (without its update flag) is the same after it. */
bool xen_runstate_read(uint64_t *runnable_ns, uint64_t *offline_ns) {
    uint64_t entry = runstate.state_entry_time;
    rmb();
    *runnable_ns = runstate.time[RUNSTATE_runnable];
    *offline_ns = runstate.time[RUNSTATE_offline];
    rmb();
    return !(entry & RUNSTATE_UPDATE) && runstate.state_entry_time == entry;
}
