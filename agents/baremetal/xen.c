/* Xen PVH: the hypercall page, the PV console (the only device a PVH domU without a device model has),
 * the start-of-day memory map and leaving the domain. Written from the ABI the Xen public headers
 * document (arch-x86/cpuid.h, hvm/hvm_op.h, hvm/params.h, io/console.h, event_channel.h, sched.h,
 * arch-x86/hvm/start_info.h, vcpu.h, xen.h).
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
enum { XEN_START_MAGIC = 0x336ec578, MEMMAP_RAM = 1 };
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
_Static_assert(sizeof(struct vcpu_runstate_info) == 48, "Xen's x86-64 layout");
#define RUNSTATE_UPDATE (1ull << 63)
struct xen_hvm_param {
    uint16_t domid, pad;
    uint32_t index;
    uint64_t value;
};

bool on_xen;
static _Alignas(4096) uint8_t hypercall_page[4096];
static volatile struct xencons_interface *cons;
static uint32_t cons_port;
static size_t frame_left, frame_len; /* the open frame: bytes still to publish, its length */
static char held[TEXT_HELD];
static size_t held_len;
static bool after_frame; /* the last thing written was stream bytes: text starts on a new line */
static _Alignas(64) volatile struct vcpu_runstate_info runstate;
static bool steal_on;

/* Hypercall NR with up to three arguments through the page Xen filled (32 bytes per hypercall). Xen may
 * clobber the argument registers, and rcx/r11 as a syscall would. */
static long hypercall(unsigned nr, uint64_t a1, uint64_t a2, uint64_t a3) {
    long ret;
    __asm__ volatile("call *%[entry]"
                     : "=a"(ret), "+D"(a1), "+S"(a2), "+d"(a3)
                     : [entry] "r"(hypercall_page + nr * 32)
                     : "rcx", "r8", "r9", "r10", "r11", "memory");
    return ret;
}

static bool hvm_param(uint32_t index, uint64_t *value) {
    struct xen_hvm_param p = {.domid = DOMID_SELF, .index = index};
    if (hypercall(HYPERVISOR_hvm_op, HVMOP_get_param, (uint64_t)(uintptr_t)&p, 0) != 0) return false;
    *value = p.value;
    return true;
}

static void notify(void) {
    uint32_t port = cons_port;
    hypercall(HYPERVISOR_event_channel_op, EVTCHNOP_send, (uint64_t)(uintptr_t)&port, 0);
}

/* Xen's CPUID leaves (the first base with its signature), the hypercall page through the MSR they name,
 * then the console's page and event channel. False when this is not Xen or it offers no console. */
bool xen_init(void) {
    uint32_t r[4];
    for (uint32_t base = 0x40000000; base <= 0x40010000 && !on_xen; base += 0x100) {
        cpuid(base, 0, r);
        if (r[1] != 0x566e6558 || r[2] != 0x65584d4d || r[3] != 0x4d4d566e || r[0] < base + 2) continue;
        cpuid(base + 2, 0, r);
        uint64_t page = (uint64_t)(uintptr_t)hypercall_page;
        __asm__ volatile("wrmsr" ::"c"(r[1]), "a"((uint32_t)page), "d"((uint32_t)(page >> 32)));
        on_xen = true;
    }
    uint64_t pfn, port;
    if (!on_xen || !hvm_param(HVM_PARAM_CONSOLE_PFN, &pfn) || !hvm_param(HVM_PARAM_CONSOLE_EVTCHN, &port) ||
        !pfn)
        return false;
    cons = (volatile struct xencons_interface *)(uintptr_t)(pfn << 12);
    cons_port = (uint32_t)port;
    return true;
}

bool xen_console(void) { return cons != NULL; }

/* Publish n bytes in the ring, waiting for xenconsoled to make room; *left counts down as they become
 * visible (an interrupted write resumes from there). Interrupts stay enabled. */
static void ring_put(const uint8_t *p, size_t n, size_t *left) {
    bool told = false;
    while (n) {
        uint32_t done = cons->out_cons, prod = cons->out_prod;
        barrier();
        size_t room = sizeof cons->out - (prod - done);
        if (!room) {
            if (!told) notify(); /* once: xenconsoled rate-limits a domain's events */
            told = true;
            __asm__ volatile("pause");
            continue;
        }
        told = false;
        size_t k = n < room ? n : room;
        for (size_t i = 0; i < k; i++) cons->out[(prod + i) & (sizeof cons->out - 1)] = (char)p[i];
        barrier();
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
        while (sizeof cons->out - (cons->out_prod - cons->out_cons) < FRAME_HEADER) __asm__ volatile("pause");
        ring_put(header, FRAME_HEADER, NULL);
        frame_len = frame_left = k;
        after_frame = true;
        ring_put(p, k, &frame_left);
        p += k;
        n -= k;
    }
    xen_console_flush();
}

/* The end of the RAM the kernel was loaded into, from hvm_start_info's memory map (version 1); 0 if none. */
uint64_t pvh_memory_top(const void *start_info) {
    const uint8_t *info = start_info;
    uint32_t magic, version, entries;
    uint64_t map;
    memcpy(&magic, info, 4);
    memcpy(&version, info + 4, 4);
    if (magic != XEN_START_MAGIC || version < 1) return 0;
    memcpy(&map, info + 40, 8); /* memmap_paddr, then memmap_entries */
    memcpy(&entries, info + 48, 4);
    if (!map || map >= (4ull << 30) || entries > 128) return 0; /* our identity map ends at 4 GiB */
    for (uint32_t i = 0; i < entries; i++) {
        const uint8_t *e = (const uint8_t *)(uintptr_t)(map + 24ull * i);
        uint64_t addr, size;
        uint32_t type;
        memcpy(&addr, e, 8);
        memcpy(&size, e + 8, 8);
        memcpy(&type, e + 16, 4);
        if (type == MEMMAP_RAM && addr <= (1u << 20) && addr + size > (1u << 20)) return addr + size;
    }
    return 0;
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
        __asm__ volatile("pause");
        now = now_ns();
    }
    uint32_t reason = SHUTDOWN_poweroff;
    hypercall(HYPERVISOR_sched_op, SCHEDOP_shutdown, (uint64_t)(uintptr_t)&reason, 0);
}

/* ---- stolen time: the vCPU's runstate area ---- */

/* A reading of the runstate whose TSC bracket is longer than this is taken again: Xen may have held the vCPU
 * off inside it, before or after the copy (a reading is "as of" its first TSC only when nothing waited). Time up
 * to this long from a window's end to its mark is the guest's own steps there, not a wait. */
enum { MARK_QUIET_NS = 50000 };

/* Registers vCPU 0's runstate area. False when this is not Xen or it refuses: no stolen time is measured then. */
bool xen_steal_init(void) {
    if (!on_xen) return false;
    /* Xen marks the area while it writes it (we also re-read until the entry time holds still) */
    hypercall(HYPERVISOR_vm_assist, VMASST_CMD_enable, VMASST_TYPE_runstate_update_flag, 0);
    uint64_t area = (uint64_t)(uintptr_t)&runstate;
    if (hypercall(HYPERVISOR_vcpu_op, VCPUOP_register_runstate_memory_area, 0, (uint64_t)(uintptr_t)&area) != 0)
        return false;
    steal_on = true;
    return true;
}

bool xen_steal_measured(void) { return steal_on; }

/* The runstate as one consistent copy, as of mark->tsc: Xen rewrites it when it switches the vCPU out and in
 * again, which moves the entry time, so a copy is kept once the entry time (without its update flag) is the same
 * after it, and once no wait lies between the TSC read before it and the one after it. */
void xen_steal_mark_now(xen_steal_mark *mark) {
    const uint64_t quiet = ns_to_tsc(MARK_QUIET_NS);
    for (;;) {
        uint64_t tsc = rdtsc();
        uint64_t entry = runstate.state_entry_time;
        barrier();
        uint64_t runnable = runstate.time[RUNSTATE_runnable], offline = runstate.time[RUNSTATE_offline];
        barrier();
        if ((entry & RUNSTATE_UPDATE) || runstate.state_entry_time != entry || rdtsc() - tsc > quiet) continue;
        mark->tsc = tsc;
        mark->runnable_ns = runnable;
        mark->offline_ns = offline;
        return;
    }
}

/* What was stolen (runnable, offline) inside the window [start_tsc, end_tsc): the increase from `before` (as of
 * start_tsc or earlier) to `after` (as of its TSC, just after end_tsc), placed on the guest's own TSC alone (Xen
 * system time mapped onto the TSC through the time area was off by milliseconds now and then under nested TCG,
 * which gave a budget wait to the gap before it). Any wait between end_tsc and the after mark's reading is time
 * the guest saw pass there, and it is the next window's (the gap probe's next window starts at end_tsc): that
 * much of the increase (the newest, runnable first) is returned in later_ns (runnable, offline). Xen counts a
 * wait only when the vCPU runs again, and within one wait the vCPU is runnable (or offline) last, just before it
 * resumes, at the latest at end_tsc: what of the rest exceeds the window is from before start_tsc and cut (the
 * oldest part, offline first). */
void xen_stolen_in_window(const xen_steal_mark *before, uint64_t start_tsc, uint64_t end_tsc,
                          const xen_steal_mark *after, uint64_t stolen_ns[2], uint64_t later_ns[2]) {
    uint64_t runnable = after->runnable_ns - before->runnable_ns, offline = after->offline_ns - before->offline_ns;
    uint64_t past = after->tsc > end_tsc ? tsc_to_ns(after->tsc - end_tsc) : 0;
    uint64_t later = past > MARK_QUIET_NS ? past : 0; /* shorter: the guest's own steps to the mark */
    later_ns[0] = later < runnable ? later : runnable;
    later_ns[1] = later - later_ns[0] < offline ? later - later_ns[0] : offline;
    runnable -= later_ns[0];
    offline -= later_ns[1];
    uint64_t room = end_tsc > start_tsc ? tsc_to_ns(end_tsc - start_tsc) : 0;
    if (runnable + offline > room) {
        uint64_t cut = runnable + offline - room, off = cut < offline ? cut : offline;
        offline -= off;
        runnable -= cut - off;
    }
    stolen_ns[0] = runnable;
    stolen_ns[1] = offline;
}
