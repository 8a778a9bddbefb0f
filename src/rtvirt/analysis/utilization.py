"""Utilisation-based schedulability tests for implicit-deadline periodic tasks on one processor.

- Liu & Layland (1973), "Scheduling algorithms for multiprogramming in a hard-real-time environment",
  JACM 20(1): rate-monotonic scheduling is feasible if U <= n(2^(1/n) - 1); EDF is feasible iff U <= 1.
- Bini, Buttazzo & Buttazzo (2003), "Rate monotonic analysis: the hyperbolic bound", IEEE TC 52(7):
  rate-monotonic scheduling is feasible if prod(U_i + 1) <= 2 (dominates Liu & Layland).

Both RM tests are sufficient only; the response-time analysis in ``fp`` is exact for constrained deadlines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .taskset import Task, utilization

__all__ = ["liu_layland_bound", "UtilizationVerdict", "utilization_tests"]


def liu_layland_bound(n: int) -> float:
    """n(2^(1/n) - 1): 1.0 for one task, falling towards ln 2 ~ 0.693."""
    return n * (2 ** (1 / n) - 1) if n > 0 else 1.0


@dataclass(frozen=True)
class UtilizationVerdict:
    utilization: float
    liu_layland_bound: float
    rm_liu_layland: bool
    rm_hyperbolic: bool
    edf_implicit: bool
    implicit_deadlines: bool

    def as_dict(self) -> dict[str, float | bool]:
        return self.__dict__.copy()


def utilization_tests(tasks: Sequence[Task], capacity: float = 1.0) -> UtilizationVerdict:
    """The three classic tests; ``capacity`` scales them to a processor share (e.g. a server's Q/P).

    The scaled forms are only meaningful for a share delivered without delay (fluid); for servers the
    supply-bound analyses in ``fp`` and ``edf`` are the ones to trust.
    """
    total = utilization(tasks)
    bound = liu_layland_bound(len(tasks))
    implicit = all(task.deadline == task.period and task.jitter == 0 for task in tasks)
    hyperbolic = math.prod(task.utilization / capacity + 1 for task in tasks) <= 2 + 1e-12
    return UtilizationVerdict(
        utilization=total,
        liu_layland_bound=bound,
        rm_liu_layland=implicit and total <= bound * capacity + 1e-12,
        rm_hyperbolic=implicit and hyperbolic,
        edf_implicit=implicit and total <= capacity + 1e-12,
        implicit_deadlines=implicit,
    )
