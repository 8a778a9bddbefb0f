"""Supply bound functions (sbf) of the processor share a vCPU receives.

sbf(t) is the least processor time the vCPU is guaranteed in ANY interval of length t while it has work.
Guest tasks are then analysed against that supply instead of a whole processor (``fp``, ``edf``).

Models, all in integer nanoseconds:

- ``Dedicated``: a whole pCPU, sbf(t) = t (partitioned / NULL scheduler, Jailhouse, Bao).
- ``ExplicitDeadlinePeriodic`` (Easwaran, Anand & Lee, "Compositional analysis framework using EDP
  resource models", RTSS 2007): budget Θ delivered within the first Δ of every period Π. Its worst case
  is Θ supplied at the very start of one period and at the very end of the Δ-window of the next, a
  blackout of Π + Δ − 2Θ; with y = t − (Δ − Θ) and k = ⌊y/Π⌋:
      sbf(t) = kΘ + max(0, y − kΠ − (Π − Θ))          (0 for y < 0)
- ``PeriodicResource`` (Shin & Lee, "Periodic resource model for compositional real-time guarantees",
  RTSS 2003): the EDP with Δ = Π, blackout 2(Π − Θ).
- ``WindowSupply`` (ARINC 653): a repeating major frame of fixed windows; the exact sbf is the minimum,
  over start points, of the supply in [s, s + t]. Moving s inside a gap to the left, or inside a window
  to the right, never increases that supply, so the minimum is taken at the end of one of the vCPU's
  own windows: only those start points are evaluated.

- ``DelayedSupply``: another supply that may start only after a fixed delay d, sbf(t) = inner(t − d)
  (SEDF's short-unblocking rule: a woken domain first waits for its next period).
- ``LeftoverSupply``: what fixed-priority interferers with request bound rbf(t) = Σ ⌈(t + J)/T⌉·C leave;
  the supply in [0, t] is at least s − rbf(s) for every s ≤ t, so sbf(t) = max_{s ≤ t} (s − rbf(s)) and the
  inverse is the response-time fixed point t = w + rbf(t) (Lehoczky, Sha & Ding 1989; Bini & Buttazzo).

Each model also gives a linear lower bound sbf(t) ≥ α(t − Δ) (rate α, delay Δ) that bounds how far the
EDF demand test must look.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .taskset import Task, ceil_div

__all__ = ["Supply", "Dedicated", "ExplicitDeadlinePeriodic", "PeriodicResource", "WindowSupply", "DelayedSupply",
           "OverrunSupply", "LeftoverSupply"]


class Supply(ABC):
    """A lower bound on the processor time delivered in any window of a given length."""

    @abstractmethod
    def sbf(self, t: int) -> int:
        """Least supply in any interval of length ``t``."""

    @abstractmethod
    def time_for(self, work: int) -> int:
        """Smallest interval length t with sbf(t) >= work (the inverse the response-time analyses need)."""

    @property
    @abstractmethod
    def rate(self) -> Fraction:
        """Long-run share α of a processor."""

    @property
    @abstractmethod
    def delay(self) -> Fraction:
        """Δ such that sbf(t) >= α(t − Δ) for every t."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Parameters for reports."""


@dataclass(frozen=True)
class Dedicated(Supply):
    def sbf(self, t: int) -> int:
        return max(0, t)

    def time_for(self, work: int) -> int:
        return max(0, work)

    @property
    def rate(self) -> Fraction:
        return Fraction(1)

    @property
    def delay(self) -> Fraction:
        return Fraction(0)

    def describe(self) -> dict[str, Any]:
        return {"model": "dedicated"}


@dataclass(frozen=True)
class ExplicitDeadlinePeriodic(Supply):
    period: int
    budget: int
    deadline: int

    def __post_init__(self) -> None:
        if not 0 < self.budget <= self.deadline <= self.period:
            raise ValueError(f"supply needs 0 < budget <= deadline <= period, got budget {self.budget}, "
                             f"deadline {self.deadline}, period {self.period}")

    @property
    def blackout(self) -> int:
        """Longest interval with no supply at all."""
        return self.period + self.deadline - 2 * self.budget

    def sbf(self, t: int) -> int:
        y = t - (self.deadline - self.budget)
        if y < 0:
            return 0
        k = y // self.period
        return k * self.budget + max(0, y - k * self.period - (self.period - self.budget))

    def time_for(self, work: int) -> int:
        if work <= 0:
            return 0
        full_periods = ceil_div(work, self.budget) - 1
        remainder = work - full_periods * self.budget  # in (0, budget]
        return self.blackout + full_periods * self.period + remainder

    @property
    def rate(self) -> Fraction:
        return Fraction(self.budget, self.period)

    @property
    def delay(self) -> Fraction:
        return Fraction(self.blackout)

    def describe(self) -> dict[str, Any]:
        return {"model": "edp", "period_ns": self.period, "budget_ns": self.budget, "deadline_ns": self.deadline}


def PeriodicResource(period: int, budget: int) -> ExplicitDeadlinePeriodic:  # noqa: N802 - reads as a type
    """Shin & Lee's periodic resource Γ(Π, Θ): the EDP with deadline equal to its period."""
    return ExplicitDeadlinePeriodic(period, budget, period)


@dataclass(frozen=True)
class WindowSupply(Supply):
    """Windows [start, end) of one vCPU inside a major frame that repeats forever."""

    frame: int
    windows: tuple[tuple[int, int], ...]
    _relative: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = sorted(self.windows)
        if not ordered:
            raise ValueError("a window supply needs at least one window")
        for start, end in ordered:
            if not 0 <= start < end <= self.frame:
                raise ValueError(f"window [{start}, {end}) does not lie inside the major frame of {self.frame}")
        for (_, end), (next_start, _) in zip(ordered, ordered[1:], strict=False):
            if next_start < end:
                raise ValueError("windows of one vCPU overlap")
        # Windows as seen from the end of each own window (the only candidate worst-case starts).
        views = []
        for _, own_end in ordered:
            shifted = sorted(((start - own_end) % self.frame, (start - own_end) % self.frame + end - start)
                             for start, end in ordered)
            views.append(tuple(shifted))
        object.__setattr__(self, "windows", tuple(ordered))
        object.__setattr__(self, "_relative", tuple(views))

    @property
    def per_frame(self) -> int:
        return sum(end - start for start, end in self.windows)

    @staticmethod
    def _cumulative(view: Sequence[tuple[int, int]], x: int) -> int:
        return sum(min(max(x - start, 0), end - start) for start, end in view)

    def sbf(self, t: int) -> int:
        if t <= 0:
            return 0
        frames, rest = divmod(t, self.frame)
        return frames * self.per_frame + min(self._cumulative(view, rest) for view in self._relative)

    def time_for(self, work: int) -> int:
        if work <= 0:
            return 0
        frames = ceil_div(work, self.per_frame) - 1
        remainder = work - frames * self.per_frame
        latest = 0
        for view in self._relative:
            before = 0
            for start, end in view:
                if before + (end - start) >= remainder:
                    latest = max(latest, start + remainder - before)
                    break
                before += end - start
        return frames * self.frame + latest

    @property
    def rate(self) -> Fraction:
        return Fraction(self.per_frame, self.frame)

    @property
    def delay(self) -> Fraction:
        # t − sbf(t)/α is largest just before supply resumes, i.e. at a window start seen from a worst start.
        return max(start - Fraction(self._cumulative(view, start)) / self.rate
                   for view in self._relative for start, _ in view)

    def describe(self) -> dict[str, Any]:
        return {"model": "arinc653-windows", "frame_ns": self.frame,
                "windows_ns": [list(window) for window in self.windows]}


@dataclass(frozen=True)
class DelayedSupply(Supply):
    inner: Supply
    wait: int

    def sbf(self, t: int) -> int:
        return self.inner.sbf(t - self.wait)

    def time_for(self, work: int) -> int:
        return 0 if work <= 0 else self.wait + self.inner.time_for(work)

    @property
    def rate(self) -> Fraction:
        return self.inner.rate

    @property
    def delay(self) -> Fraction:
        return self.inner.delay + self.wait

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "initial_wait_ns": self.wait}


@dataclass(frozen=True)
class OverrunSupply(Supply):
    """A budget enforced only at a periodic tick (SCHED_DEADLINE without HRTICK_DL): the server may run up to
    ``overrun`` past its budget and pays that back in later periods, so a window can start just after an overrun
    and owe it: sbf(t) >= inner.sbf(t) - overrun."""

    inner: Supply
    overrun: int

    def sbf(self, t: int) -> int:
        return max(0, self.inner.sbf(t) - self.overrun)

    def time_for(self, work: int) -> int:
        return 0 if work <= 0 else self.inner.time_for(work + self.overrun)

    @property
    def rate(self) -> Fraction:
        return self.inner.rate

    @property
    def delay(self) -> Fraction:
        return self.inner.delay + Fraction(self.overrun) / self.inner.rate if self.inner.rate > 0 else Fraction(10**18)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "overrun_ns": self.overrun}


@dataclass(frozen=True)
class LeftoverSupply(Supply):
    """A processor (or ``inner`` supply) shared with higher-priority work described as tasks."""

    higher: tuple[Task, ...]
    inner: Supply = Dedicated()
    horizon: int = 10**15

    def _rbf(self, t: int) -> int:
        return sum(ceil_div(t + task.jitter, task.period) * task.wcet for task in self.higher)

    def sbf(self, t: int) -> int:
        if t <= 0:
            return 0
        # s − rbf(s) grows between the steps of rbf, so its maximum over [0, t] sits at t or just before a step.
        candidates = {t}
        for task in self.higher:
            first = task.period - task.jitter
            if first <= 0:
                first += ceil_div(-first + 1, task.period) * task.period
            candidates.update(range(first, t, task.period))
        return max(0, max(self.inner.sbf(s) - self._rbf(s) for s in candidates))

    def time_for(self, work: int) -> int:
        if work <= 0:
            return 0
        window = self.inner.time_for(work)
        while True:
            following = self.inner.time_for(work + self._rbf(window))
            if following == window:
                return window
            if following > self.horizon:
                raise OverflowError("higher-priority load leaves no supply")
            window = following

    @property
    def rate(self) -> Fraction:
        return self.inner.rate - sum((Fraction(task.wcet, task.period) for task in self.higher), Fraction(0))

    @property
    def delay(self) -> Fraction:
        if self.rate <= 0:
            return Fraction(10**18)
        # rbf(s) ≤ U·s + Σ C(1 + J/T): sbf(t) ≥ α(t − Δ) with this Δ.
        burst = sum((task.wcet * (1 + Fraction(task.jitter, task.period)) for task in self.higher), Fraction(0))
        return (burst + self.inner.rate * self.inner.delay) / self.rate

    def describe(self) -> dict[str, Any]:
        return {"model": "leftover", "inner": self.inner.describe(),
                "higher": [{"name": t.name, "wcet_ns": t.wcet, "period_ns": t.period, "jitter_ns": t.jitter}
                           for t in self.higher]}
