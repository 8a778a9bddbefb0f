"""The VM layer (QEMU, libvirt): was the measuring vCPU's thread running on its host CPU, and if not, what ran.

A guest's latency window is on the guest's clock; what delays it on the host is whatever holds the host CPU
(pCPU) its vCPU thread runs on. This source traces ``sched:sched_switch`` on the vCPUs' pCPUs in a tracefs
instance of its own, follows each vCPU thread on and off its pCPU, and turns every task that ran there while
the vCPU was off into a "vCPU not running: <comm>/<pid> ran" occupancy, naming QEMU's own threads (this VM's
other vCPUs, its emulator threads) and the vCPUs of the other VMs rtvirt started (stressor VMs) as such.
Under KVM it also traces ``kvm:kvm_exit``/``kvm_entry`` of the vCPU threads: exits by reason, as ``perf kvm
stat`` reports them. Host times become guest times through the clock exchange (explain.clocksync).

A long run's trace goes through the flight recorder (explain.recorder) like the host layer's: the guest's samples
are placed on the host's clock by the start exchange while the run goes, each window widened by that
exchange's uncertainty and by how far the guest's clock may have drifted since (``DRIFT_BOUND_PPM``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import heapq
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .clocksync import ClockExchange, ClockMap
from .model import CollectContext, Layer, LayerTrace, Occupancy
from .recorder import RING_KB, FlightRecorder, KeepRule, bound_notes, start_recording
from .tracefs import (
    GAP_EVENT,
    TEXT_RESOLUTION_NS,
    TraceEvent,
    TracefsAccess,
    TracefsInstance,
    TracingUnavailable,
    body_fields,
    untraced_switch_in,
)
from .vcpus import forget_vcpus, register_vcpus, vcpu_owner

__all__ = ["VmSource", "read_events"]

COMM_LIMIT = 32
KEEP_AROUND_NS = 5_000_000  # occupancies kept this far around an outlier window (the report's timelines)
# how fast a guest's clock may run against the host's while the run goes (the end exchange measures it only
# afterwards): over twice the most measured here under TCG (-414 to +382 ppm); kvmclock guests stay far below
DRIFT_BOUND_PPM = 1000
MAX_FILTERED_THREADS = 64  # QEMU threads named in the wake-up filter (a kernel filter has a bounded length)
WAKEUP_RING_KB = 1024  # kernel ring per CPU for the vCPU threads' own wake-ups (a few thousand a second at most)


def _printable(text: str) -> str:
    """A comm from the trace (untrusted): printable and bounded."""
    return re.sub(r"[^ -~]", "?", text)[:COMM_LIMIT]


# ---- the trace -----------------------------------------------------------------------------------------------

# a comm may hold spaces ("CPU 0/TCG"): the fields around it delimit it
SWITCH = re.compile(r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>\d+) prev_prio=(?P<prev_prio>-?\d+) "
                    r"prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>.*) next_pid=(?P<next_pid>\d+) "
                    r"next_prio=(?P<next_prio>-?\d+)")
# VMX prints its exit reasons in capitals (HLT, EPT_VIOLATION), SVM in lower case (hlt, npf, msr, io, intr, vintr,
# "PF excp"); arm64 prints the exception type, then for a trap its class: "TRAP: HSR_EC: 0x0024 (DABT_LOW), PC: ..."
_X86_EXIT = re.compile(r"reason (?P<reason>.+?) rip 0x")
_ARM64_EXIT = re.compile(r"(?P<type>[A-Z_]+): HSR_EC: 0x[0-9a-fA-F]+ \((?P<class>[A-Za-z0-9_]+)\)")


def exit_reason(body: str) -> str:
    """A kvm_exit event's reason as the kernel names it (x86: the exit reason; arm64: the exception class of a
    trap, else the exception type: IRQ, SERROR, ...); "" when the body says none."""
    if (x86 := _X86_EXIT.search(body)) is not None:
        return _printable(x86["reason"])
    if (arm := _ARM64_EXIT.search(body)) is not None:
        return arm["class"] if arm["type"] == "TRAP" else arm["type"]
    return ""


@dataclass(frozen=True, slots=True)
class Switch:
    ts_ns: int
    cpu: int
    prev_pid: int
    prev_tgid: int | None  # the process of the task that left (the trace's tgid column)
    prev_comm: str
    prev_prio: int
    prev_state: str
    next_pid: int
    next_comm: str
    next_prio: int


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A task woken onto ``target_cpu``, recorded on ``cpu`` (whichever traced CPU woke it)."""

    ts_ns: int
    pid: int
    target_cpu: int
    cpu: int


@dataclass(frozen=True, slots=True)
class KvmEvent:
    ts_ns: int
    cpu: int
    pid: int
    entry: bool
    reason: str


@dataclass(frozen=True, slots=True, order=True)
class Resume:
    """The trace of ``cpu`` resumes at ``ts_ns`` after a stretch the flight recorder did not keep."""

    ts_ns: int
    cpu: int


@dataclass(slots=True)
class ParsedTrace:
    switches: list[Switch] = field(default_factory=list)
    wakeups: list[Wakeup] = field(default_factory=list)
    kvm: list[KvmEvent] = field(default_factory=list)
    unreadable: int = 0
    resumes: dict[int, list[int]] = field(default_factory=dict)  # cpu -> where its kept trace resumes


def read_events(events: Iterable[TraceEvent], in_order: bool = False) -> ParsedTrace:
    """sched_switch, sched_wakeup and kvm_exit/kvm_entry events (explain.tracefs), in time order across CPUs (a
    vCPU thread that is not pinned moves between them); ``in_order``: they come so already (then they are taken
    one at a time, never held all at once). Where the kernel lost events (a gap marker), what was known of that CPU
    is forgotten (a resume point)."""
    parsed = ParsedTrace()
    for event in events if in_order else sorted(events, key=lambda e: e.ts_ns):
        if event.event == "sched_switch":
            switch = SWITCH.match(event.body)
            if switch is None:
                parsed.unreadable += 1
                continue
            parsed.switches.append(Switch(event.ts_ns, event.cpu, int(switch["prev_pid"]), event.tgid,
                                          _printable(switch["prev_comm"]), int(switch["prev_prio"]),
                                          switch["prev_state"], int(switch["next_pid"]),
                                          _printable(switch["next_comm"]), int(switch["next_prio"])))
        elif event.event == "sched_wakeup":
            fields = body_fields(event.body)
            if fields.get("pid", "").isdigit() and fields.get("target_cpu", "").isdigit():
                parsed.wakeups.append(Wakeup(event.ts_ns, int(fields["pid"]), int(fields["target_cpu"]),
                                             event.cpu))
        elif event.event == GAP_EVENT:  # the kernel lost events here (its ring overran): nothing known across
            parsed.resumes.setdefault(event.cpu, []).append(event.ts_ns)
        elif event.event in ("kvm_exit", "kvm_entry"):
            parsed.kvm.append(KvmEvent(event.ts_ns, event.cpu, event.pid, event.event == "kvm_entry",
                                       exit_reason(event.body) if event.event == "kvm_exit" else ""))
    return parsed


# ---- who ran instead ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class VmThreads:
    """The traced VM's threads: its vCPUs (index -> host tid) and its QEMU process (whose other threads are the
    emulator's: the main loop, I/O and RCU threads, workers)."""

    vm: str
    vcpus: Mapping[int, int]
    qemu_pid: int
    vmm_threads: frozenset[int] = frozenset()  # its QEMU's other threads, as far as known (tgid says the rest)


def _cause(pid: int, tgid: int | None, comm: str, threads: VmThreads) -> tuple[str, str, dict[str, str | int]]:
    """The name of a task that ran where the vCPU waited, its culprit (no pid: this VM's vCPU N, a QEMU thread of
    this VM by name, another VM's vCPU, a host task by comm) and what kind of thread it is."""
    own_vcpu = next((index for index, tid in threads.vcpus.items() if tid == pid), None)
    if own_vcpu is not None:
        return (f"vCPU not running: this VM's vCPU {own_vcpu} ({comm}/{pid}) ran", f"this VM's vCPU {own_vcpu}",
                {"ran": "own-vcpu"})
    if tgid == threads.qemu_pid:
        return (f"vCPU not running: QEMU thread {comm}/{pid} of this VM ran", f"QEMU thread {comm} of this VM",
                {"ran": "qemu-thread"})
    other = vcpu_owner(pid)
    if other is not None:
        return f"vCPU not running: {other} ({comm}/{pid}) ran", other, {"ran": "other-vm-vcpu", "vm": other}
    return f"vCPU not running: {comm}/{pid} ran", f"task {comm}", {"ran": "task"}


def _priority(prio: int) -> dict[str, str | int]:
    """sched_switch's prio is the kernel's: below 100 a real-time priority (99 - prio), -1 deadline."""
    if prio < 0:
        return {"policy": "SCHED_DEADLINE"}
    if prio < 100:
        return {"policy": "real-time", "priority": 99 - prio}
    return {"policy": "normal", "nice": prio - 120}


# how a vCPU thread that left its pCPU not runnable is named, by the state it left in (sched_switch's prev_state)
_OFF_STATES = {
    "S": ("vcpu-asleep", "vCPU asleep, not woken yet (its thread in state S: the guest idle, or waiting in the VMM)"),
    "D": ("vcpu-asleep", "vCPU asleep, not woken yet (its thread in state D: host I/O, a page fault)"),
    "T": ("vcpu-stopped", "vCPU thread stopped (state T: a signal stopped the VMM)"),
    "t": ("vcpu-stopped", "vCPU thread stopped (state t: a debugger holds it)"),
}
MAX_BYSTANDERS = 3


@dataclass
class _Off:
    """A vCPU thread off its pCPU: since when, in which state, where; when and onto which pCPU it was woken."""

    left: int
    state: str
    cpu: int
    woken: tuple[int, int] | None = None
    bystanders: list[str] = field(default_factory=list)  # what ran on its pCPU meanwhile (not its cause)

    @property
    def runnable(self) -> bool:
        return self.state.startswith("R")


class _VcpuTimeline:
    """The VM trace read in time order: which vCPU thread was off its pCPU when, and what held it (``found``)."""

    def __init__(self, threads: VmThreads) -> None:
        self.threads = threads
        self.by_tid = {tid: index for index, tid in threads.vcpus.items()}
        self.off: dict[int, _Off] = {}  # vCPU tid -> its stretch off its pCPU (absent: running, or not seen)
        self.seen: set[int] = set()  # vCPU tids seen since the trace (or its CPU's kept trace) began
        self.current: dict[int, tuple[int, str, int, int]] = {}  # cpu -> (pid, comm, prio, since)
        self.known_from: dict[int, int] = {}  # cpu -> where its trace (last) began
        self.last_ts: dict[int, int] = {}  # cpu -> its last event
        self.tgids: dict[int, int] = {}
        self.woken: dict[tuple[int, int], int] = {}  # (cpu, pid) -> its last wake-up onto that CPU
        # cpu -> {tid: since} of this VM's own QEMU threads (not its vCPUs) runnable there and not running: the
        # main loop or an I/O thread that would wake a sleeping vCPU, itself kept waiting for the pCPU
        self.vmm_waiting: dict[int, dict[int, int]] = {}
        self.found: list[Occupancy] = []

    def _detail(self, tid: int, cpu: int, state: str, extra: dict[str, str | int]) -> dict[str, str | int]:
        return {"vcpu": self.by_tid[tid], "host_cpu": cpu, "vcpu_state": state, **extra}

    def ran(self, task: tuple[int, str, int, int], cpu: int, until: int, switch_in: str | None) -> None:
        """``task`` held ``cpu`` until ``until``: its part while a runnable vCPU waited for that pCPU (preempted,
        or woken from sleep); a sleeping or stopped vCPU's wait is its own state's, the task only a bystander."""
        pid, comm, prio, since = task
        for tid, off in self.off.items():
            begin = max(since, off.left)
            if begin >= until:
                continue
            woke_at, woke_on = off.woken if off.woken is not None else (until, off.cpu)
            stretches = [(begin, until, "preempted", off.cpu)] if off.runnable else \
                [(max(begin, woke_at), until, "woken", woke_on)]
            if not off.runnable and off.cpu == cpu and pid and begin < woke_at:
                if len(off.bystanders) < MAX_BYSTANDERS and comm not in off.bystanders:
                    off.bystanders.append(comm)
                # asleep, but the VMM's thread that would wake it waited for this pCPU meanwhile: the task held
                # the vCPU's wake-up back
                waited = min(self.vmm_waiting.get(cpu, {}).values(), default=None)
                if waited is not None and max(begin, waited) < min(until, woke_at):
                    stretches.append((max(begin, waited), min(until, woke_at), "asleep, its VMM waiting", cpu))
            for start, end, state in ((a, b, c) for a, b, c, on in stretches if b > a and on == cpu):
                self._waited(tid, task, cpu, start, end, state, switch_in)

    def _waited(self, tid: int, task: tuple[int, str, int, int], cpu: int, start: int, end: int, state: str,
                switch_in: str | None) -> None:
        pid, comm, prio, _ = task
        vcpu = self.by_tid[tid]
        if pid == 0:  # runnable, and its pCPU idled: not run (throttled, not picked yet)
            cause = "vCPU runnable, not run while its pCPU idled (throttled, or not yet picked)"
            self.found.append(Occupancy("vm", start, end, cause, "vcpu-waiting", vcpu,
                                        self._detail(tid, cpu, state, {}), culprit=cause))
            return
        cause, culprit, detail = _cause(pid, self.tgids.get(pid), comm, self.threads)
        detail.update({"comm": comm, "pid": pid, **_priority(prio), **({"switch_in": switch_in} if switch_in else {})})
        variant = {"woken": "woken, waiting for its pCPU", "preempted": "preempted"}.get(
            state, "asleep: the VMM thread to wake it waited for its pCPU")
        self.found.append(Occupancy("vm", start, end, cause, "vcpu-preempted", vcpu,
                                    self._detail(tid, cpu, state, detail), culprit=culprit, variant=variant))

    def back(self, tid: int, at: int) -> None:
        """The vCPU runs again (or what is known of it ends) at ``at``: its time asleep or stopped until it was
        woken is its state's part."""
        off = self.off.pop(tid, None)
        if off is None or off.runnable:
            return
        until = min(at, off.woken[0]) if off.woken is not None else at
        if until <= off.left:
            return
        kind, cause = _OFF_STATES.get(off.state[:1], ("vcpu-asleep", f"vCPU asleep, not woken yet (its thread in "
                                                                     f"state {off.state[:4]})"))
        detail = self._detail(tid, off.cpu, "stopped" if kind == "vcpu-stopped" else "sleeping",
                              {"thread_state": off.state[:4]})
        if off.bystanders:
            detail["ran_meanwhile"] = ", ".join(off.bystanders)
        self.found.append(Occupancy("vm", off.left, until, cause, kind, self.by_tid[tid], detail,
                                    culprit=cause.partition(":")[0] + ")" if ":" in cause else cause))

    def unseen_until(self, tid: int, cpu: int, at: int) -> None:
        """A vCPU switched in that the trace never saw leave: it was off since that CPU's trace began."""
        since = self.known_from.get(cpu, at)
        if at > since:
            cause = "vCPU not running (since before the kept trace: why is not known)"
            self.found.append(Occupancy("vm", since, at, cause, "vcpu-waiting", self.by_tid[tid],
                                        self._detail(tid, cpu, "unknown", {}), culprit=cause))

    def resume(self, event: Resume) -> None:
        """The trace of a CPU resumes after a stretch that was not kept: what was known of it is forgotten."""
        self.current.pop(event.cpu, None)
        for tid in [tid for tid, off in self.off.items() if off.cpu == event.cpu]:
            self.back(tid, self.last_ts.get(event.cpu, event.ts_ns))
            self.seen.discard(tid)
        self.seen -= {tid for tid in self.seen if tid not in self.off}  # (running ones: from their next leaving)
        for key in [key for key in self.woken if key[0] == event.cpu]:
            del self.woken[key]
        self.vmm_waiting.pop(event.cpu, None)
        self.known_from[event.cpu] = event.ts_ns

    def _vmm_thread(self, pid: int) -> bool:
        return pid not in self.by_tid and (self.tgids.get(pid) == self.threads.qemu_pid or
                                           pid in self.threads.vmm_threads)

    def wakeup(self, event: Wakeup) -> None:
        self.woken[(event.target_cpu, event.pid)] = event.ts_ns
        if self._vmm_thread(event.pid):
            self.vmm_waiting.setdefault(event.target_cpu, {}).setdefault(event.pid, event.ts_ns)
        off = self.off.get(event.pid)
        if off is not None and not off.runnable and off.woken is None:
            off.woken = (event.ts_ns, event.target_cpu)

    def switch(self, switch: Switch) -> None:
        cpu = switch.cpu
        self.known_from.setdefault(cpu, switch.ts_ns)
        self.last_ts[cpu] = switch.ts_ns
        if switch.prev_tgid is not None:
            self.tgids[switch.prev_pid] = switch.prev_tgid
        before = self.current.get(cpu)
        leaving = (switch.prev_pid, switch.prev_comm, switch.prev_prio)
        if before is not None and before[0] != switch.prev_pid and switch.prev_pid != 0:
            since = before[3]  # the pCPU's previous switch: the only event of it this layer follows
            start, switch_in = untraced_switch_in(since, self.woken.get((cpu, switch.prev_pid)), since, switch.ts_ns)
            self.ran(before, cpu, start, None)
            if switch.prev_pid in self.by_tid:  # a vCPU thread that ran unseen was on from then
                self.back(switch.prev_pid, start)
            self.ran((*leaving, start), cpu, switch.ts_ns, switch_in)
        elif before is not None:
            self.ran(before, cpu, switch.ts_ns, None)
        waiting = self.vmm_waiting.setdefault(cpu, {})
        waiting.pop(switch.next_pid, None)
        if self._vmm_thread(switch.prev_pid) and switch.prev_state.startswith("R"):
            waiting.setdefault(switch.prev_pid, switch.ts_ns)
        if switch.prev_pid in self.by_tid:
            self.seen.add(switch.prev_pid)
            self.off[switch.prev_pid] = _Off(switch.ts_ns, switch.prev_state, cpu)
        if switch.next_pid in self.by_tid:
            if switch.next_pid not in self.seen:
                self.unseen_until(switch.next_pid, cpu, switch.ts_ns)
            self.seen.add(switch.next_pid)
            self.back(switch.next_pid, switch.ts_ns)
        self.current[cpu] = (switch.next_pid, switch.next_comm, switch.next_prio, switch.ts_ns)

    def end(self) -> None:
        """The trace ends: a vCPU still asleep or stopped was so until its CPU's last event."""
        for tid, off in list(self.off.items()):
            self.back(tid, self.last_ts.get(off.cpu, off.left))


def vcpu_occupancies(trace: ParsedTrace, threads: VmThreads) -> list[Occupancy]:
    """Occupancies (on the host clock, ``cpu`` = the vCPU's index) of each vCPU thread's time off its pCPU: a
    runnable vCPU (preempted, or woken from sleep) waited while a task held its pCPU ("vCPU not running: X
    ran", this VM's other vCPUs and QEMU threads named as such) or while that pCPU idled; a vCPU asleep or
    stopped was held back by its own state until woken ("vCPU asleep, not woken yet", "vCPU thread stopped":
    what ran on its pCPU meanwhile is only a bystander, in ``detail.ran_meanwhile``). A vCPU switched in that the
    trace never saw leave was off since its CPU's kept trace began (why is not known).

    A task switched out whose switch-in the trace lacks (seen on this development VM: no switch from the idle
    task is ever recorded on one of its CPUs) ran from its wake-up onto that CPU when traced, else from the
    CPU's previous switch; ``detail.switch_in`` says which. Where a CPU's trace resumes after a stretch that was
    not kept, what was known of that CPU (who ran, which vCPU was off there) is forgotten until seen again."""
    timeline = _VcpuTimeline(threads)
    resumes = sorted(Resume(ts, cpu) for cpu, times in trace.resumes.items() for ts in times)
    # (a resume point comes before the events at its time)
    events: Iterator[Resume | Switch | Wakeup] = heapq.merge(resumes, trace.switches, trace.wakeups,
                                                            key=lambda e: e.ts_ns)
    for event in events:
        if isinstance(event, Resume):
            timeline.resume(event)
        elif isinstance(event, Wakeup):
            timeline.wakeup(event)
        else:
            timeline.switch(event)
    timeline.end()
    return sorted(timeline.found, key=lambda o: (o.cpu, o.start_ns))


def exit_occupancies(events: list[KvmEvent], threads: VmThreads, resumes: Mapping[int, list[int]],
                     wakeups: Iterable[Wakeup] = ()) -> list[Occupancy]:
    """Each VM exit of a vCPU thread, from kvm_exit to its next kvm_entry, named by its reason (not across a
    stretch of its CPU's trace that was not kept).

    KVM traces kvm_exit only after it has enabled interrupts again, so the interrupt that made the vCPU exit is
    handled before it: where that interrupt woke a task on the vCPU's pCPU (a host task whose timer fired, the
    wake-up the trace keeps), the vCPU had left the guest by that wake-up, and the exit starts there
    (``detail.before_kvm_exit_ns``: by how much). Nothing runs on that pCPU between an entry and the guest's
    exit, so no earlier event can be the guest's."""
    by_tid = {tid: index for index, tid in threads.vcpus.items()}
    woken_on: dict[int, list[int]] = {}
    for wakeup in wakeups:
        woken_on.setdefault(wakeup.cpu, []).append(wakeup.ts_ns)
    for times in woken_on.values():
        times.sort()
    entered: dict[int, int] = {}  # tid -> its last kvm_entry

    def left_guest(exit_: KvmEvent) -> int:
        """When the vCPU was out of the guest at the latest: the first wake-up on its pCPU since its entry."""
        entry, times = entered.get(exit_.pid), woken_on.get(exit_.cpu, [])
        if entry is None:
            return exit_.ts_ns
        first = bisect.bisect_right(times, entry)
        return times[first] if first < len(times) and times[first] < exit_.ts_ns else exit_.ts_ns

    def unbroken(start: KvmEvent, end: KvmEvent) -> bool:
        return all(bisect.bisect_right(times, start.ts_ns) == bisect.bisect_right(times, end.ts_ns)
                   for times in (resumes.get(start.cpu, []), resumes.get(end.cpu, [])))

    exited: dict[int, KvmEvent] = {}
    found: list[Occupancy] = []
    for event in events:
        if event.pid not in by_tid:
            continue
        if not event.entry:
            exited[event.pid] = event
            continue
        start = exited.pop(event.pid, None)
        if start is not None and start.ts_ns < event.ts_ns and unbroken(start, event):
            index = by_tid[event.pid]
            reason = start.reason or "unknown"
            begun = left_guest(start)
            detail: dict[str, str | int] = {"reason": reason, "host_cpu": start.cpu, "vcpu": index}
            if begun < start.ts_ns:
                detail["before_kvm_exit_ns"] = start.ts_ns - begun
            found.append(Occupancy("vm", begun, event.ts_ns, f"VM exit {reason}", "vm-exit", index, detail,
                                   culprit=f"VM exit {reason}"))
        entered[event.pid] = event.ts_ns
    return found


# ---- the source ----------------------------------------------------------------------------------------------


class _GuestPlacement:
    """Where a guest's sample lies in the VM trace (explain.recorder.SampleMap): on any of the instance's traced
    ``cpus``, at the host time the clock exchange gives, give or take its uncertainty and the drift bound since
    the start."""

    def __init__(self, clock_map: Callable[[], ClockMap | None], cpus: tuple[int, ...]) -> None:
        self.clock_map, self.cpus = clock_map, cpus

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        # (a vCPU's pCPU is not known from its index when it is not pinned; its wake-ups are recorded on the
        # waker's CPU, any of them)
        return self.cpus

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        clock = self.clock_map()
        if clock is None:
            return None
        drift = abs(sample_ns - clock.guest_0) * DRIFT_BOUND_PPM // 1_000_000
        return clock.to_host(sample_ns), clock.uncertainty_ns + drift + TEXT_RESOLUTION_NS


def drift_allowance(clock: ClockMap, windows: np.ndarray) -> tuple[int, list[str]]:
    """What a layer placed through the guest's clock exchange adds to its alignment for drift, with the note that
    says so: with no end exchange (a watchdog, Ctrl-C) the guest's clock may have drifted by up to
    DRIFT_BOUND_PPM since the start, at the farthest window. (The VM and KVM layers share the exchange, so they
    share this: neither is placed more exactly than the other.)"""
    if not clock.start_only or not windows.size:
        return 0, []
    farthest = max(abs(int(windows["start_ns"].min()) - clock.guest_0),
                   abs(int(windows["end_ns"].max()) - clock.guest_0))
    drift = farthest * DRIFT_BOUND_PPM // 1_000_000
    return drift, [f"its placement allows {drift / 1e3:.0f} us for the guest clock's drift since the start exchange "
                   f"({DRIFT_BOUND_PPM} ppm at most)"]


def start_guest_tracing(cpus: tuple[int, ...], events: Sequence[str], *, buffer_mb: int, recording_ring_kb: int,
                        samples: Path | None, keep: KeepRule | None, clock_map: Callable[[], ClockMap | None],
                        access: TracefsAccess | None) -> tuple[TracefsInstance, FlightRecorder | None]:
    """A started instance tracing ``events`` on a guest's pCPUs (the VM and KVM layers) and, when a run's samples
    are followed (``samples`` and ``keep``), its flight recorder, which places them through the guest's clock
    exchange; without one, a buffer of ``buffer_mb`` per pCPU read at the end. Raises TracingUnavailable."""
    recording = keep is not None and samples is not None
    # drained every DRAIN_S by the recorder: the kernel's ring only bridges its pauses
    ring_kb = min(recording_ring_kb, buffer_mb * 1024) if recording else buffer_mb * 1024
    instance = TracefsInstance(cpus, events, buffer_kb=ring_kb, access=access)
    instance.start()
    if not recording:
        return instance, None
    assert instance.path is not None and samples is not None and keep is not None
    return instance, start_recording(instance, FlightRecorder(
        instance.path, cpus, samples, keep, bound_bytes=buffer_mb << 20, margin_ns=KEEP_AROUND_NS,
        placement=_GuestPlacement(clock_map, cpus), access=access))


class VmSource:
    """The VM layer of one QEMU guest or libvirt domain: armed before launch on the vCPUs' host CPUs (``None``:
    unpinned, every CPU rtvirt may use), told its vCPU threads and clock exchange once QEMU placed them
    (``attach``). ``no_clock`` says why a guest cannot take part in the clock exchange (its layer is then not
    seen). ``keep``: which samples the flight recorder keeps the trace for, once told the samples file
    (``follow``); None: one buffer of ``buffer_mb`` per pCPU read at the end. ``access``: the tracefs of the
    host QEMU runs on (default: this machine's; a KVM host's over SSH: explain.remote). ``exits``: trace KVM's
    exits here too (default: under KVM; False where the KVM layer, explain.kvm, traces them)."""

    layer: Layer = "vm"

    def __init__(self, vm: str, host_cpus: tuple[int, ...] | None, accel: str, buffer_mb: int = 64,
                 no_clock: str | None = None, keep: KeepRule | None = None,
                 access: TracefsAccess | None = None, exits: bool | None = None) -> None:
        self.vm = vm
        self.access = access
        self.exits = accel == "kvm" if exits is None else exits
        self.no_clock = no_clock
        self.host_cpus = host_cpus or tuple(sorted(os.sched_getaffinity(0)))
        self.accel = accel
        self.buffer_mb = buffer_mb
        self.keep = keep
        self.samples: Path | None = None
        self.recorder: FlightRecorder | None = None
        self._instance: TracefsInstance | None = None
        # the vCPU threads' wake-ups on every CPU (a vCPU is woken where its waker runs: QEMU's main loop, an
        # I/O thread, on CPUs the main instance does not trace), from the moment the threads are known
        self._wakeups: TracefsInstance | None = None
        self._wake_recorder: FlightRecorder | None = None
        self._why_not: str | None = None
        self._trace = ParsedTrace()
        self._dropped = 0
        self._problems: list[str] = []
        self._qemu_pid = 0
        self._vcpus: dict[int, int] = {}
        self._vmm_tids: set[int] = set()
        self._exchange: ClockExchange | None = None

    def follow(self, samples: Path) -> None:
        """The file the guest's samples reach on this host while the run goes (before ``start``)."""
        self.samples = samples

    def start(self) -> None:
        if self._instance is not None or self._why_not is not None:
            return
        events = ["sched:sched_switch", "sched:sched_wakeup"]
        events += ["kvm:kvm_exit", "kvm:kvm_entry"] if self.exits else []
        try:
            # (a ring four times the host layer's: every switch and wake-up of every thread on the pCPUs, QEMU's
            # many among them, while the recorder's thread may be starved on a loaded machine)
            self._instance, self.recorder = start_guest_tracing(
                self.host_cpus, events, buffer_mb=self.buffer_mb, recording_ring_kb=4 * RING_KB, samples=self.samples,
                keep=self.keep, clock_map=self.clock_map, access=self.access)
        except TracingUnavailable as exc:
            self._why_not = str(exc)
            return
        self._problems += [f"event {event} does not exist on this kernel" for event in self._instance.missing_events]

    def attach(self, qemu_pid: int, vcpus: Mapping[int, int], exchange: ClockExchange | None) -> None:
        """The VM is placed (its vCPU threads exist, it has not run yet): remember who is who."""
        self._qemu_pid, self._vcpus, self._exchange = qemu_pid, dict(vcpus), exchange
        register_vcpus(self.vm, vcpus)
        # QEMU's own threads now (its main loop and I/O threads; workers come and go, and are known by tgid):
        # the main loop wakes a halted vCPU under TCG, so a vCPU asleep while it waits for its pCPU is held back
        # by what holds that pCPU
        here = self.access is None or self.access.here  # (a KVM host's QEMU is not this machine's /proc)
        if here:
            with contextlib.suppress(OSError, ValueError):
                self._vmm_tids = {int(task) for task in os.listdir(f"/proc/{int(qemu_pid)}/task")} - \
                    set(vcpus.values())
        if self._instance is not None and vcpus:
            # the wake-ups that matter: the vCPU threads' and QEMU's own, and real-time tasks' (whose switch-in
            # from idle may be missing); the others, most of them, are not recorded at all
            own = " || ".join(f"pid == {int(tid)}" for tid in vcpus.values())
            vmm = "".join(f" || pid == {tid}" for tid in sorted(self._vmm_tids)[:MAX_FILTERED_THREADS])
            self._instance.set_filter("sched:sched_wakeup", f"prio < 100 || {own}{vmm}")
            self._trace_wakeups(own)

    def _waking_cpus(self) -> tuple[int, ...]:
        """Where a vCPU thread's waker may run: every CPU this process may use here; every online CPU of a KVM host
        over SSH (its QEMU's main loop wakes a halted vCPU from the emulator's CPUs, and a wake-up of a task on a
        busy CPU is traced on the waker's: without them a vCPU asleep when a task took its pCPU stayed "asleep,
        not woken yet" through the task's whole hold, 68 of 70 such holds in one run over SSH)."""
        if self.access is None or self.access.here:
            return tuple(sorted(set(os.sched_getaffinity(0)) | set(self.host_cpus)))
        from ..params import parse_cpulist

        try:
            online = parse_cpulist(self.access.read("/sys/devices/system/cpu/online").strip())
        except (OSError, ValueError) as exc:
            self._problems.append(f"the vCPU threads' wake-ups on other CPUs are not traced: {exc}")
            return ()
        return tuple(sorted(set(online) | set(self.host_cpus)))

    def _trace_wakeups(self, own: str) -> None:
        """The vCPU threads' own wake-ups, on every CPU their wakers may run on (only those: the kernel filters the
        rest out), so that a sleeping vCPU's wait is told from its wait for its pCPU."""
        cpus = self._waking_cpus()
        if not cpus:
            return
        recording = self.recorder is not None and self.samples is not None and self.keep is not None
        instance = TracefsInstance(cpus, ["sched:sched_wakeup"], buffer_kb=WAKEUP_RING_KB,
                                   filters={"sched:sched_wakeup": own}, access=self.access)
        try:
            instance.start()
        except TracingUnavailable as exc:
            self._problems.append(f"the vCPU threads' wake-ups on other CPUs are not traced: {exc}")
            return
        self._wakeups = instance
        if recording:
            assert instance.path is not None and self.samples is not None and self.keep is not None
            self._wake_recorder = start_recording(instance, FlightRecorder(
                instance.path, cpus, self.samples, self.keep, bound_bytes=self.buffer_mb << 20,
                margin_ns=KEEP_AROUND_NS, placement=_GuestPlacement(self.clock_map, cpus), walk_back=False,
                access=self.access))

    def stop(self) -> None:
        if self._exchange is not None:
            self._exchange.close()
        woken: list[TraceEvent] = []
        if self._wakeups is not None:
            wakeups, self._wakeups = self._wakeups, None
            wakeups.stop()
            woken = [event for event in wakeups.events() if event.event == "sched_wakeup"]
            self._problems += wakeups.problems
        if self._instance is not None:
            instance, self._instance = self._instance, None
            instance.stop()
            # (the main instance's events in time order as it parses them; the wake-up instance's, few, merged in)
            woken.sort(key=lambda e: e.ts_ns)
            self._trace = read_events(heapq.merge(instance.events_in_order(), woken, key=lambda e: e.ts_ns),
                                      in_order=True)
            if self.recorder is not None:  # (and where its kept trace resumes after a stretch it did not keep)
                for cpu, times in self.recorder.resumes.items():
                    self._trace.resumes[cpu] = sorted({*self._trace.resumes.get(cpu, []), *times})
            self._dropped = instance.dropped_events
            self._problems += instance.problems
        forget_vcpus(self._vcpus)

    def clock_map(self) -> ClockMap | None:
        return self._exchange.clock_map() if self._exchange is not None else None

    def collect(self, context: CollectContext) -> LayerTrace:
        if self._why_not is not None:
            return LayerTrace("vm", False, self._why_not)
        if not self._vcpus:
            return LayerTrace("vm", False, "the VM's vCPU threads were never known (it did not start)")
        clock = self.clock_map()
        if clock is None:
            problem = self.no_clock or (self._exchange.problem if self._exchange is not None else None)
            return LayerTrace("vm", False, "the guest's clock could not be aligned with the host's: "
                              + (problem or "no clock exchange took place"))
        threads = VmThreads(self.vm, self._vcpus, self._qemu_pid, frozenset(self._vmm_tids))
        found = vcpu_occupancies(self._trace, threads) + exit_occupancies(self._trace.kvm, threads,
                                                                          self._trace.resumes, self._trace.wakeups)
        keep = _near_windows(context.windows)
        occupancies = []
        for occupancy in found:
            start, end = clock.to_guest(occupancy.start_ns), clock.to_guest(occupancy.end_ns)
            if keep(start, end, occupancy.cpu):
                occupancies.append(dataclasses.replace(occupancy, start_ns=start, end_ns=end))
        notes = list(clock.notes) + self._problems
        bound, dropped = bound_notes(self.recorder, self._dropped, context, self.buffer_mb * 1024, "vCPU")
        notes += bound + self._wakeup_notes()
        if self.recorder is not None and abs(clock.rate - 1) * 1e6 > DRIFT_BOUND_PPM:
            notes.append(f"the guest's clock drifted {(clock.rate - 1) * 1e6:+.0f} ppm, beyond the "
                         f"{DRIFT_BOUND_PPM} ppm the flight recorder allowed for: windows late in the run may "
                         "miss part of their trace")
        if self.accel != "kvm":
            notes.append("the guest ran under TCG (software emulation): no VM exits to trace, and its timings do "
                         "not represent real hardware")
        if self._trace.unreadable:
            notes.append(f"{self._trace.unreadable} sched_switch lines of the VM trace were not understood")
        drift, said = drift_allowance(clock, context.windows)
        return LayerTrace("vm", True, None, occupancies, clock.uncertainty_ns + drift + TEXT_RESOLUTION_NS, dropped,
                          notes + said)

    def _wakeup_notes(self) -> list[str]:
        """What the wake-up recorder held, and what its bound cost: windows whose vCPU wake-ups were not all kept
        read a woken vCPU as asleep. Its bound is the layer's own (WAKEUP_RING_KB is the kernel ring beneath it):
        a long run keeps the wake-ups of every candidate window, and a TCG guest's vCPU thread is woken hundreds of
        times a second (with 1 MiB, a 30-minute soak lost the wake-ups of 23 outlier windows, and 3 of its 26
        injected bursts read as an idle vCPU)."""
        recorder = self._wake_recorder
        if recorder is None:
            return []
        peak = max(recorder.peak_bytes().values(), default=0)
        notes = [f"the flight recorder held at most {peak / 1024:.0f} KiB of the vCPU threads' wake-ups per CPU at "
                 f"once (its bound: {self.buffer_mb * 1024} KiB per CPU)"]
        if recorder.lost or recorder.dropped_lines:
            notes.append(f"the flight recorder's bound on the vCPU threads' wake-ups dropped "
                         f"{recorder.dropped_lines} of them, part of {len(recorder.lost)} outlier windows' (a vCPU "
                         "woken there reads as asleep)")
        return notes


def _near_windows(windows: np.ndarray) -> Callable[[int, int, int], bool]:
    """Whether an interval on the sample clock lies within KEEP_AROUND_NS of an outlier window of its vCPU."""
    if windows.dtype.names:
        starts, ends, cpus = (np.asarray(windows[name], dtype=np.int64) for name in ("start_ns", "end_ns", "cpu"))
    else:
        array = np.asarray(windows, dtype=np.int64).reshape(-1, 3)
        starts, ends, cpus = array[:, 0], array[:, 1], array[:, 2]

    def near(start: int, end: int, cpu: int) -> bool:
        hit = (starts - KEEP_AROUND_NS < end) & (ends + KEEP_AROUND_NS > start) & ((cpus == cpu) | (cpus < 0))
        return bool(hit.any())

    return near
