"""Sporadic task parameters the analyses share, in integer nanoseconds (exact arithmetic throughout)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Task", "utilization", "hyperperiod", "ceil_div"]


def ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


@dataclass(frozen=True)
class Task:
    """A sporadic task: every job needs at most ``wcet`` within ``deadline`` of its nominal arrival.

    ``period`` is the minimum inter-arrival time, ``jitter`` the release jitter (a job becomes ready up to
    ``jitter`` after its nominal arrival), ``blocking`` the longest time it can wait for lower-priority work
    (non-preemptive sections, shared resources), ``priority`` a fixed priority (larger = more urgent).
    """

    name: str
    wcet: int
    period: int
    deadline: int
    jitter: int = 0
    blocking: int = 0
    priority: int = 0
    bcet: int | None = None

    def __post_init__(self) -> None:
        if self.wcet <= 0 or self.period <= 0 or self.deadline <= 0:
            raise ValueError(f"task {self.name}: wcet, period and deadline must be positive")
        if self.jitter < 0 or self.blocking < 0:
            raise ValueError(f"task {self.name}: jitter and blocking cannot be negative")

    @property
    def utilization(self) -> float:
        return self.wcet / self.period

    @property
    def best_case(self) -> int:
        return self.wcet if self.bcet is None else self.bcet


def utilization(tasks: Sequence[Task]) -> float:
    return sum(task.wcet / task.period for task in tasks)


def hyperperiod(tasks: Sequence[Task]) -> int:
    return math.lcm(*(task.period for task in tasks)) if tasks else 0
