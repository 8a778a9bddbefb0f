/* Stolen time per sample: how long the hypervisor held this vCPU off inside a sample's window, from the totals it
 * keeps for the guest. Sources, the first that answers:
 *
 *   xen-runstate    Xen's runstate area of vCPU 0 (xen.c): runnable and offline ns (x86 PVH and Arm domUs)
 *   kvm-steal-time  KVM's steal-time area on x86 (MSR_KVM_STEAL_TIME, x86_64/kvm.c): ns runnable, not running
 *   kvm-pv-time     KVM's stolen-time structure on Arm (SMCCC ARM_SMCCC_HV_PV_TIME_ST, aarch64/pvtime.c): the same
 *
 * Each counts a wait only when the vCPU runs again (Xen at the switch back in, KVM when it loads the vCPU), so a
 * reading ("mark") is as of the counter read just before it provided nothing waited between that read and the one
 * after it; a mark is taken again until that holds. The header's "stolen" names the source. */
#include "kernel.h"

/* A reading of the totals whose counter bracket is longer than this is taken again: the hypervisor may have held
 * the vCPU off inside it, before or after the copy (a reading is "as of" its first counter read only when nothing
 * waited). Time up to this long from a window's end to its mark is the guest's own steps there, not a wait. */
enum { MARK_QUIET_NS = 50000 };

static const char *source;
static bool from_xen;

void steal_init(void) {
    if (xen_runstate_init()) {
        source = "xen-runstate";
        from_xen = true;
        return;
    }
    if (!pv_steal_init(&source)) source = NULL;
}

const char *steal_source(void) { return source; }

/* A bracket this long is taken as quiet anyway after MARK_TRIES readings (the tightest of them): a vCPU that is slow
 * to run the few instructions of a reading (a KVM that emulates the guest) must not loop here for ever. */
enum { MARK_TRIES = 64 };

void steal_mark_now(steal_mark *mark) {
    const uint64_t quiet = ns_to_cycles(MARK_QUIET_NS);
    uint64_t tightest = UINT64_MAX;
    for (int tries = 0; tries < MARK_TRIES || tightest == UINT64_MAX; tries++) {
        uint64_t at = cycles(), runnable, offline = 0;
        bool consistent = true;
        if (from_xen) consistent = xen_runstate_read(&runnable, &offline);
        else runnable = pv_steal_ns();
        uint64_t bracket = cycles() - at;
        if (!consistent || bracket >= tightest) continue;
        tightest = bracket;
        *mark = (steal_mark){at, runnable, offline};
        if (bracket <= quiet) return;
    }
}

/* What was stolen (runnable, offline) inside the window [start, end) (counter values): the increase from `before`
 * (as of start or earlier) to `after` (as of its counter, just after end), placed on the guest's own counter alone
 * (Xen system time mapped onto the TSC through the time area was off by milliseconds now and then under nested TCG,
 * which gave a budget wait to the gap before it). Any wait between end and the after mark's reading is time the
 * guest saw pass there, and it is the next window's (the gap probe's next window starts at end): that much of the
 * increase (the newest, runnable first) is returned in later_ns (runnable, offline). The hypervisor counts a wait
 * only when the vCPU runs again, and within one wait the vCPU is runnable (or offline) last, just before it
 * resumes, at the latest at end: what of the rest exceeds the window is from before start and cut (the oldest
 * part, offline first). */
void stolen_in_window(const steal_mark *before, uint64_t start, uint64_t end, const steal_mark *after,
                      uint64_t stolen_ns[2], uint64_t later_ns[2]) {
    uint64_t runnable = after->runnable_ns - before->runnable_ns, offline = after->offline_ns - before->offline_ns;
    uint64_t past = after->at > end ? cycles_to_ns(after->at - end) : 0;
    uint64_t later = past > MARK_QUIET_NS ? past : 0; /* shorter: the guest's own steps to the mark */
    later_ns[0] = later < runnable ? later : runnable;
    later_ns[1] = later - later_ns[0] < offline ? later - later_ns[0] : offline;
    runnable -= later_ns[0];
    offline -= later_ns[1];
    uint64_t room = end > start ? cycles_to_ns(end - start) : 0;
    if (runnable + offline > room) {
        uint64_t cut = runnable + offline - room, off = cut < offline ? cut : offline;
        offline -= off;
        runnable -= cut - off;
    }
    stolen_ns[0] = runnable;
    stolen_ns[1] = offline;
}
