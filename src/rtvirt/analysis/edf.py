"""EDF schedulability on a whole processor or under a supply bound: demand-bound test and response times.

Demand bound function (Baruah, Mok & Rosier, "Preemptively scheduling hard-real-time sporadic tasks on
one processor", RTSS 1990), with release jitter J (a job may become ready up to J after its nominal
arrival while keeping its deadline):

    dbf(t) = Σ_i max(0, ⌊(t + J_i − D_i) / T_i⌋ + 1) · C_i

The set is EDF-schedulable on supply sbf iff dbf(t) ≤ sbf(t) for every t (Shin & Lee 2003 for sbf).
Only the steps of dbf (t = D_i − J_i + k·T_i) need checking, and only below a testing-set bound. With
sbf(t) ≥ α(t − Δ) and dbf(t) ≤ U·t + Σ (T_i − D_i + J_i)·U_i, a violation needs

    t < L = (Σ_i (T_i − D_i + J_i)·U_i + α·Δ) / (α − U)            (U < α)

(George, Rivierre & Spuri 1996 for the dedicated case; Shin & Lee 2003 for the sbf form). On a whole
processor the synchronous busy period is a tighter bound and is used too (Spuri 1996).

Per-task response times follow Spuri ("Analysis of deadline scheduled real-time systems", INRIA RR-2772,
1996): for a job of task i arriving at a inside a busy window, every other task contributes the jobs
released before the completion with a deadline no later than a + D_i; the candidate arrivals a are the
points where that count changes. Under a supply bound the completion is w = sbf⁻¹(demand(w)).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .fp import ResponseBound
from .supply import Dedicated, Supply
from .taskset import Task, ceil_div

__all__ = ["dbf", "DemandVerdict", "edf_demand_test", "edf_response_times", "busy_period"]

# Refuse to walk more test points than this (the answer is then "undetermined", reported as not proven).
MAX_TEST_POINTS = 2_000_000


def dbf(tasks: Sequence[Task], t: int) -> int:
    return sum(max(0, (t + task.jitter - task.deadline) // task.period + 1) * task.wcet for task in tasks)


def _total(tasks: Sequence[Task]) -> Fraction:
    return sum((Fraction(task.wcet, task.period) for task in tasks), Fraction(0))


def busy_period(tasks: Sequence[Task], supply: Supply) -> int | None:
    """Longest window the supply is kept busy from a synchronous release (None if it never ends)."""
    if not tasks or _total(tasks) > supply.rate:
        return None
    horizon = 10_000 * max(task.period for task in tasks) + int(supply.delay)
    window = supply.time_for(sum(task.wcet for task in tasks))
    while True:
        following = supply.time_for(sum(ceil_div(window + t.jitter, t.period) * t.wcet for t in tasks))
        if following == window:
            return window
        if following > horizon:
            return None
        window = following


@dataclass(frozen=True)
class DemandVerdict:
    schedulable: bool
    checked_points: int
    bound: int | None
    worst_point: int | None = None
    """The t with the largest dbf(t) − sbf(t) (first violation when unschedulable)."""
    excess: int = 0
    """dbf − sbf at ``worst_point``: positive = that much demand is not covered."""
    reason: str = ""


def _deadline_points(tasks: Sequence[Task], limit: int) -> Iterator[int]:
    heap = [(max(task.deadline - task.jitter, 0), index) for index, task in enumerate(tasks)]
    heapq.heapify(heap)
    last = -1
    while heap and heap[0][0] <= limit:
        point, index = heapq.heappop(heap)
        heapq.heappush(heap, (point + tasks[index].period, index))
        if point != last:
            last = point
            yield point


def testing_bound(tasks: Sequence[Task], supply: Supply) -> int | None:
    """Last instant at which dbf(t) > sbf(t) is possible, or None when the load exceeds the supply."""
    total = _total(tasks)
    alpha = supply.rate
    latest_deadline = max(task.deadline for task in tasks)
    candidates: list[int] = []
    if total < alpha:
        slack_sum = sum(((task.period - task.deadline + task.jitter) * Fraction(task.wcet, task.period)
                         for task in tasks), Fraction(0))
        candidates.append(int((slack_sum + alpha * supply.delay) / (alpha - total)) + 1)
    if isinstance(supply, Dedicated):
        busy = busy_period(tasks, supply)
        if busy is not None:
            candidates.append(busy)
    if not candidates:
        return None
    return max(min(candidates), latest_deadline)


def edf_demand_test(tasks: Sequence[Task], supply: Supply | None = None) -> DemandVerdict:
    supply = supply or Dedicated()
    if not tasks:
        return DemandVerdict(True, 0, 0)
    if _total(tasks) > supply.rate:
        return DemandVerdict(False, 0, None, reason=f"utilisation {float(_total(tasks)):.4f} exceeds the supply "
                                                     f"rate {float(supply.rate):.4f}")
    bound = testing_bound(tasks, supply)
    if bound is None:
        return DemandVerdict(False, 0, None, reason="utilisation equals the supply rate: no finite testing bound")
    worst_point, worst_excess, checked = None, None, 0
    for point in _deadline_points(tasks, bound):
        checked += 1
        if checked > MAX_TEST_POINTS:
            return DemandVerdict(False, checked, bound, worst_point, worst_excess or 0,
                                 reason=f"more than {MAX_TEST_POINTS} test points below {bound} ns: undetermined")
        excess = dbf(tasks, point) - supply.sbf(point)
        if worst_excess is None or excess > worst_excess:
            worst_point, worst_excess = point, excess
        if excess > 0:
            return DemandVerdict(False, checked, bound, point, excess,
                                 reason=f"demand exceeds supply by {excess} ns in a window of {point} ns")
    return DemandVerdict(True, checked, bound, worst_point, worst_excess or 0)


def _arrival_candidates(task: Task, tasks: Sequence[Task], busy: int) -> list[int]:
    """Arrivals of the analysed job (relative to the busy window) at which the interfering demand steps."""
    points = {-task.jitter}
    for other in tasks:
        if other is task:
            start, step = -task.jitter, task.period
        else:
            start, step = other.deadline - other.jitter - task.deadline, other.period
        if start < -task.jitter:
            start += ceil_div(-task.jitter - start, step) * step
        for k in range(max(0, ceil_div(busy - start, step))):
            points.add(start + k * step)
            if len(points) > MAX_TEST_POINTS:
                raise OverflowError
    return sorted(point for point in points if point < busy)


def edf_response_times(tasks: Sequence[Task], supply: Supply | None = None) -> list[ResponseBound]:
    """Spuri's worst-case response time of every task under EDF on ``supply``."""
    supply = supply or Dedicated()
    busy = busy_period(tasks, supply)
    if busy is None:
        reason = f"utilisation {float(_total(tasks)):.4f} reaches the supply rate {float(supply.rate):.4f}"
        return [ResponseBound(task, None, reason) for task in tasks]
    results = []
    for task in tasks:
        try:
            arrivals = _arrival_candidates(task, tasks, busy)
        except OverflowError:
            results.append(ResponseBound(task, None, "too many candidate arrivals: undetermined"))
            continue
        worst = task.wcet + task.jitter
        for arrival in arrivals:
            absolute_deadline = arrival + task.deadline
            own = ((arrival + task.jitter) // task.period + 1) * task.wcet
            # Jobs of each other task with a deadline no later than the analysed job's.
            others = [(other, (absolute_deadline - other.deadline + other.jitter) // other.period + 1)
                      for other in tasks if other is not task]
            others = [(other, limit) for other, limit in others if limit > 0]

            def demand(window: int, others: list[tuple[Task, int]] = others, own: int = own) -> int:
                return own + sum(min(ceil_div(window + o.jitter, o.period), limit) * o.wcet for o, limit in others)

            window = supply.time_for(own)
            while True:
                following = supply.time_for(demand(window))
                if following == window:
                    break
                window = following
            worst = max(worst, window - arrival)
        results.append(ResponseBound(task, worst))
    return results
