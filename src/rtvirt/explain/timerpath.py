"""A timer probe's window on a traced CPU, read along the wake-up's path: expiry, interrupt, wake-up, switch-in.

The window runs from the planned wake-up (the thread's timer expiry, ``t_ns``) to the moment the thread read the
clock. The interrupt that ran the thread's timer is the one whose ``hrtimer_wakeup`` (timerlat: ``timerlat_irq``)
expired first at or after the planned time: the callback's event carries the timer base's time in nanoseconds
(``now``), which the text trace's microsecond stamps cannot give (they are rounded: an on-time interrupt may print
before the planned wake-up). From there:

- a thread still on its CPU at its planned wake-up (late from its previous one) had not slept for it: until its
  last switch-out before the interrupt, what ran instead *took the CPU before the measuring thread slept* (it
  then sleeps for a time already past, and its timer fires at once); the interrupt is judged from that sleep;
- what held the CPU from the planned wake-up until that interrupt entered is *before the timer interrupt*: a
  task that kept interrupts off or was current while an outer hypervisor held the CPU (its CPU's steal around
  the window says which is likely), or an idle CPU, which the interrupt should have woken at once: beyond the
  deepest idle state's exit latency, that interrupt came late, and a layer not traced (the outer hypervisor)
  held it back: such a part is that layer's (``irq-late``), never idling's;
- what held it from the wake-up until the thread ran: a normal task that kept the CPU, or an idle CPU that did
  not run the woken real-time thread (RT throttling, a frozen cgroup);
- the measuring thread itself, switched in: only its way back to the clock read is its own; where nothing
  traced happened for longer, that time is not explained (``unexplained``).

Each of these names a stretch of a task's or idle's occupancy that no nested occupancy (an IRQ, a softirq, a
vector, a timer callback) covers: a handler that was running when the planned wake-up passed keeps its time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .cpuevents import MEASURER_TIMERS, unexplained
from .model import Occupancy
from .outer import StealReading
from .tracefs import TEXT_RESOLUTION_NS

__all__ = ["timer_path", "thread_moves", "agent_bound", "BEFORE_INTERRUPT", "AHEAD_OF_RT", "BEFORE_SLEEP",
           "LATE_TO_IDLE", "AGENT_RETURN_MIN_NS"]

BEFORE_INTERRUPT = "before the timer interrupt"
AHEAD_OF_RT = "kept the CPU after the real-time thread was woken"
BEFORE_SLEEP = "took the CPU before the measuring thread slept for this wake-up"
LATE_TO_IDLE = "timer interrupt late to an idle CPU"
NESTED = frozenset({"irq", "softirq", "irq-vector", "timer"})
# the measuring thread's way from its switch-in back to its clock read (kernel return path, vDSO read) is its own
# time; what lies beyond a few times its typical length, with no event, is not explained (measured per run)
AGENT_RETURN_MIN_NS = 20_000  # here: median 3.1 us, 99 % within 5.5 us (2,000 wake-ups at load 6)
AGENT_RETURN_FACTOR = 3
TYPICAL_WINDOWS = 20
NORMAL_POLICIES = ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE")
IDLE_TO_SWITCH_NS = 100_000  # idle after a wake-up longer than this did not run the woken thread when it could

Steal = Callable[[int, int, int], StealReading | None]


class _Index:
    """Occupancies by CPU, to find those overlapping a stretch without a pass over all of them per window."""

    def __init__(self, occupancies: Sequence[Occupancy]) -> None:
        by_cpu: dict[int, list[Occupancy]] = {}
        for occupancy in occupancies:
            by_cpu.setdefault(occupancy.cpu, []).append(occupancy)
        self.lists = {cpu: sorted(found, key=lambda o: o.start_ns) for cpu, found in by_cpu.items()}
        self.starts = {cpu: np.array([o.start_ns for o in found], np.int64) for cpu, found in self.lists.items()}
        self.ends = {cpu: np.array([o.end_ns for o in found], np.int64) for cpu, found in self.lists.items()}

    def overlapping(self, cpu: int, low: int, high: int) -> list[Occupancy]:
        """The occupancies of ``cpu`` that overlap [low, high)."""
        if cpu not in self.lists:
            return []
        last = int(np.searchsorted(self.starts[cpu], high))
        hits = np.flatnonzero(self.ends[cpu][:last] > low)
        found = self.lists[cpu]
        return [found[index] for index in hits.tolist()]


@dataclasses.dataclass(frozen=True, slots=True)
class _Path:
    """Where a window's wake-up went: its interrupt's entry, and the callback that woke the thread."""

    arrival: int
    woken: int | None
    delivery_ns: int | None  # expiry to the timer base's clock read, exact


def _wake_up(near: list[Occupancy], start: int, end: int) -> _Path | None:
    """Where the window's wake-up went; None when its trace holds neither the thread's timer callback nor a
    local timer interrupt (nothing to read the path from)."""
    timers = [o for o in near if o.kind == "timer" and o.detail.get("function") in MEASURER_TIMERS and
              isinstance(o.detail.get("now_ns"), int) and start <= int(o.detail["now_ns"]) <= end]
    interrupts = [o for o in near if (o.kind == "irq-vector" and o.detail.get("vector") == "local_timer") or
                  o.kind == "irq"]
    if timers:
        timer = min(timers, key=lambda o: int(o.detail["now_ns"]))
        # the interrupt that ran it (the local timer vector; an IRQ handler where the timer has no vector: arm64)
        entered = [o.start_ns for o in interrupts if o.start_ns <= timer.start_ns <= o.end_ns]
        return _Path(max(min(entered, default=timer.start_ns), start), timer.start_ns,
                     int(timer.detail["now_ns"]) - start)
    # no callback traced (an older trace, an imported one): the first local timer interrupt that may have come at
    # or after the planned time (a stamp rounded to the microsecond may print up to half of one before it)
    entries = [o.start_ns for o in interrupts if o.kind == "irq-vector" and
               start - TEXT_RESOLUTION_NS // 2 <= o.start_ns < end]
    return _Path(max(min(entries), start), None, None) if entries else None


def _uncovered(occupancy: Occupancy, low: int, high: int, nested: list[Occupancy]) -> list[tuple[int, int]]:
    """The stretches of ``occupancy`` within [low, high) that no nested occupancy covers."""
    cursor, pieces = max(occupancy.start_ns, low), []
    stop = min(occupancy.end_ns, high)
    for inner in sorted(nested, key=lambda o: o.start_ns):
        if inner.end_ns <= cursor or inner.start_ns >= stop:
            continue
        if inner.start_ns > cursor:
            pieces.append((cursor, inner.start_ns))
        cursor = max(cursor, inner.end_ns)
    if cursor < stop:
        pieces.append((cursor, stop))
    return pieces


def _marked(occupancy: Occupancy, begin: int, end: int, cause: str, kind: str, variant: str,
            detail: dict[str, str | int], culprit: str | None = None) -> Occupancy:
    return dataclasses.replace(occupancy, start_ns=begin, end_ns=end, cause=cause, kind=kind, variant=variant,
                               culprit=occupancy.culprit if culprit is None else culprit,
                               detail={**occupancy.detail, **detail})


def _measurer(occupancy: Occupancy) -> bool:
    """The measuring thread switched in: its own time, or the part of it agent_bound left unexplained."""
    return occupancy.kind == "agent" or (occupancy.kind == "unexplained" and "return_bound_ns" in occupancy.detail)


def _thread_at(measurers: Iterable[Occupancy], cpu: int, end: int) -> int | None:
    """The pid of the measuring thread switched in on ``cpu`` at ``end`` (a window's clock read)."""
    ran = [o for o in measurers if o.cpu == cpu and o.start_ns <= end < o.end_ns + TEXT_RESOLUTION_NS]
    pid = max(ran, key=lambda o: o.start_ns).detail.get("pid") if ran else None
    return pid if isinstance(pid, int) else None


def _slept_at(near: list[Occupancy], start: int, arrival: int, thread: int | None) -> int:
    """When the window's measuring thread (pid ``thread``) slept for its wake-up: ``start`` for one asleep by its
    planned time, as a thread on time is; for one still on the CPU then (late from its previous wake-up), its last
    switch-out before the interrupt entered. Until then no timer of its was armed to come late."""
    mine = [o for o in near if _measurer(o) and o.detail.get("pid") == thread]
    if thread is None or not any(o.start_ns <= start < o.end_ns for o in mine):
        return start
    return max([o.end_ns for o in mine if start < o.end_ns <= arrival], default=start)


def _before_sleep(occupancy: Occupancy, begin: int, end: int) -> Occupancy:
    """A stretch after the planned wake-up, before the measuring thread (still on the CPU then) slept for it: a
    task that took the CPU from it, or idle while it neither ran nor slept (blocked, or not run)."""
    if occupancy.kind == "idle-exit":
        return _marked(occupancy, begin, end, "idle before the measuring thread slept for this wake-up (it "
                       "blocked, or was not run)", "idle-exit", "before the measuring thread slept", {})
    return _marked(occupancy, begin, end, f"{occupancy.cause} ({BEFORE_SLEEP})", "task", BEFORE_SLEEP, {})


def _before_interrupt(occupancy: Occupancy, begin: int, end: int, path: _Path, steal: StealReading | None,
                      idle: tuple[str, int] | None, window_start: int, slept: int) -> Occupancy:
    """A stretch before the timer interrupt entered, named by who was current (``slept``: when the thread slept
    for it, the window's start or later, from which an idle CPU's interrupt is judged)."""
    detail: dict[str, str | int] = {"interrupt_entered_ns": path.arrival - window_start}
    if path.delivery_ns is not None:
        detail["expiry_to_timer_ns"] = path.delivery_ns
    if steal is not None:
        detail.update(steal_ns=steal.steal_ns, steal_span_ns=steal.to_ns - steal.from_ns)
    stole = f"; {steal.text(occupancy.cpu)}" if steal is not None and steal.steal_ns > 0 else ""
    if occupancy.kind != "idle-exit":
        return _marked(occupancy, begin, end, f"{BEFORE_INTERRUPT}: {occupancy.cause}{stole}", "timer-late",
                       BEFORE_INTERRUPT, detail)
    exit_ns = idle[1] if idle is not None else 0
    if idle is not None:
        detail.update(idle_state=idle[0], idle_exit_latency_ns=idle[1])
    if path.arrival - slept <= exit_ns + 2 * TEXT_RESOLUTION_NS:
        return _marked(occupancy, begin, end, f"idle: waking up ({idle[0] if idle else 'idle state not known'})",
                       "idle-exit", "waking up", detail)
    state = f"its deepest idle state {idle[0]} exits within {idle[1] / 1e3:g} us" if idle is not None else \
        "its idle states are not known"
    steal_said = f"steal +{steal.steal_ns / 1e6:.0f} ms around it" if steal is not None else "no steal readings"
    return _marked(occupancy, begin, end, f"{LATE_TO_IDLE} (held back by a layer not traced: {steal_said}; {state})",
                   "irq-late", "", detail, culprit=LATE_TO_IDLE)


def _after_wake_up(occupancy: Occupancy, begin: int, end: int) -> Occupancy | None:
    """A stretch after the measuring thread was woken, before it ran: a normal task that kept the CPU (a kernel
    without full preemption, the fair server, an outer hypervisor taking the CPU while it was current: the trace
    shows that it happened, not why) or an idle CPU that did not run it."""
    if occupancy.kind == "idle-exit":  # (the idle task's own way to the switch takes microseconds)
        why = " (it was not run: RT throttling, a frozen cgroup?)" if end - begin >= IDLE_TO_SWITCH_NS else ""
        return _marked(occupancy, begin, end, f"idle after the real-time thread was woken{why}", "idle-exit",
                       "after the real-time thread was woken", {})
    if occupancy.kind == "task" and occupancy.detail.get("policy") in NORMAL_POLICIES:
        return _marked(occupancy, begin, end, f"{occupancy.cause} ({AHEAD_OF_RT})", "task", AHEAD_OF_RT, {})
    return None


def thread_moves(occupancies: list[Occupancy], windows: np.ndarray) -> list[list[int]]:
    """Where each window's thread slept, when that is not the CPU it ran on (an unpinned run): its timer fired
    there, so the window is read there until its callback woke the thread, then where it ran (the layer's
    ``moves``). The thread is the measuring thread switched in on the window's CPU at its end; where it slept is
    where it last left a CPU before the window."""
    agents = sorted((o for o in occupancies if o.kind == "agent"), key=lambda o: o.end_ns)
    index = _Index(occupancies)
    moves = []
    for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(),
                               strict=True):
        thread = _thread_at(agents, cpu, end)
        if thread is None:
            continue
        before = [o for o in agents if o.detail.get("pid") == thread and o.end_ns <= start + TEXT_RESOLUTION_NS]
        paths = {on: _wake_up(index.overlapping(on, start, end), start, end) for on in index.lists}
        woken = {on: path for on, path in paths.items() if path is not None and path.woken is not None}
        if before:
            slept_on = before[-1].cpu
        elif cpu not in woken and woken:  # its timer fired elsewhere: the first to expire at or after its time
            slept_on = min(woken, key=lambda on: woken[on].delivery_ns or 0)
        else:
            continue
        if slept_on != cpu and slept_on in woken:
            moves += [[start, cpu, start, slept_on], [start, cpu, woken[slept_on].woken or start, cpu]]
    return moves


def timer_path(occupancies: list[Occupancy], windows: np.ndarray, steal: Steal | None = None,
               idle: dict[int, tuple[str, int]] | None = None, moves: Sequence[Sequence[int]] = ()
               ) -> list[Occupancy]:
    """The marks of each timer-probe window (``WINDOW`` rows) along its wake-up's path: the stretches of task and
    idle occupancies before the interrupt (on the CPU the thread slept on: ``moves``, else its own) and after
    the wake-up (on the CPU it ran on) that no nested occupancy covers. They are added to the occupancies: being
    later to start, each wins over the task or idle it names."""
    index = _Index(occupancies)
    slept = {(int(start), int(cpu)): int(on) for start, cpu, at, on in moves if at == start}
    marks: dict[tuple[int, int, int, str], Occupancy] = {}
    for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(),
                               strict=True):
        fired = slept.get((start, cpu), cpu)
        near = {on: index.overlapping(on, start - TEXT_RESOLUTION_NS, end) for on in {fired, cpu}}
        nested = {on: [o for o in found if o.kind in NESTED] for on, found in near.items()}
        path = _wake_up(near[fired], start, end)
        if path is None:
            continue
        reading = steal(fired, start, end) if steal is not None else None
        slept_at = _slept_at(near[fired], start, path.arrival,
                             _thread_at((o for o in near[cpu] if _measurer(o)), cpu, end))
        for occupancy in near[fired]:
            if occupancy.kind not in ("task", "idle-exit"):
                continue
            for begin, stop in _uncovered(occupancy, start, slept_at, nested[fired]):
                mark = _before_sleep(occupancy, begin, stop)
                marks[(mark.cpu, begin, stop, mark.cause)] = mark
            for begin, stop in _uncovered(occupancy, slept_at, path.arrival, nested[fired]):
                mark = _before_interrupt(occupancy, begin, stop, path, reading, (idle or {}).get(fired), start,
                                         slept_at)
                marks[(mark.cpu, begin, stop, mark.cause)] = mark
        if path.woken is None:
            continue
        for occupancy in near[cpu]:
            if occupancy.kind not in ("task", "idle-exit"):
                continue
            for begin, stop in _uncovered(occupancy, path.woken, end, nested[cpu]):
                after = _after_wake_up(occupancy, begin, stop)
                if after is not None:
                    marks[(after.cpu, begin, stop, after.cause)] = after
    return list(marks.values())


def agent_bound(occupancies: list[Occupancy], windows: np.ndarray, probe: str) -> list[Occupancy]:
    """The measuring agent's occupancies cut to what it can explain. A spinning probe (gap) explains none of its
    holes: while it was current and nothing traced happened, the time was taken from it unseen. A sleeping one
    (timer) explains its way back from its switch-in to its clock read: its first ``AGENT_RETURN_MIN_NS`` not
    taken by a nested occupancy (or ``AGENT_RETURN_FACTOR`` times the median of that way over the run's
    windows, where there are enough of them to tell); what lies beyond, with no event, is not explained."""
    agents = [o for o in occupancies if o.kind == "agent"]
    if not agents:
        return occupancies
    if probe != "timer":
        return [o if o.kind != "agent" else unexplained(o.start_ns, o.end_ns, "no event while the measuring agent "
                                                        "was current", o.cpu, {"pid": o.detail.get("pid", 0)})
                for o in occupancies]
    nested = _Index([o for o in occupancies if o.kind in NESTED])
    typical = _typical_return(agents, nested, windows)
    bound = max(AGENT_RETURN_MIN_NS, AGENT_RETURN_FACTOR * typical) if typical is not None else AGENT_RETURN_MIN_NS
    cut: list[Occupancy] = []
    for occupancy in occupancies:
        end = _after_own(occupancy, bound, nested.overlapping(occupancy.cpu, occupancy.start_ns, occupancy.end_ns)) \
            if occupancy.kind == "agent" and occupancy.duration_ns > bound else None
        if end is None:
            cut.append(occupancy)
            continue
        cut.append(dataclasses.replace(occupancy, end_ns=end, detail={**occupancy.detail, "return_bound_ns": bound}))
        cut.append(unexplained(end, occupancy.end_ns, "no event while the measuring agent was current",
                               occupancy.cpu, {"pid": occupancy.detail.get("pid", 0), "return_bound_ns": bound}))
    return cut


def _after_own(agent: Occupancy, bound: int, nested: list[Occupancy]) -> int | None:
    """Where ``agent`` has had ``bound`` of time no nested occupancy took (None: it ends before)."""
    own, cursor = 0, agent.start_ns
    for inner, in_end in sorted((max(o.start_ns, agent.start_ns), min(o.end_ns, agent.end_ns)) for o in nested
                                if o.end_ns > agent.start_ns and o.start_ns < agent.end_ns):
        if inner > cursor:
            if own + inner - cursor >= bound:
                return cursor + bound - own
            own += inner - cursor
        cursor = max(cursor, in_end)
    if own + agent.end_ns - cursor > bound:
        return cursor + bound - own
    return None


def _typical_return(agents: Sequence[Occupancy], nested: _Index, windows: np.ndarray) -> int | None:
    """The median over the windows of the agent's own time from its last switch-in before the window's end to
    that end (nested occupancies' time left out); None for fewer than ``TYPICAL_WINDOWS`` windows."""
    spans = []
    measured = _Index(agents)
    for end, cpu in zip(windows["end_ns"].tolist(), windows["cpu"].tolist(), strict=True):
        inside = measured.overlapping(cpu, end - TEXT_RESOLUTION_NS, end + 1)
        if not inside:
            continue
        begin = max(o.start_ns for o in inside)
        taken = sum(min(o.end_ns, end) - max(o.start_ns, begin) for o in nested.overlapping(cpu, begin, end))
        spans.append(max(0, end - begin - taken))
    return int(np.median(spans)) if len(spans) >= TYPICAL_WINDOWS else None
