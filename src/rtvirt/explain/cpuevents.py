"""A CPU's trace events turned into what held it: tasks, IRQs, softirqs, IRQ vectors, timer callbacks.

One reader for every Linux trace rtvirt explains: the host layer's (explain.host), a guest's own (explain.guest)
and an imported file (explain.imported). Each CPU's events, in time order, become intervals: a task from its
switch-in to its switch-out, an IRQ handler from entry to exit, a timer callback from its expiry to the end of
the interrupt or softirq that ran it (or its own exit event, where traced: the default set leaves it out, it is
on every wake-up's path). The measuring agent's own threads are told apart: its real-time threads (and
timerlat's ``timerlat/N``) are the measurer, its other threads (the writer, timerlat's readers) are tasks like
any other, named as the agent's.

What the trace does not hold is not made up. A switch whose switch-in is missing (this development VM's kernel
loses some) is bounded by the events around it: every line names the task that was current when it was
recorded, so the old task ran until the last line naming it and the new one from the first; what lies
between is ``unexplained (switch not traced)``, except after idle, which the kernel only leaves to run a task.
Where the kernel lost events (a ``[LOST n EVENTS]`` line) or the flight recorder kept no trace, a gap marker
(``rtvirt_gap``) stands in the text: what was known of the CPU is forgotten there and the stretch since its
previous event is ``unexplained (trace lost ...)``. Strings from the trace (comms, IRQ names) are untrusted:
escaped and bounded here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .model import Layer, Occupancy
from .tracefs import GAP_EVENT, TraceEvent, body_fields, bounded

__all__ = ["occupancies_from_events", "task_cause", "TaskName", "bounded", "switched_pids", "Agents", "IRQ_VECTORS",
           "MEASURER_TIMERS", "AGENT_COMMS", "unexplained", "policy_matches"]

AGENT_COMMS = ("rtvirt-probe",)  # the agent's threads as a trace without its pids knows them (imported files)
# the x86 IRQ vectors of irq_vectors (each *_entry/*_exit pair); other *_entry/*_exit events (kvm_entry,
# timer_expire_entry, tasklet_entry...) are no IRQ vector
IRQ_VECTORS = frozenset({"local_timer", "reschedule", "call_function", "call_function_single", "irq_work",
                         "x86_platform_ipi", "thermal_apic", "threshold_apic", "deferred_error_apic", "error_apic",
                         "spurious_apic", "reboot"})
# the timer callbacks that wake a measuring thread: a sleeping thread's own (timer probe), timerlat's
MEASURER_TIMERS = ("hrtimer_wakeup", "timerlat_irq")

_SWITCH = re.compile(r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>-?\d+) prev_prio=(?P<prev_prio>-?\d+) "
                     r"prev_state=\S+ ==> next_comm=(?P<next_comm>.*) next_pid=(?P<next_pid>-?\d+) "
                     r"next_prio=(?P<next_prio>-?\d+)$")
_SWITCHED_PIDS = re.compile(r" prev_pid=(\d+) prev_prio=-?\d+ prev_state=\S+ ==> next_comm=.* next_pid=(\d+) "
                            r"next_prio=-?\d+$", re.MULTILINE)
_IRQ_ENTRY = re.compile(r"irq=(?P<irq>\d+) name=(?P<name>.*)$")
_REAL_TIME = ("SCHED_FIFO", "SCHED_RR")


def policy_matches(policy: str, kernel_prio: int) -> bool:
    """Whether a policy asked of the kernel at the end of the run fits the priority the trace recorded (a task
    boosted by priority inheritance, or a pid reused since, does not)."""
    if kernel_prio < 0:
        return policy == "SCHED_DEADLINE"
    if kernel_prio < 100:
        return policy in _REAL_TIME
    return policy not in (*_REAL_TIME, "SCHED_DEADLINE")


@dataclass(frozen=True, slots=True)
class TaskName:
    """A task as a user reads it: ``cause`` with its pid, ``culprit`` without (the same in every run)."""

    cause: str
    culprit: str
    detail: dict[str, str | int]


def task_cause(comm: str, pid: int, kernel_prio: int, known: tuple[str, str] | None = None) -> TaskName:
    """A task's name from its kernel priority (sched_switch's ``prio``: -1 deadline, 0-98 real-time (99 - rt
    priority), 100-139 normal (120 + nice)) and, when the kernel told it at the end of the run, its policy
    (``known``: policy and comm; used only when the comm is the traced one and the policy fits the traced
    priority: a reused pid or a priority-inheritance boost would misname it)."""
    comm = bounded(comm, 16)
    policy = known[0] if known is not None and known[1] == comm and policy_matches(known[0], kernel_prio) else None
    if kernel_prio < 0:
        policy, prio = policy or "SCHED_DEADLINE", 0
    elif kernel_prio < 100:
        policy, prio = policy or "SCHED_FIFO/RR", 99 - kernel_prio
    else:
        policy, prio = policy or "SCHED_OTHER", kernel_prio - 120
    shown = f"{prio}" if kernel_prio < 100 else f"nice {prio}"
    detail: dict[str, str | int] = {"comm": comm, "pid": pid, "policy": policy, "prio": prio}
    if known is not None and known[1] == comm and policy is not None and known[0] != policy:
        detail["policy_at_end"] = known[0]  # e.g. SCHED_OTHER boosted by priority inheritance while traced
    return TaskName(f"task {comm}/{pid} {policy} {shown}", f"task {comm} {policy} {shown}", detail)


def switched_pids(text: str) -> set[int]:
    """The tasks a trace switched in or out: a task's switch-in may be missing (a real-time task woken from
    idle on 6.x kernels) while its switch-out names it."""
    return {int(pid) for pair in _SWITCHED_PIDS.findall(text) for pid in pair}


def unexplained(start: int, end: int, why: str, cpu: int, detail: dict[str, str | int] | None = None,
                layer: Layer = "unexplained") -> Occupancy:
    """A stretch no traced occupancy can name, saying why (the lowest precedence: anything traced wins)."""
    return Occupancy(layer, start, end, f"unexplained ({why})", "unexplained", cpu, detail or {},
                     culprit=f"unexplained ({why})")


class Agents:
    """The measuring agent's threads: those whose pid or tgid is one of the agent's pids (a host agent), or
    named like it (``AGENT_COMMS``, a trace without pids: a guest's, a file); timerlat's ``timerlat/N`` kernel
    threads measure for it. Its real-time threads are the measurer; the others are its writer or readers."""

    def __init__(self, pids: Sequence[int], tgids: dict[int, int], by_comm: bool) -> None:
        self.pids = set(pids)
        self.tgids = tgids
        self.by_comm = by_comm

    def owns(self, pid: int, comm: str) -> bool:
        return pid in self.pids or self.tgids.get(pid, -1) in self.pids or \
            comm.startswith("timerlat/") or (self.by_comm and comm in AGENT_COMMS)

    def measures(self, pid: int, comm: str, kernel_prio: int) -> bool:
        """The thread is one that measures: timerlat's, or the agent's at a real-time priority."""
        return comm.startswith("timerlat/") or (self.owns(pid, comm) and kernel_prio < 100)


@dataclass
class _Current:
    """The task on the CPU: since when, and what the trace says of it (``prio`` None until a switch names it)."""

    start: int
    comm: str
    pid: int
    prio: int | None
    switch_in: str = ""  # how its start was found when its switch-in is missing


@dataclass
class _Open:
    start: int
    kind: str
    cause: str
    detail: dict[str, str | int] = field(default_factory=dict)


class _CpuReader:
    """One CPU's events in time order, read into occupancies (``found``)."""

    def __init__(self, cpu: int, layer: Layer, agents: Agents, policies: dict[int, tuple[str, str]]) -> None:
        self.cpu, self.layer, self.agents, self.policies = cpu, layer, agents, policies
        self.found: list[Occupancy] = []
        self.task: _Current | None = None
        self.contexts: list[tuple[str, _Open]] = []  # open IRQs, softirqs and vectors, innermost last
        self.timers: dict[str, _Open] = {}  # the context a timer callback runs in -> that callback
        self.last_ts: int | None = None
        self.seen_last: dict[int, int] = {}  # since the last switch: pid -> the last line naming it current
        self.seen_first: dict[int, int] = {}  # ... and the first

    def read(self, event: TraceEvent) -> None:
        ts = event.ts_ns
        if event.event == GAP_EVENT:
            self._gap(ts, event.body)
            return
        if self.task is None and event.event != "sched_switch" and event.pid >= 0:
            # (after a gap) the line names the task that is current now; its start is not known
            self.task = _Current(ts, event.comm, event.pid, None, "not traced: current at its first line after "
                                 "a gap in the trace")
        self.seen_first.setdefault(event.pid, ts)
        self.seen_last[event.pid] = ts
        if "none" in self.timers and not event.event.startswith("hrtimer_expire"):
            self._emit(self.timers.pop("none"), ts)  # a callback outside any traced context: ends by the next event
        handler = _HANDLERS.get(event.event)
        if handler is not None:
            handler(self, ts, event.body)
        elif event.event.endswith("_entry") and event.event.removesuffix("_entry") in IRQ_VECTORS:
            self._vector_entry(ts, event.event.removesuffix("_entry"), event.body)
        elif event.event.endswith("_exit") and event.event.removesuffix("_exit") in IRQ_VECTORS:
            self._close_context(f"vector:{event.event.removesuffix('_exit')}", ts)
        self.last_ts = ts

    # ---- tasks ----------------------------------------------------------------------------------------------

    def _switch(self, ts: int, body: str) -> None:
        match = _SWITCH.match(body)
        if match is None:
            return
        prev_pid, prev_prio = int(match["prev_pid"]), int(match["prev_prio"])
        task = self.task
        if task is not None and task.pid != prev_pid:
            task = self._missing_switch_in(task, match["prev_comm"], prev_pid, ts)
        if task is not None and ts > task.start:  # (its priority as it was switched in, when the trace has that)
            self._task_ran(task, ts, prev_prio if task.pid == prev_pid and task.prio is None else task.prio)
        self.task = _Current(ts, match["next_comm"], int(match["next_pid"]), int(match["next_prio"]))
        self.seen_first, self.seen_last = {}, {}

    def _missing_switch_in(self, task: _Current, comm: str, pid: int, ts: int) -> _Current:
        """The kernel switches out ``pid`` while the trace has ``task`` current: the switch between them is not
        in the trace. ``task`` ran until the last line naming it, ``pid`` from the first; in between, after
        idle, ``pid`` (the kernel leaves idle only to run a task), else nobody known."""
        last = max(task.start, self.seen_last.get(task.pid, task.start))
        if last > task.start:
            self._task_ran(task, last, task.prio)
        if task.pid == 0:
            return _Current(last, comm, pid, None, "not traced: counted from the CPU's last idle event")
        first = max(last, self.seen_first.get(pid, ts))
        if first > last:
            self.found.append(unexplained(last, first, "switch not traced", self.cpu,
                                          {"before": bounded(task.comm, 16), "after": bounded(comm, 16)}))
        return _Current(first, comm, pid, None, "not traced: counted from its first traced event")

    def _task_ran(self, task: _Current, end: int, prio: int | None) -> None:
        if task.pid == 0:
            self.found.append(Occupancy(self.layer, task.start, end, "idle: the CPU slept", "idle-exit", self.cpu,
                                        {}, culprit="idle"))
            return
        prio = 120 if prio is None else prio  # (no switch named it: a task current across a gap)
        if self.agents.measures(task.pid, task.comm, prio):
            comm = bounded(task.comm, 16)
            self.found.append(Occupancy(self.layer, task.start, end, f"measuring agent on the CPU ({comm}/"
                                        f"{task.pid}: switched in, not yet stamped)", "agent", self.cpu,
                                        {"comm": comm, "pid": task.pid}, culprit="measuring agent"))
            return
        name = task_cause(task.comm, task.pid, prio, self.policies.get(task.pid))
        cause, culprit, variant = name.cause, name.culprit, ""
        if self.agents.owns(task.pid, task.comm):  # its writer or reader: a task like any other, named as such
            cause, culprit = f"{cause} (the agent's writer or reader)", f"{culprit} (the agent's writer or reader)"
        detail = dict(name.detail)
        if task.switch_in:
            cause, variant, detail["switch_in"] = f"{cause} (switch-in {task.switch_in})", \
                f"switch-in {task.switch_in}", task.switch_in
        self.found.append(Occupancy(self.layer, task.start, end, cause, "task", self.cpu, detail, culprit=culprit,
                                    variant=variant))

    # ---- interrupts and timers -------------------------------------------------------------------------------

    def _open_context(self, key: str, ts: int, opened: _Open) -> None:
        self._close_context(key, ts)  # (an entry whose exit is missing ends where the next one begins)
        self.contexts.append((key, opened))

    def _close_context(self, key: str, ts: int) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            self._emit(timer, ts)
        for index in range(len(self.contexts) - 1, -1, -1):
            if self.contexts[index][0] == key:
                self._emit(self.contexts.pop(index)[1], ts)
                return

    def _emit(self, opened: _Open, end: int) -> None:
        if end > opened.start:
            self.found.append(Occupancy(self.layer, opened.start, end, opened.cause, opened.kind, self.cpu,
                                        opened.detail))

    def _irq_entry(self, ts: int, body: str) -> None:
        match = _IRQ_ENTRY.match(body)
        if match is not None:
            irq, name = int(match["irq"]), bounded(match["name"], 32)
            self._open_context(f"irq:{irq}", ts, _Open(ts, "irq", f"irq {irq} {name}", {"irq": irq, "name": name}))

    def _irq_exit(self, ts: int, body: str) -> None:
        self._close_context(f"irq:{body_fields(body).get('irq', '')}", ts)

    def _softirq_entry(self, ts: int, body: str) -> None:
        fields = body_fields(body)
        action = bounded(fields.get("action", "").rstrip("]"), 16) or fields.get("vec", "?")
        self._open_context("softirq", ts, _Open(ts, "softirq", f"softirq {action}",
                                                {"vec": fields.get("vec", ""), "action": action}))

    def _softirq_exit(self, ts: int, body: str) -> None:
        self._close_context("softirq", ts)

    def _vector_entry(self, ts: int, vector: str, body: str) -> None:
        number = body_fields(body).get("vector", "")
        self._open_context(f"vector:{vector}", ts, _Open(ts, "irq-vector", f"irq vector {vector}", {
            "vector": vector, **({"number": int(number)} if number.isdigit() else {})}))

    def _timer_entry(self, ts: int, body: str) -> None:
        """A timer callback runs in the innermost open interrupt or softirq (a hard timer in the local timer
        interrupt, a soft one in the HRTIMER softirq): it ends where the next callback there starts, or with
        that context (its own exit event, where traced, ends it first)."""
        fields = body_fields(body)
        function = bounded(fields.get("function", "?"), 48)
        context = self.contexts[-1][0] if self.contexts else "none"
        previous = self.timers.pop(context, None)
        if previous is not None:
            self._emit(previous, ts)
        detail: dict[str, str | int] = {"function": function, "hrtimer": bounded(fields.get("hrtimer", ""), 24)}
        if fields.get("now", "").isdigit():
            detail["now_ns"] = int(fields["now"])  # the timer base's time at expiry, in ns
        self.timers[context] = _Open(ts, "timer", f"timer {function}", detail)

    def _timer_exit(self, ts: int, body: str) -> None:
        pointer = body_fields(body).get("hrtimer", "")
        for context, opened in list(self.timers.items()):
            if opened.detail.get("hrtimer") == pointer:
                self._emit(self.timers.pop(context), ts)

    def finish(self, until: int | None) -> None:
        """The events end: the task current since its last switch held the CPU until ``until`` (the end of what
        was read, when the trace goes on past it) or the CPU's last event."""
        end = max(self.last_ts or 0, until or 0)
        if self.task is not None and end > self.task.start:
            self._task_ran(self.task, end, self.task.prio)

    # ---- gaps --------------------------------------------------------------------------------------------------

    def _gap(self, ts: int, body: str) -> None:
        """The trace lost events here, or the flight recorder kept none before this point: everything open is
        unknown from the CPU's previous event on; the stretch is unexplained, and the CPU's state is forgotten."""
        since = self.last_ts if self.last_ts is not None else ts
        if self.task is not None and since > self.task.start:
            self._task_ran(self.task, since, self.task.prio)
        for _, opened in self.contexts:
            self._emit(opened, since)
        for opened in self.timers.values():
            self._emit(opened, since)
        lost = body_fields(body).get("lost", "")
        if ts > since:
            why = f"trace lost: the kernel dropped {lost} events" if lost.isdigit() else "trace not kept"
            self.found.append(unexplained(since, ts, why, self.cpu))
        self.task, self.contexts, self.timers = None, [], {}
        self.seen_first, self.seen_last = {}, {}
        self.last_ts = ts


_HANDLERS: dict[str, Callable[[_CpuReader, int, str], None]] = {
    "sched_switch": _CpuReader._switch,
    "irq_handler_entry": _CpuReader._irq_entry, "irq_handler_exit": _CpuReader._irq_exit,
    "softirq_entry": _CpuReader._softirq_entry, "softirq_exit": _CpuReader._softirq_exit,
    "hrtimer_expire_entry": _CpuReader._timer_entry, "hrtimer_expire_exit": _CpuReader._timer_exit,
}


def occupancies_from_events(events: Iterable[TraceEvent], agent_pids: Sequence[int],
                            policies: dict[int, tuple[str, str]] | None = None, layer: Layer = "host",
                            agents_by_comm: bool = False, until: int | None = None) -> list[Occupancy]:
    """Intervals of what held each CPU: tasks (the measuring agent's named as such), IRQs, softirqs, vectors,
    timer callbacks, and the stretches the trace cannot name (``unexplained``: a switch or events lost).

    ``events`` of any CPUs, each CPU's in time order. A thread belongs to the agent when its pid or tgid is in
    ``agent_pids`` (tgids come from the trace's tgid column: every thread that ran shows it), or, with
    ``agents_by_comm``, when it is named like the agent. ``policies``: pid -> (policy, comm) asked of the
    kernel at the end of the run. The task current at the end held its CPU until ``until`` (the end of a stretch
    read from a longer trace), else until the CPU's last event."""
    by_cpu: dict[int, list[TraceEvent]] = {}
    tgids: dict[int, int] = {}
    for event in events:
        by_cpu.setdefault(event.cpu, []).append(event)
        if event.tgid is not None:
            tgids[event.pid] = event.tgid
    agents = Agents(agent_pids, tgids, agents_by_comm)
    occupancies: list[Occupancy] = []
    for cpu, cpu_events in by_cpu.items():
        reader = _CpuReader(cpu, layer, agents, policies or {})
        for event in cpu_events:
            reader.read(event)
        reader.finish(until)
        occupancies += reader.found
    occupancies.sort(key=lambda o: (o.cpu, o.start_ns))
    return occupancies
