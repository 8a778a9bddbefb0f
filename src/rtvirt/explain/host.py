"""The host layer: what ran on the measured CPUs instead of the measuring thread, from host tracepoints.

A :class:`~rtvirt.explain.tracefs.TracefsInstance` on the measured CPUs records scheduler switches, IRQ
handlers, softirqs, the x86 IRQ vectors (local timer, IPIs) and hrtimer expiries on the ``mono`` trace clock,
which is the CLOCK_MONOTONIC the host agent stamps its samples with: no alignment beyond the text trace's
microsecond resolution. Each CPU's events become intervals: the task switched in until the next switch,
an IRQ handler from entry to exit, and so on. The measuring agent's own threads are named as such: inside a
window they only hold the CPU between their switch-in and the time stamp that ends it. A normal task that
keeps the CPU after the agent's real-time thread was woken is said to. Strings from the trace (comms, IRQ
names) are untrusted: escaped and bounded here.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

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

__all__ = ["HostSource", "HOST_EVENTS", "occupancies_from_events", "task_cause", "bounded", "steal_ns",
           "inside_vm", "outer_hypervisor_note"]

HOST_EVENTS = (
    "sched:sched_switch", "sched:sched_wakeup",
    "irq:irq_handler_entry", "irq:irq_handler_exit", "irq:softirq_entry", "irq:softirq_exit",
    "irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit",
    "irq_vectors:reschedule_entry", "irq_vectors:reschedule_exit",
    "irq_vectors:call_function_entry", "irq_vectors:call_function_exit",
    "irq_vectors:call_function_single_entry", "irq_vectors:call_function_single_exit",
    "irq_vectors:irq_work_entry", "irq_vectors:irq_work_exit",
    "timer:hrtimer_expire_entry", "timer:hrtimer_expire_exit",
)
AHEAD_OF_RT = " (kept the CPU after the real-time thread was woken)"
MARGIN_NS = 1_000_000  # occupancies kept this far around each window (the report's timelines)
MAX_NAME = 64

_SWITCH = re.compile(r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>-?\d+) prev_prio=(?P<prev_prio>-?\d+) "
                     r"prev_state=\S+ ==> next_comm=(?P<next_comm>.*) next_pid=(?P<next_pid>-?\d+) "
                     r"next_prio=(?P<next_prio>-?\d+)$")
_SWITCHED_PIDS = re.compile(r" prev_pid=(\d+) prev_prio=-?\d+ prev_state=\S+ ==> next_comm=.* next_pid=(\d+) "
                            r"next_prio=-?\d+$", re.MULTILINE)
_IRQ_ENTRY = re.compile(r"irq=(?P<irq>\d+) name=(?P<name>.*)$")


def bounded(text: str, limit: int = MAX_NAME) -> str:
    """An untrusted name made printable and short."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def task_cause(comm: str, pid: int, kernel_prio: int, policy: str | None = None) -> tuple[str, dict[str, str | int]]:
    """The name a user reads for a task, from its kernel priority (sched_switch's ``prio``: -1 deadline,
    0-98 real-time (99 - rt priority), 100-139 normal (120 + nice)) and, when known, its policy."""
    if kernel_prio < 0:
        policy, prio = policy or "SCHED_DEADLINE", 0
    elif kernel_prio < 100:
        policy, prio = policy or "SCHED_FIFO/RR", 99 - kernel_prio
    else:
        policy, prio = policy or "SCHED_OTHER", kernel_prio - 120
    comm = bounded(comm, 16)
    shown = f"{prio}" if kernel_prio < 100 else f"nice {prio}"
    return f"task {comm}/{pid} {policy} {shown}", {"comm": comm, "pid": pid, "policy": policy, "prio": prio}


def switched_pids(text: str) -> set[int]:
    """The tasks a trace switched in or out: a task's switch-in may be missing (a real-time task woken from
    idle on 6.x kernels) while its switch-out names it."""
    return {int(pid) for pair in _SWITCHED_PIDS.findall(text) for pid in pair}


def _cpu_occupancies(cpu: int, cpu_events: list[TraceEvent], is_agent: Callable[[int], bool],
                     policies: dict[int, str]) -> list[Occupancy]:
    """One CPU's intervals, from its events in time order."""
    occupancies: list[Occupancy] = []
    task: tuple[int, str, int, int] | None = None  # (start, comm, pid, prio) of the task on the CPU
    open_: dict[str, tuple[int, str, str, dict[str, str | int]]] = {}  # key -> (start, kind, cause, detail)
    rt_woken: int | None = None  # when a real-time thread of the agent was woken and has not run since
    last_ts: int | None = None  # the CPU's previous event
    woken: dict[int, int] = {}  # pid -> its last real-time wake-up on this CPU

    def close(key: str, end: int) -> None:
        begun = open_.pop(key, None)
        if begun is not None and end > begun[0]:
            occupancies.append(Occupancy("host", begun[0], end, begun[2], begun[1], cpu, begun[3]))

    for event in cpu_events:
        name, ts = event.event, event.ts_ns
        previous_ts, last_ts = last_ts, ts
        if name == "sched_switch":
            match = _SWITCH.match(event.body)
            if match is None:
                continue
            prev_pid = int(match["prev_pid"])
            if task is not None and task[2] != prev_pid and previous_ts is not None and previous_ts > task[0]:
                # the kernel switched out a task whose switch-in the trace does not hold (seen here: a FIFO task
                # woken from idle, its swapper->task switch missing): the task demonstrably ran until now, from
                # its wake-up on this CPU when traced (real-time ones are), else from the previous event
                previous_ts, untraced_in = untraced_switch_in(task[0], woken.get(prev_pid), previous_ts, ts)
                if task[2] == 0:
                    occupancies.append(Occupancy("host", task[0], previous_ts, "idle: the CPU slept until the wake-up",
                                                 "idle-exit", cpu, {}))
                else:
                    cause, detail = task_cause(task[1], task[2], task[3], policies.get(task[2]))
                    occupancies.append(Occupancy("host", task[0], previous_ts, cause, "task", cpu, detail))
                task = (previous_ts, match["prev_comm"], prev_pid, int(match["prev_prio"]))
            else:
                untraced_in = None
            if task is not None and ts > task[0]:
                start, comm, pid, prio = task
                if pid == 0:
                    occupancies.append(Occupancy("host", start, ts, "idle: the CPU slept until the wake-up",
                                                 "idle-exit", cpu, {}))
                elif is_agent(pid):  # its own switch-in, return from sleep and clock read end a window
                    occupancies.append(Occupancy("host", start, ts, f"measuring agent on the CPU "
                                                 f"({bounded(comm, 16)}/{pid}: switched in, not yet stamped)",
                                                 "agent", cpu, {"comm": bounded(comm, 16), "pid": pid}))
                else:
                    cause, detail = task_cause(comm, pid, prio, policies.get(pid))
                    if untraced_in:
                        cause += f" (switch-in {untraced_in})"
                        detail["switch_in"] = untraced_in
                    kept = max(start, rt_woken) if prio >= 100 and rt_woken is not None and rt_woken < ts else ts
                    if kept > start:
                        occupancies.append(Occupancy("host", start, kept, cause, "task", cpu, detail))
                    if kept < ts:
                        # what was seen, not why: a kernel without preemption, the fair server, RT throttling or
                        # time stolen by an outer hypervisor (shown as this task running on) all look alike here
                        occupancies.append(Occupancy("host", kept, ts, cause + AHEAD_OF_RT, "task", cpu, detail))
            task = (ts, match["next_comm"], int(match["next_pid"]), int(match["next_prio"]))
            if is_agent(task[2]):
                rt_woken = None
        elif name == "sched_wakeup":
            fields = body_fields(event.body)
            if fields.get("pid", "").isdigit():
                woken[int(fields["pid"])] = ts
            # an RT thread of the agent woken onto this CPU by its own timer (other wake-ups of its threads,
            # e.g. a writer the kernel may then push to another CPU, say nothing about this one)
            timer = open_.get("hrtimer")
            if timer is not None and timer[3].get("function") == "hrtimer_wakeup" and \
                    fields.get("pid", "").isdigit() and is_agent(int(fields["pid"])) and \
                    fields.get("prio", "").lstrip("-").isdigit() and int(fields["prio"]) < 100 and \
                    fields.get("target_cpu", "").isdigit() and int(fields["target_cpu"]) == cpu:
                rt_woken = ts if rt_woken is None else rt_woken
        elif name == "irq_handler_entry":
            match = _IRQ_ENTRY.match(event.body)
            if match is not None:
                irq = int(match["irq"])
                open_[f"irq{irq}"] = (ts, "irq", f"irq {irq} {bounded(match['name'], 32)}",
                                      {"irq": irq, "name": bounded(match["name"], 32)})
        elif name == "irq_handler_exit":
            close(f"irq{body_fields(event.body).get('irq', '')}", ts)
        elif name == "softirq_entry":
            fields = body_fields(event.body)
            action = bounded(fields.get("action", "").rstrip("]"), 16) or fields.get("vec", "?")
            open_["softirq"] = (ts, "softirq", f"softirq {action}", {"vec": fields.get("vec", ""),
                                                                     "action": action})
        elif name == "softirq_exit":
            close("softirq", ts)
        elif name == "hrtimer_expire_entry":
            function = bounded(body_fields(event.body).get("function", "?"), 48)
            open_["hrtimer"] = (ts, "timer", f"timer {function}", {"function": function})
        elif name == "hrtimer_expire_exit":
            close("hrtimer", ts)
        elif name.endswith("_entry"):  # irq_vectors: local_timer, reschedule, call_function...
            vector = name.removesuffix("_entry")
            number = body_fields(event.body).get("vector", "")
            open_[vector] = (ts, "irq-vector", f"irq vector {vector}",
                             {"vector": vector, **({"number": int(number)} if number.isdigit() else {})})
        elif name.endswith("_exit"):
            close(name.removesuffix("_exit"), ts)
    return occupancies


def occupancies_from_events(events: Iterable[TraceEvent], agent_pids: Sequence[int],
                            policies: dict[int, str] | None = None) -> list[Occupancy]:
    """Intervals of what held each CPU: tasks (the agent's named as such), IRQs, softirqs, vectors, timers.

    ``events`` of any CPUs, each CPU's in time order. A thread belongs to the agent when its pid or tgid is
    in ``agent_pids``; tgids come from the trace's tgid column (every thread that ran shows it).
    """
    policies = policies or {}
    by_cpu: dict[int, list[TraceEvent]] = {}
    tgids: dict[int, int] = {}
    for event in events:
        by_cpu.setdefault(event.cpu, []).append(event)
        if event.tgid is not None:
            tgids[event.pid] = event.tgid
    agents = set(agent_pids)

    def is_agent(pid: int) -> bool:
        return pid in agents or tgids.get(pid, -1) in agents

    occupancies: list[Occupancy] = []
    for cpu, cpu_events in by_cpu.items():
        occupancies += _cpu_occupancies(cpu, cpu_events, is_agent, policies)
    occupancies.sort(key=lambda o: (o.cpu, o.start_ns))
    return occupancies


def read_local(path: str) -> str:
    """A file of this machine (what ``steal_ns``/``inside_vm`` read by default; a target passes its own)."""
    return Path(path).read_text()


def steal_ns(read: Callable[[str], str] = read_local) -> int | None:
    """Time the outer hypervisor stole from the machine's CPUs so far (/proc/stat), None if unknown."""
    try:
        fields = read("/proc/stat").split("\n", 1)[0].split()
        return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def inside_vm(read: Callable[[str], str] = read_local) -> str | None:
    """Why rtvirt believes the machine runs inside a VM itself (cpuinfo's hypervisor flag, DMI), or None."""
    with contextlib.suppress(OSError):
        for line in read("/proc/cpuinfo").splitlines():
            if line.startswith("flags") and " hypervisor" in line:
                vendor = ""
                with contextlib.suppress(OSError):
                    vendor = bounded(read("/sys/class/dmi/id/sys_vendor").strip(), 40)
                return "the CPU reports a hypervisor" + (f" ({vendor})" if vendor else "")
    return None


def outer_hypervisor_note(steal_before: int | None, steal_after: int | None,
                          read: Callable[[str], str] = read_local) -> str | None:
    """What could not be seen because the measured machine itself runs in a VM (None on bare metal)."""
    why = inside_vm(read)
    if why is None:
        return None
    note = f"the measured machine runs inside a VM itself ({why}): time stolen by the outer hypervisor is invisible"
    if steal_before is not None and steal_after is not None:
        note += f"; its steal counter rose by {(steal_after - steal_before) / 1e6:.1f} ms during the run"
    return note


class HostSource:
    """The host layer beside one run on this machine's ``cpus`` (the measured CPUs)."""

    layer: Layer = "host"

    def __init__(self, cpus: Sequence[int], *, buffer_mb: int = 64, flight_recorder: bool = True,
                 events: Sequence[str] = HOST_EVENTS, access: TracefsAccess | None = None,
                 keep: KeepRule | None = None, keep_kb: int | None = None) -> None:
        self.cpus = tuple(cpus)
        self.read_system: Callable[[str], str] = getattr(access, "read_system", read_local)
        # only real-time wake-ups matter (a woken RT thread kept waiting): the others are not recorded at all
        self.instance = TracefsInstance(self.cpus, events, buffer_kb=buffer_mb * 1024, overwrite=flight_recorder,
                                        filters={"sched:sched_wakeup": "prio < 100"}, access=access)
        # the flight recorder (explain.recorder), told the samples file and which samples can become explained
        # outliers, keeps at most keep_kb of trace per CPU (default: the buffer's size); on a target it drains
        # the target's pipes over the connection, on the target's clock
        self.access = access
        self.keep = keep if flight_recorder else None
        self.keep_kb = keep_kb or buffer_mb * 1024
        self.samples: Path | None = None
        self.recorder: FlightRecorder | None = None
        self.why_not: str | None = None
        self.policies: dict[int, str] = {}
        self._started = False

    def follow(self, samples: Path) -> None:
        """The file the run's samples are written to while it goes (before ``start``)."""
        self.samples = samples

    def start(self) -> None:
        recording = self.keep is not None and self.samples is not None
        if recording:  # drained every DRAIN_S: the kernel's ring only bridges the recorder's pauses
            self.instance.buffer_kb = min(self.instance.buffer_kb, RING_KB, self.keep_kb)
        try:
            self.instance.start()
            self._started = True
        except TracingUnavailable as exc:
            self.why_not = str(exc)
            return
        if recording:
            assert self.instance.path is not None and self.samples is not None and self.keep is not None
            self.recorder = start_recording(self.instance, FlightRecorder(
                self.instance.path, self.cpus, self.samples, self.keep, bound_bytes=self.keep_kb * 1024,
                margin_ns=MARGIN_NS, access=self.access))

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self.instance.stop()
        # policies of the tasks that ran, asked of their kernel while they still live (the trace has only priorities)
        ran = set().union(*map(switched_pids, self.instance.texts.values())) - {0, *self.policies}
        self.policies.update(self.instance.access.policies(ran))

    def collect(self, context: CollectContext) -> LayerTrace:
        if self.why_not is not None:
            return LayerTrace("host", seen=False, why_not=self.why_not)
        occupancies = []
        for cpu, start, end in _spans(context.windows, MARGIN_NS):
            if cpu in self.cpus:
                events = self.instance.events_around(cpu, start, end)
                occupancies += occupancies_from_events(events, context.agent_pids, self.policies)
        notes = list(self.instance.problems)
        if self.instance.missing_events:
            notes.append(f"events not on this kernel: {', '.join(self.instance.missing_events)}")
        bound, dropped = bound_notes(self.recorder, self.instance.dropped_events, context, self.keep_kb)
        notes += bound
        kept = near_windows(occupancies, context.windows)
        if context.header.get("probe") == "timer":
            kept += before_timer_interrupt(kept, context.windows)
        return LayerTrace("host", seen=True, occupancies=kept, alignment_ns=TEXT_RESOLUTION_NS,
                          dropped_events=dropped, notes=notes)


def _spans(windows: np.ndarray, margin_ns: int) -> list[tuple[int, int, int]]:
    """(cpu, start, end) covering every window with ``margin_ns`` around it, overlapping ones merged."""
    spans: list[tuple[int, int, int]] = []
    for cpu, start, end in sorted((int(w["cpu"]), int(w["start_ns"]) - margin_ns, int(w["end_ns"]) + margin_ns)
                                  for w in windows):
        if spans and spans[-1][0] == cpu and start <= spans[-1][2]:
            spans[-1] = (cpu, spans[-1][1], max(end, spans[-1][2]))
        else:
            spans.append((cpu, start, end))
    return spans


def before_timer_interrupt(occupancies: list[Occupancy], windows: np.ndarray) -> list[Occupancy]:
    """For a timer probe's windows: what held the CPU from the planned wake-up until the first local timer
    interrupt, marked as such. A few microseconds are the timer's delivery; more is the interrupt held off
    (interrupts disabled) or, when rtvirt runs in a VM, the vCPU stolen while that task was current."""
    by_cpu: dict[int, list[int]] = {}
    for occupancy in occupancies:
        if occupancy.kind == "irq-vector" and occupancy.detail.get("vector") == "local_timer":
            by_cpu.setdefault(occupancy.cpu, []).append(occupancy.start_ns)
    marked = []
    for start, end, cpu, _ in windows.tolist():
        arrived = min([t for t in by_cpu.get(int(cpu), []) if t >= start] + [end])
        for occupancy in occupancies:
            if occupancy.cpu == cpu and occupancy.kind in ("task", "idle-exit") and \
                    occupancy.start_ns < arrived and occupancy.end_ns > start:
                marked.append(Occupancy("host", max(occupancy.start_ns, start), min(occupancy.end_ns, arrived),
                                        f"before the timer interrupt: {occupancy.cause}", "timer-late", cpu,
                                        occupancy.detail))
    return marked


def near_windows(occupancies: list[Occupancy], windows: np.ndarray, margin_ns: int = MARGIN_NS) -> list[Occupancy]:
    """The occupancies within ``margin_ns`` of a window on their CPU (or any CPU for those tied to none)."""
    if windows.size == 0 or not occupancies:
        return []
    occupied_start = np.fromiter((o.start_ns for o in occupancies), np.int64, len(occupancies))
    occupied_end = np.fromiter((o.end_ns for o in occupancies), np.int64, len(occupancies))
    occupied_cpu = np.fromiter((o.cpu for o in occupancies), np.int64, len(occupancies))
    near = np.zeros(len(occupancies), dtype=bool)
    for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(),
                               strict=True):
        near |= (occupied_start < int(end) + margin_ns) & (occupied_end > int(start) - margin_ns) & \
            ((occupied_cpu == int(cpu)) | (occupied_cpu < 0))
    return [occupancy for occupancy, kept in zip(occupancies, near.tolist(), strict=True) if kept]
