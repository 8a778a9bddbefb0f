"""Fixed-priority preemptive response-time analysis, on a whole processor or under a supply bound.

The level-i busy-window iteration (Joseph & Pandya 1986; Audsley, Burns, Richardson, Tindell & Wellings,
"Applying new scheduling theory to static priority pre-emptive scheduling", SEJ 1993; release jitter and
arbitrary deadlines after Tindell, Burns & Wellings 1994): for the (q+1)-th job of task i in a level-i
busy window,

    w_q = B_i + (q+1)·C_i + Σ_{j ∈ hp(i)} ⌈(w_q + J_j) / T_j⌉ · C_j        (fixed point from w = B_i + (q+1)C_i)
    R_i = max_q (w_q − q·T_i + J_i),        stop at the first q with w_q ≤ (q+1)·T_i − J_i.

Under a supply bound function the window must be long enough for the supply to cover the demand
(Shin & Lee 2003; Almeida & Pedreiras 2004): w = sbf⁻¹(demand(w)) — ``Supply.time_for``. With the
dedicated supply this is the classical equation. Tasks of equal priority are counted as interfering
(the guest may serve them first), which keeps the bound safe for FIFO tie-breaking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .supply import Dedicated, Supply
from .taskset import Task, ceil_div

__all__ = ["ResponseBound", "fp_response_time", "fp_analysis"]

# A busy window longer than this many of the longest period is treated as unbounded.
_HORIZON_PERIODS = 10_000


@dataclass(frozen=True)
class ResponseBound:
    """The outcome for one task: ``wcrt`` is None when no finite bound exists (overload)."""

    task: Task
    wcrt: int | None
    reason: str = ""

    @property
    def schedulable(self) -> bool:
        return self.wcrt is not None and self.wcrt <= self.task.deadline

    @property
    def slack(self) -> int | None:
        """Deadline minus bound; negative says by how much the deadline can be missed."""
        return None if self.wcrt is None else self.task.deadline - self.wcrt


def _interference(window: int, higher: Sequence[Task]) -> int:
    return sum(ceil_div(window + task.jitter, task.period) * task.wcet for task in higher)


def fp_response_time(task: Task, higher: Sequence[Task], supply: Supply | None = None) -> ResponseBound:
    """Worst-case response of ``task`` (from nominal arrival to completion) below ``higher``."""
    supply = supply or Dedicated()
    load = Fraction(task.wcet, task.period) + sum((Fraction(t.wcet, t.period) for t in higher), Fraction(0))
    if load > supply.rate:
        return ResponseBound(task, None, f"level load {float(load):.4f} exceeds the supply rate "
                                         f"{float(supply.rate):.4f}: the busy window never ends")
    horizon = _HORIZON_PERIODS * max([task.period, *(t.period for t in higher)]) + int(supply.delay)
    worst = 0
    job = 0
    while True:
        own = task.blocking + (job + 1) * task.wcet
        window = supply.time_for(own)
        while True:
            following = supply.time_for(own + _interference(window, higher))
            if following == window:
                break
            if following > horizon:
                return ResponseBound(task, None, "busy window exceeds the analysis horizon (load at the supply rate)")
            window = following
        worst = max(worst, window - job * task.period + task.jitter)
        if window <= (job + 1) * task.period - task.jitter:
            return ResponseBound(task, worst)
        if window > horizon:  # load exactly at the supply rate: the busy window may never close
            return ResponseBound(task, None, "busy window exceeds the analysis horizon (load at the supply rate)")
        job += 1


def fp_analysis(tasks: Sequence[Task], supply: Supply | None = None) -> list[ResponseBound]:
    """Response bounds for every task of a fixed-priority task set (larger ``priority`` = more urgent)."""
    return [fp_response_time(task, [other for other in tasks if other is not task and other.priority >= task.priority],
                             supply)
            for task in tasks]
