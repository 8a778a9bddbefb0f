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
import heapq
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .clocksync import ClockExchange, ClockMap
from .model import CollectContext, Layer, LayerTrace, Occupancy
from .recorder import RING_KB, FlightRecorder, KeepRule, bound_notes, start_recording
from .tracefs import (
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


def _printable(text: str) -> str:
    """A comm from the trace (untrusted): printable and bounded."""
    return re.sub(r"[^ -~]", "?", text)[:COMM_LIMIT]


# ---- the trace -----------------------------------------------------------------------------------------------

# a comm may hold spaces ("CPU 0/TCG"): the fields around it delimit it
SWITCH = re.compile(r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>\d+) prev_prio=(?P<prev_prio>-?\d+) "
                    r"prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>.*) next_pid=(?P<next_pid>\d+) "
                    r"next_prio=(?P<next_prio>-?\d+)")
EXIT_REASON = re.compile(r"reason (?P<reason>[A-Z0-9_]+)")


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
    """A task woken onto ``target_cpu`` (recorded on whichever traced CPU woke it)."""

    ts_ns: int
    pid: int
    target_cpu: int


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
    one at a time, never held all at once)."""
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
                parsed.wakeups.append(Wakeup(event.ts_ns, int(fields["pid"]), int(fields["target_cpu"])))
        elif event.event in ("kvm_exit", "kvm_entry"):
            reason = EXIT_REASON.search(event.body)
            parsed.kvm.append(KvmEvent(event.ts_ns, event.cpu, event.pid, event.event == "kvm_entry",
                                       _printable(reason["reason"]) if reason else ""))
    return parsed


# ---- who ran instead ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class VmThreads:
    """The traced VM's threads: its vCPUs (index -> host tid) and its QEMU process (whose other threads are the
    emulator's: the main loop, I/O and RCU threads, workers)."""

    vm: str
    vcpus: Mapping[int, int]
    qemu_pid: int


def _cause(pid: int, tgid: int | None, comm: str, threads: VmThreads) -> tuple[str, dict[str, str | int]]:
    own_vcpu = next((index for index, tid in threads.vcpus.items() if tid == pid), None)
    if own_vcpu is not None:
        return f"vCPU not running: this VM's vCPU {own_vcpu} ({comm}/{pid}) ran", {"ran": "own-vcpu"}
    if tgid == threads.qemu_pid:
        return f"vCPU not running: QEMU thread {comm}/{pid} of this VM ran", {"ran": "qemu-thread"}
    other = vcpu_owner(pid)
    if other is not None:
        return f"vCPU not running: {other} ({comm}/{pid}) ran", {"ran": "other-vm-vcpu", "vm": other}
    return f"vCPU not running: {comm}/{pid} ran", {"ran": "task"}


def _priority(prio: int) -> dict[str, str | int]:
    """sched_switch's prio is the kernel's: below 100 a real-time priority (99 - prio), -1 deadline."""
    if prio < 0:
        return {"policy": "SCHED_DEADLINE"}
    if prio < 100:
        return {"policy": "real-time", "priority": 99 - prio}
    return {"policy": "normal", "nice": prio - 120}


def vcpu_occupancies(trace: ParsedTrace, threads: VmThreads) -> list[Occupancy]:
    """An occupancy (on the host clock, ``cpu`` = the vCPU's index) for every task that ran on a vCPU's pCPU
    while that vCPU's thread was not running (anywhere), this VM's other vCPUs included; ``detail.vcpu_state``
    says whether the vCPU had been preempted (runnable), was asleep (its guest idle) or had been woken and waited
    for its pCPU (a traced ``sched_wakeup`` of its thread after it left asleep).

    A task switched out whose switch-in the trace lacks (seen on this development VM: no switch from the idle
    task is ever recorded on one of its CPUs) ran from its wake-up onto that CPU when traced, else from the
    CPU's previous switch; ``detail.switch_in`` says which. Where a CPU's trace resumes after a stretch that was
    not kept, what was known of that CPU (who ran, which vCPU was off there) is forgotten until seen again."""
    by_tid = {tid: index for index, tid in threads.vcpus.items()}
    off_since: dict[int, int] = {}  # vCPU tid -> when it left its CPU (absent: running, or not yet seen)
    off_state: dict[int, str] = {}
    last_cpu: dict[int, int] = {}
    current: dict[int, tuple[int, str, int, int]] = {}  # cpu -> (pid, comm, prio, since)
    tgids: dict[int, int] = {}
    woken: dict[tuple[int, int], int] = {}  # (cpu, pid) -> its last wake-up onto that CPU
    vcpu_woken: dict[int, tuple[int, int]] = {}  # vCPU tid -> (when, onto which pCPU) it was woken since it
    # left asleep (absent: not woken yet)
    found: list[Occupancy] = []

    def ran(task: tuple[int, str, int, int], cpu: int, until: int, switch_in: str | None) -> None:
        """The task ``task`` held ``cpu`` until ``until``: its part while a vCPU of that pCPU was off, cut where a
        sleeping vCPU was woken (from then on it waited for the pCPU)."""
        pid, comm, prio, since = task
        if pid == 0:
            return
        for tid, left in off_since.items():
            start = max(since, left)
            if start >= until:
                continue
            if off_state[tid].startswith("R"):
                stretches = [(start, until, "preempted", last_cpu[tid])]
            else:  # asleep on the pCPU it left, then (woken) waiting on the one it was woken onto
                woke_at, woke_on = vcpu_woken.get(tid, (until, last_cpu[tid]))
                wake = min(max(woke_at, start), until)
                stretches = [(start, wake, "sleeping", last_cpu[tid]), (wake, until, "woken", woke_on)]
            held = [(begin, end, state) for begin, end, state, waits_on in stretches if end > begin and waits_on == cpu]
            if not held:  # it waited on another pCPU: this task did not hold it off
                continue
            cause, detail = _cause(pid, tgids.get(pid), comm, threads)
            detail.update({"comm": comm, "pid": pid, "host_cpu": cpu, "vcpu": by_tid[tid], **_priority(prio),
                           **({"switch_in": switch_in} if switch_in else {})})
            for begin, end, state in held:
                found.append(Occupancy("vm", begin, end, cause, "vcpu-preempted", by_tid[tid],
                                       {**detail, "vcpu_state": state}))

    resumes = sorted(Resume(ts, cpu) for cpu, times in trace.resumes.items() for ts in times)
    # (a resume point comes before the events at its time)
    timeline: Iterator[Resume | Switch | Wakeup] = heapq.merge(resumes, trace.switches, trace.wakeups,
                                                               key=lambda e: e.ts_ns)
    for event in timeline:
        if isinstance(event, Resume):
            current.pop(event.cpu, None)
            for tid in [tid for tid in off_since if last_cpu[tid] == event.cpu]:
                del off_since[tid]
                vcpu_woken.pop(tid, None)
            for key in [key for key in woken if key[0] == event.cpu]:
                del woken[key]
            continue
        if isinstance(event, Wakeup):
            woken[(event.target_cpu, event.pid)] = event.ts_ns
            if event.pid in off_since and not off_state[event.pid].startswith("R"):
                vcpu_woken.setdefault(event.pid, (event.ts_ns, event.target_cpu))
            continue
        switch = event
        if switch.prev_tgid is not None:
            tgids[switch.prev_pid] = switch.prev_tgid
        before = current.get(switch.cpu)
        leaving = (switch.prev_pid, switch.prev_comm, switch.prev_prio)
        switch_in = None
        if before is not None and before[0] != switch.prev_pid and switch.prev_pid != 0:
            since = before[3]  # the pCPU's previous switch: the only event of it this layer follows
            start, switch_in = untraced_switch_in(since, woken.get((switch.cpu, switch.prev_pid)), since,
                                                  switch.ts_ns)
            ran(before, switch.cpu, start, None)
            off_since.pop(switch.prev_pid, None)  # a vCPU thread that ran unseen was on from then
            ran((*leaving, start), switch.cpu, switch.ts_ns, switch_in)
        elif before is not None:
            ran(before, switch.cpu, switch.ts_ns, None)
        if switch.prev_pid in by_tid:
            off_since[switch.prev_pid] = switch.ts_ns
            off_state[switch.prev_pid] = switch.prev_state
            last_cpu[switch.prev_pid] = switch.cpu
            vcpu_woken.pop(switch.prev_pid, None)
        if switch.next_pid in by_tid:
            off_since.pop(switch.next_pid, None)
        current[switch.cpu] = (switch.next_pid, switch.next_comm, switch.next_prio, switch.ts_ns)
    return found


def exit_occupancies(events: list[KvmEvent], threads: VmThreads, resumes: Mapping[int, list[int]]
                     ) -> list[Occupancy]:
    """Each VM exit of a vCPU thread, from kvm_exit to its next kvm_entry, named by its reason (not across a
    stretch of its CPU's trace that was not kept)."""
    by_tid = {tid: index for index, tid in threads.vcpus.items()}

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
            found.append(Occupancy("vm", start.ts_ns, event.ts_ns, f"VM exit {reason}", "vm-exit", index,
                                   {"reason": reason, "host_cpu": start.cpu, "vcpu": index}))
    return found


# ---- the source ----------------------------------------------------------------------------------------------


class _GuestPlacement:
    """Where a guest's sample lies in the VM trace (explain.recorder.SampleMap): on any of the traced pCPUs, at
    the host time the clock exchange gives, give or take its uncertainty and the drift bound since the start."""

    def __init__(self, source: VmSource) -> None:
        self.source = source

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        return self.source.host_cpus  # (a vCPU's pCPU is not known from its index when it is not pinned)

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        clock = self.source.clock_map()
        if clock is None:
            return None
        drift = abs(sample_ns - clock.guest_0) * DRIFT_BOUND_PPM // 1_000_000
        return clock.to_host(sample_ns), clock.uncertainty_ns + drift + TEXT_RESOLUTION_NS


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
        self._why_not: str | None = None
        self._trace = ParsedTrace()
        self._dropped = 0
        self._problems: list[str] = []
        self._qemu_pid = 0
        self._vcpus: dict[int, int] = {}
        self._exchange: ClockExchange | None = None

    def follow(self, samples: Path) -> None:
        """The file the guest's samples reach on this host while the run goes (before ``start``)."""
        self.samples = samples

    def start(self) -> None:
        if self._instance is not None or self._why_not is not None:
            return
        events = ["sched:sched_switch", "sched:sched_wakeup"]
        events += ["kvm:kvm_exit", "kvm:kvm_entry"] if self.exits else []
        recording = self.keep is not None and self.samples is not None
        # drained every DRAIN_S by the recorder: the kernel's ring only bridges its pauses
        ring_kb = min(RING_KB, self.buffer_mb * 1024) if recording else self.buffer_mb * 1024
        instance = TracefsInstance(self.host_cpus, events, buffer_kb=ring_kb, access=self.access)
        try:
            instance.start()
        except TracingUnavailable as exc:
            self._why_not = str(exc)
            return
        self._instance = instance
        self._problems += [f"event {event} does not exist on this kernel" for event in instance.missing_events]
        if recording:
            assert instance.path is not None and self.samples is not None and self.keep is not None
            self.recorder = start_recording(instance, FlightRecorder(
                instance.path, self.host_cpus, self.samples, self.keep, bound_bytes=self.buffer_mb << 20,
                margin_ns=KEEP_AROUND_NS, placement=_GuestPlacement(self), access=self.access))

    def attach(self, qemu_pid: int, vcpus: Mapping[int, int], exchange: ClockExchange | None) -> None:
        """The VM is placed (its vCPU threads exist, it has not run yet): remember who is who."""
        self._qemu_pid, self._vcpus, self._exchange = qemu_pid, dict(vcpus), exchange
        register_vcpus(self.vm, vcpus)

    def stop(self) -> None:
        if self._exchange is not None:
            self._exchange.close()
        if self._instance is not None:
            instance, self._instance = self._instance, None
            instance.stop()
            self._trace = read_events(instance.events_in_order(), in_order=True)
            if self.recorder is not None:
                self._trace.resumes = self.recorder.resumes
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
        threads = VmThreads(self.vm, self._vcpus, self._qemu_pid)
        found = vcpu_occupancies(self._trace, threads) + exit_occupancies(self._trace.kvm, threads,
                                                                          self._trace.resumes)
        keep = _near_windows(context.windows)
        occupancies = []
        for occupancy in found:
            start, end = clock.to_guest(occupancy.start_ns), clock.to_guest(occupancy.end_ns)
            if keep(start, end, occupancy.cpu):
                occupancies.append(Occupancy("vm", start, end, occupancy.cause, occupancy.kind, occupancy.cpu,
                                             occupancy.detail))
        notes = list(clock.notes) + self._problems
        bound, dropped = bound_notes(self.recorder, self._dropped, context, self.buffer_mb * 1024, "vCPU")
        notes += bound
        if self.recorder is not None and abs(clock.rate - 1) * 1e6 > DRIFT_BOUND_PPM:
            notes.append(f"the guest's clock drifted {(clock.rate - 1) * 1e6:+.0f} ppm, beyond the "
                         f"{DRIFT_BOUND_PPM} ppm the flight recorder allowed for: windows late in the run may "
                         "miss part of their trace")
        if self.accel != "kvm":
            notes.append("the guest ran under TCG (software emulation): no VM exits to trace, and its timings do "
                         "not represent real hardware")
        if self._trace.unreadable:
            notes.append(f"{self._trace.unreadable} sched_switch lines of the VM trace were not understood")
        # the text trace's microseconds add to the exchange's bound
        return LayerTrace("vm", True, None, occupancies, clock.uncertainty_ns + TEXT_RESOLUTION_NS, dropped,
                          notes)


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
