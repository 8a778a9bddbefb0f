"""The measured kernel's enforcement tick, as a model needs it: its length, and where it falls in a period.

Linux checks a SCHED_DEADLINE runtime at the scheduler tick unless HRTICK_DL is on (it is off by default): a
reservation overruns up to the next tick and pays the overrun back in later periods. How long its holes are
then depends on where the ticks fall inside its periods, which nothing in a scenario sets (it is wherever the
reservation happened to start). A gap probe in the reservation shows it: every hole starts at a tick (the
throttle) and ends at a period boundary (the replenishment timer), so the tick's phase inside the period is
read from the measured holes (:func:`tick_phase`).
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EnforcementTick", "enforcement_tick", "tick_phase"]

MIN_HOLES = 5  # fewer throttle holes than this say nothing reliable about the phase


@dataclass(frozen=True)
class EnforcementTick:
    """A tick of ``tick_ns`` enforcing budgets, and (when measured) its phase after a period's start."""

    tick_ns: int
    hz: int
    phase_ns: int | None = None
    phase_from: str = ""  # where the phase came from (the measured run), for the report

    def describe(self) -> str:
        where = (f"ticks {self.phase_ns / 1e6:.3f} ms after each period's start ({self.phase_from})"
                 if self.phase_ns is not None else
                 "tick phase not measured (no throttle holes in the measurement): the model's first tick is at 0")
        return (f"runtime enforced at the {self.tick_ns / 1e6:g} ms scheduler tick (HZ {self.hz}, HRTICK_DL off): "
                f"an overrun up to the next tick, paid back in later periods; {where}")


def enforcement_tick(audit: dict[str, Any] | None) -> EnforcementTick | None:
    """The tick that enforces SCHED_DEADLINE runtimes on the audited kernel, None where budgets are exact
    (HRTICK_DL on) or its HZ is unknown."""
    tick = (audit or {}).get("scheduler_tick") or {}
    hz = tick.get("hz")
    if not isinstance(hz, int) or hz <= 0 or tick.get("hrtick_dl") is not False:
        return None
    return EnforcementTick(tick_ns=round(1e9 / hz), hz=hz)


def _circular_mean(values: Sequence[int], modulus: int) -> tuple[float, float]:
    """Mean position of ``values`` on a circle of ``modulus`` and its concentration (1: all at one point)."""
    vector = sum(cmath.exp(2j * math.pi * (v % modulus) / modulus) for v in values) / len(values)
    return (cmath.phase(vector) % (2 * math.pi)) * modulus / (2 * math.pi), abs(vector)


def tick_phase(starts_ns: Sequence[int], lengths_ns: Sequence[int], tick_ns: int, period_ns: int,
               min_hole_ns: int, min_concentration: float = 0.9) -> int | None:
    """Where the ticks fall after a period's start, from a reservation's measured holes: the holes at least
    ``min_hole_ns`` long start at a tick and end where a period starts. None when there are too few such
    holes or they do not line up (the reservation was not throttled at a tick)."""
    holes = [(start, length) for start, length in zip(starts_ns, lengths_ns, strict=True) if length >= min_hole_ns]
    if len(holes) < MIN_HOLES:
        return None
    ticks, tick_concentration = _circular_mean([start for start, _ in holes], tick_ns)
    periods, period_concentration = _circular_mean([start + length for start, length in holes], period_ns)
    if min(tick_concentration, period_concentration) < min_concentration:
        return None
    return round(ticks - periods) % tick_ns
