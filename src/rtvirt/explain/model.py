"""What an explanation is made of: who held a CPU when, per layer, on the run's own sample clock.

Every tracing source (host tracefs, the VM's vCPU threads, Xen's scheduler trace, the guest's own tracer)
turns what it saw into :class:`Occupancy` intervals on the *sample clock* (the clock of the stream's
``t_ns``), saying how well it could align its clock with that one. The attribution (``explain.attribute``)
cuts each outlier's latency window into :class:`Part` rows from those intervals; what no interval covers is
``unexplained``, with what could not be seen. Nothing here imports a source: they all point down to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

__all__ = ["LAYERS", "Layer", "Occupancy", "LayerTrace", "Part", "Explanation", "CollectContext", "TraceSource",
           "HELD_KINDS", "culprit_of"]

Layer = Literal["host", "vm", "kvm", "xen", "guest", "unexplained"]
# outermost first: while an outer layer held the CPU nothing inside it ran, so it takes precedence (kvm inside vm:
# while the vCPU's thread was off its pCPU, whoever ran is the cause; while it was on, KVM's exit handling)
LAYERS: tuple[Layer, ...] = ("host", "xen", "vm", "kvm", "guest", "unexplained")
# kinds of an outer layer that did not run the inner one, with nothing traced running instead: a vCPU thread
# stopped, asleep or runnable on an idle pCPU, a timer interrupt that came late to an idle CPU, time the
# guest's runstate area says Xen took, a vCPU Xen kept blocked. The headline counts the outliers they
# dominate apart from those a traced cause explains ("held back by a layer not traced")
HELD_KINDS = frozenset({"vcpu-stopped", "vcpu-asleep", "vcpu-waiting", "irq-late", "guest-irq-late", "stolen",
                        "xen-held"})


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Something that ran instead of (or delayed) the measuring thread during [start_ns, end_ns).

    ``cause`` is the name a user reads ("task stress-cpu/1234 SCHED_FIFO 99", "irq 24 virtio0-input",
    "vCPU not running: qemu-system-x86/5551 ran", "runnable: domU rt-2 ran", "budget exhausted, replenished
    at +2.1 ms"); ``kind`` its family (task, irq, softirq, idle-exit, timer, vm-exit, vcpu-preempted,
    runstate, budget, window, guest-irq, guest-thread, steal); ``detail`` the fields behind it (comm, pid,
    policy, prio, vector, exit reason, domain). Strings from traced systems are untrusted: sources escape
    and bound them before they get here.
    """

    layer: Layer
    start_ns: int
    end_ns: int
    cause: str
    kind: str
    cpu: int = -1  # the CPU (host pCPU, or the guest's vCPU) it ran on; -1: not tied to one
    detail: dict[str, str | int] = field(default_factory=dict)
    # the culprit a summary pools this under, the same in every run and thread ("task rtvirt-stress SCHED_FIFO
    # 90": no pid), and what sets this one apart from its culprit's other occupancies ("before the timer
    # interrupt", "kept the CPU after the real-time thread was woken", a vCPU's state); "": the cause itself
    culprit: str = ""
    variant: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class LayerTrace:
    """What one source saw of a run, already on the sample clock."""

    layer: Layer
    seen: bool  # False: this layer could not be traced; ``why_not`` says why
    why_not: str | None = None
    occupancies: list[Occupancy] = field(default_factory=list)
    alignment_ns: int = 0  # uncertainty of the mapping from the source's clock to the sample clock
    dropped_events: int = 0  # events the bounded buffer lost (a run states it; never silent)
    notes: list[str] = field(default_factory=list)  # what the user should know ("host steal rose by 3.1 ms")
    # what tracing cost the run (explain.cost: events, seconds, events_per_s_per_cpu, text_bytes, event_ns, ...)
    cost: dict[str, float] = field(default_factory=dict)
    # where an outlier's thread waited on another CPU than its sample's: [window start, window cpu, from, cpu]
    moves: list[list[int]] = field(default_factory=list)
    # tables a layer reports beside its occupancies, by name (the KVM layer's "kvm_exits": perf kvm stat's rows)
    tables: dict[str, list[dict[str, object]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Part:
    """One named, timed part of one outlier's latency window (a row of the run's ``explain.parquet``)."""

    sample_t_ns: int  # the outlier's t_ns (planned wake-up, gap start): sample clock
    latency_ns: int  # the outlier's value
    cpu: int
    rank: int  # 1 = the run's largest outlier
    layer: Layer
    kind: str
    cause: str
    offset_ns: int  # where the part starts, from the window's start
    duration_ns: int
    detail: str  # JSON of the occupancy's detail (bounded)
    culprit: str = ""  # the occupancy's culprit (Occupancy.culprit; "": the cause), what summaries pool by
    variant: str = ""  # what sets it apart from its culprit's other parts (phase, state; "": none)


@dataclass(frozen=True, slots=True)
class CollectContext:
    """What a source needs to put its events on the sample clock and pick out the measurer.

    ``header`` is the stream header (docs/sample-stream.md: start_monotonic_ns, start_realtime_ns, cycles_hz,
    params.affinity); ``windows`` the outlier windows (columns start_ns, end_ns, cpu on the sample clock);
    ``agent_pids`` the host pids of the measuring agent's process (empty in a guest or on a target).
    """

    header: dict[str, object]
    windows: np.ndarray
    agent_pids: tuple[int, ...] = ()


class TraceSource(Protocol):
    """A tracer beside one run: armed before the agent starts, stopped after it ended (also on failure and
    Ctrl-C; idempotent; leaves the traced system as found), then asked for what it saw."""

    layer: Layer

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def collect(self, context: CollectContext) -> LayerTrace: ...


@dataclass(slots=True)
class Explanation:
    """A run's explanation: its outliers' parts, what each layer could see, and the share of outlier latency
    by cause. Stored beside the samples (``explain.stored``); ``rtvirt explain``, the report and ``rtvirt sql``
    all read this one thing."""

    threshold_ns: int
    threshold_rule: str  # how the threshold was chosen ("p99.9 = 61.2 us (floor 20 us)", "--threshold 50us")
    outliers: int  # samples above the threshold (parts are kept for the ``top`` largest of them at most)
    parts: list[Part]
    layers: list[LayerTrace]  # occupancies kept only around the largest outliers (the report's timelines)
    # [{culprit, layer, kind, total_ns, outliers, share, variants}] over every explained outlier, largest first
    summary: list[dict[str, object]]


def culprit_of(item: Occupancy | Part) -> str:
    """What a summary pools an occupancy or part under (its culprit, or its cause when it names none)."""
    return item.culprit or item.cause
