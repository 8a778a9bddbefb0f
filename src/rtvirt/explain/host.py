"""The host layer: what ran on the measured CPUs instead of the measuring thread, from host tracepoints.

A :class:`~rtvirt.explain.tracefs.TracefsInstance` on the measured CPUs records scheduler switches, IRQ
handlers, softirqs, the x86 IRQ vectors (local timer, IPIs) and timer callbacks on the ``mono`` trace clock,
which is the CLOCK_MONOTONIC the host agent stamps its samples with: no alignment beyond the text trace's
microsecond resolution. Each CPU's events become intervals (explain.cpuevents); a timer probe's windows are then
read along the wake-up's path (explain.timerpath): what held the CPU before its interrupt (an idle CPU there
means the interrupt came late: a layer not traced held it back, whose steal this layer reads per CPU while the
run goes, explain.outer), what kept it after the wake-up. The run's own cost is stated (explain.cost).

The default events leave out what is on every wake-up's path and names nothing the report shows
(``sched_wakeup``, ``hrtimer_expire_exit``: docs/explain.md, Cost). An unpinned run's thread may sleep on one
traced CPU and run on another: each window is then read where it waited (explain.timerpath.thread_moves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .cost import cost_note, measure_event_cost, wake_up_path
from .cpuevents import occupancies_from_events, switched_pids
from .model import CollectContext, Layer, LayerTrace, Occupancy
from .outer import StealReading, StealSeries, idle_exit_latency, read_local, stolen_stretches
from .recorder import RING_KB, FlightRecorder, KeepRule, bound_notes, start_recording
from .timerpath import agent_bound, thread_moves, timer_path
from .tracefs import GAP_EVENT, TEXT_RESOLUTION_NS, TracefsAccess, TracefsInstance, TracingUnavailable, line_stamp

__all__ = ["HostSource", "HOST_EVENTS", "MARGIN_NS", "near_windows"]

HOST_EVENTS = (
    "sched:sched_switch",
    "irq:irq_handler_entry", "irq:irq_handler_exit", "irq:softirq_entry", "irq:softirq_exit",
    "irq_vectors:local_timer_entry", "irq_vectors:local_timer_exit",
    "irq_vectors:reschedule_entry", "irq_vectors:reschedule_exit",
    "irq_vectors:call_function_entry", "irq_vectors:call_function_exit",
    "irq_vectors:call_function_single_entry", "irq_vectors:call_function_single_exit",
    "irq_vectors:irq_work_entry", "irq_vectors:irq_work_exit",
    "timer:hrtimer_expire_entry",
)
# real-time wake-ups only, where a caller traces them (the default does not: the timer path reads the thread's
# own timer callback)
WAKEUP_FILTER = {"sched:sched_wakeup": "prio < 100"}
MARGIN_NS = 1_000_000  # occupancies kept this far around each window (the report's timelines)


class HostSource:
    """The host layer beside one run on this machine's ``cpus`` (the measured CPUs); ``access``: an SSH
    target's tracefs instead (its CPUs, its clock)."""

    layer: Layer = "host"

    def __init__(self, cpus: Sequence[int], *, buffer_mb: int = 64, flight_recorder: bool = True,
                 events: Sequence[str] = HOST_EVENTS, access: TracefsAccess | None = None,
                 keep: KeepRule | None = None, keep_kb: int | None = None) -> None:
        self.cpus = tuple(cpus)
        self.read_system: Callable[[str], str] = getattr(access, "read_system", read_local)
        # only real-time wake-ups matter (a woken RT thread kept waiting): the others are not recorded at all
        self.instance = TracefsInstance(self.cpus, events, buffer_kb=buffer_mb * 1024, overwrite=flight_recorder,
                                        filters=WAKEUP_FILTER, access=access)
        # the flight recorder (explain.recorder), told the samples file and which samples can become explained
        # outliers, keeps at most keep_kb of trace per CPU (default: the buffer's size); on a target it drains
        # the target's pipes over the connection, on the target's clock
        self.access = access
        self.keep = keep if flight_recorder else None
        self.keep_kb = keep_kb or buffer_mb * 1024
        self.samples: Path | None = None
        self.recorder: FlightRecorder | None = None
        self.why_not: str | None = None
        self.policies: dict[int, tuple[str, str]] = {}
        # this machine's: its measured CPUs' steal while the run goes, their idle states, an event's cost
        self.steal = StealSeries(self.cpus, self.cpus) if access is None else None
        self.idle: dict[int, tuple[str, int]] = {}
        self.event_ns: int | None = None
        self._started = False

    def follow(self, samples: Path) -> None:
        """The file the run's samples are written to while it goes (before ``start``)."""
        self.samples = samples

    def start(self) -> None:
        recording = self.keep is not None and self.samples is not None
        if recording:  # drained every DRAIN_S: the kernel's ring only bridges the recorder's pauses
            self.instance.buffer_kb = min(self.instance.buffer_kb, RING_KB, self.keep_kb)
        if self.access is None:  # before tracing: the measurement disturbs nothing yet
            self.event_ns = measure_event_cost(self.cpus[0])
            self.idle = {cpu: found for cpu in self.cpus if (found := idle_exit_latency(cpu)) is not None}
        try:
            self.instance.start()
            self._started = True
        except TracingUnavailable as exc:
            self.why_not = str(exc)
            return
        if self.steal is not None:
            self.steal.start()
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
        if self.steal is not None:
            self.steal.stop()
        # policies of the tasks that ran, asked of their kernel while they still live (the trace has only priorities)
        ran = set().union(*map(switched_pids, self.instance.texts.values())) - {0, *self.policies}
        self.policies.update(self.instance.access.policies(ran))

    def _steal_around(self, cpu: int, start: int, end: int) -> StealReading | None:
        return self.steal.around(cpu, start, end) if self.steal is not None else None

    def collect(self, context: CollectContext) -> LayerTrace:
        if self.why_not is not None:
            return LayerTrace("host", seen=False, why_not=self.why_not)
        read = self._read_cost()  # (before the windows' lines are taken from the texts)
        occupancies = []
        # an unpinned thread may sleep on one traced CPU and run on another: every traced CPU around every window
        spans = _spans(context.windows, MARGIN_NS) if len(self.cpus) == 1 else \
            _spans(np.concatenate([_on(context.windows, cpu) for cpu in self.cpus]), MARGIN_NS)
        times: dict[int, list[int]] = {}
        gaps: dict[int, list[int]] = {}  # (where the kept trace has a hole: no stretch of "no event" spans one)
        for cpu, start, end in spans:
            if cpu in self.cpus:
                events = self.instance.events_around(cpu, start, end)
                times.setdefault(cpu, []).extend(event.ts_ns for event in events if event.event != GAP_EVENT)
                gaps.setdefault(cpu, []).extend(event.ts_ns for event in events if event.event == GAP_EVENT)
                last = self.instance.last_stamp(cpu)  # a task current at the span's end held on while traced
                occupancies += occupancies_from_events(events, context.agent_pids, self.policies,
                                                       until=min(end, last) if last is not None else None)
        notes = list(self.instance.problems)
        if self.instance.missing_events:
            notes.append(f"events not on this kernel: {', '.join(self.instance.missing_events)}")
        bound, dropped = bound_notes(self.recorder, self.instance.dropped_events, context, self.keep_kb)
        notes += bound
        probe = str(context.header.get("probe") or "")
        kept = agent_bound(occupancies if len(self.cpus) > 1 else near_windows(occupancies, context.windows),
                           context.windows, probe)
        moves = thread_moves(kept, context.windows) if probe == "timer" and len(self.cpus) > 1 else []
        if probe == "timer":
            kept += timer_path(kept, context.windows, self._steal_around, self.idle, moves)
        if self.steal is not None:  # (last: where nothing was traced, nothing traced outranks it)
            kept += stolen_stretches({cpu: np.array(sorted(found), np.int64) for cpu, found in times.items()},
                                     context.windows, self._steal_around,
                                     gaps={cpu: np.array(sorted(found), np.int64) for cpu, found in gaps.items()})
        note, cost = cost_note(*read, len(self.cpus), self.event_ns,
                               wake_up_path(set(self.instance.wanted) - set(self.instance.missing_events)),
                               probe == "timer")
        notes.append(note)
        if moves:
            notes.append(f"{len(moves) // 2} outliers' threads slept on another CPU than they ran on (an unpinned "
                         "run): each is read where its timer fired until it was woken, then where it ran")
        return LayerTrace("host", seen=True, occupancies=kept, alignment_ns=TEXT_RESOLUTION_NS,
                          dropped_events=dropped, notes=notes, cost=cost, moves=moves)

    def _read_cost(self) -> tuple[int, float, int]:
        """The events and bytes of trace this run recorded and the seconds they span."""
        if self.recorder is not None:
            lines, size, span = self.recorder.read()
            return lines, span / 1e9, size
        lines = size = 0
        first, last = None, None
        for cpu in self.cpus:
            text = self.instance.lines(cpu)
            lines, size = lines + len(text), size + sum(len(line) + 1 for line in text)
            if text:
                stamps = (line_stamp(text[0]), line_stamp(text[-1]))
                first = min(filter(None, (first, stamps[0])), default=None)
                last = max(filter(None, (last, stamps[1])), default=None)
        return lines, ((last or 0) - (first or 0)) / 1e9, size


def _on(windows: np.ndarray, cpu: int) -> np.ndarray:
    """The windows as if taken on ``cpu`` (to read every traced CPU around them)."""
    copy = windows.copy()
    copy["cpu"] = cpu
    return copy


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
