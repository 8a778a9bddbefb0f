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

__all__ = ["EnforcementTick", "MeasuredPhase", "enforcement_tick", "tick_phase"]

MIN_HOLES = 5  # fewer throttle holes than this say nothing reliable about the phase
LATTICE_BINS = 40  # the period in bins of this many parts when looking for the period starts most holes end on
LATTICE_KEPT = 0.9  # below this share of holes on one lattice, the reservation's periods restarted


@dataclass(frozen=True)
class MeasuredPhase:
    """Where a reservation's ticks fell in its periods, read from its holes (:func:`tick_phase`)."""

    phase_ns: int  # the first tick after a period's start
    resume_jitter_ns: int  # spread of the resumptions after a replenishment (the wake-up latency's)
    lattice_share: float  # share of the holes that ended on the period starts used (1: the periods never restarted)


@dataclass(frozen=True)
class EnforcementTick:
    """A tick of ``tick_ns`` enforcing budgets and, when measured, where it falls in the reservation's periods."""

    tick_ns: int
    hz: int
    measured: MeasuredPhase | None = None
    phase_from: str = ""  # where the phase came from (the measured run), for the report

    def describe(self) -> str:
        phase = self.measured
        if phase is None:
            where = "tick phase not measured (no throttle holes in the measurement): the model's first tick is at 0"
        else:
            where = (f"ticks {phase.phase_ns / 1e6:.3f} ms after each period's start, resuming within "
                     f"{phase.resume_jitter_ns / 1e3:.0f} us of it ({self.phase_from})")
            if phase.lattice_share < LATTICE_KEPT:
                where += (f"; the reservation's periods restarted during the measurement (it fell behind), the "
                          f"model follows the periods {phase.lattice_share:.0%} of its holes ended on")
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


def _circular_mean(values: Sequence[float], modulus: int) -> tuple[float, float]:
    """Mean position of ``values`` on a circle of ``modulus`` and its concentration (1: all at one point)."""
    vector = sum(cmath.exp(2j * math.pi * (v % modulus) / modulus) for v in values) / len(values)
    return (cmath.phase(vector) % (2 * math.pi)) * modulus / (2 * math.pi), abs(vector)


def _offset(value: float, centre: float, modulus: int) -> float:
    """``value``'s signed distance from ``centre`` on the circle of ``modulus``."""
    return (value - centre + modulus / 2) % modulus - modulus / 2


def _main_lattice(ends: list[int], period_ns: int) -> list[int]:
    """The hole ends on the period starts most of them share: a reservation that fell behind (an outer
    hypervisor's stall) restarts its periods elsewhere, and a late resumption ends a hole off its lattice."""
    bins = [0] * LATTICE_BINS
    for end in ends:
        bins[end % period_ns * LATTICE_BINS // period_ns] += 1
    peak = max(range(LATTICE_BINS), key=lambda b: bins[b] + bins[b - 1] + bins[(b + 1) % LATTICE_BINS])
    centre = (peak + 0.5) * period_ns / LATTICE_BINS
    return [end for end in ends if abs(_offset(end, centre, period_ns)) <= 1.5 * period_ns / LATTICE_BINS]


def tick_phase(starts_ns: Sequence[int], lengths_ns: Sequence[int], tick_ns: int, period_ns: int,
               min_hole_ns: int, min_concentration: float = 0.9) -> MeasuredPhase | None:
    """Where the ticks fall after a period's start, from a reservation's measured holes: the holes at least
    ``min_hole_ns`` long start at a tick and end when the reservation runs again after its replenishment at a
    period's start, a wake-up latency later (which varies). The period's start is taken at the earliest usual
    resumption (5th percentile), the spread up to the latest usual one (95th). None when there are too few such
    holes or their starts do not line up with a tick (the reservation was not throttled at one)."""
    holes = [(start, length) for start, length in zip(starts_ns, lengths_ns, strict=True) if length >= min_hole_ns]
    if len(holes) < MIN_HOLES:
        return None
    ticks, tick_concentration = _circular_mean([start for start, _ in holes], tick_ns)
    ends = _main_lattice([start + length for start, length in holes], period_ns)
    if tick_concentration < min_concentration or len(ends) < MIN_HOLES:
        return None
    resumes, _ = _circular_mean(ends, period_ns)
    spread = sorted(_offset(end, resumes, period_ns) for end in ends)
    early, late = spread[len(spread) * 5 // 100], spread[len(spread) * 95 // 100]
    return MeasuredPhase(round(ticks - (resumes + early)) % tick_ns, round(late - early), len(ends) / len(holes))
