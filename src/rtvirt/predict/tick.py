"""The measured kernel's enforcement tick, as a model needs it: its length, and where it falls in a period.

Linux checks a SCHED_DEADLINE runtime at the scheduler tick unless HRTICK_DL is on (it is off by default): a
reservation overruns up to the next tick and pays the overrun back in later periods. How long its holes are
then depends on where the ticks fall inside its periods, which nothing in a scenario sets (it is wherever the
reservation happened to start). A gap probe in the reservation shows it: every hole starts at a tick (the
throttle) and ends at a period boundary (the replenishment timer), so the tick's phase inside the period is
read from the measured holes (:func:`tick_phase`).

Two things the probe does not see decide which tick catches a runtime, and near some phases a few tens of
microseconds flip it (another tick, another number of periods paid back, another rate of holes):

- the wake-up latency after the replenishment: mostly a few microseconds, now and then a hundred; the model
  draws it from the measured distribution, not from an even spread, which would resume it later on average;
- the runtime charged unseen: the kernel charges a reservation from the moment it picks its task, before the
  probe runs again, and up to the tick's handling, after the probe's last timestamp (20-30 us a resumption on
  this VM). The charge is read from the runtime balance: each replenishment adds one runtime per period that
  the deadline moved, which is the distance between successive hole ends; what the probe was seen running
  falls short of that by the unseen charge (:func:`_unseen_charge`).
"""

from __future__ import annotations

import cmath
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EnforcementTick", "MeasuredPhase", "enforcement_tick", "tick_phase"]

MIN_HOLES = 5  # fewer throttle holes than this say nothing reliable about the phase
LATTICE_BINS = 40  # the period in bins of this many parts when looking for the period starts most holes end on
LATTICE_KEPT = 0.9  # below this share of holes on one lattice, the reservation's periods restarted
LATENCY_QUANTILES = 40  # the measured resume latencies the model draws from
PATTERN = 4  # intervals compared when choosing where a runtime balance ends in the state it started in


@dataclass(frozen=True)
class MeasuredPhase:
    """Where a reservation's ticks fell in its periods, read from its holes (:func:`tick_phase`)."""

    phase_ns: int  # the first tick after a period's start
    resume_jitter_ns: int  # spread of the resumptions after a replenishment (the wake-up latency's)
    lattice_share: float  # share of the holes that ended on the period starts used (1: the periods never restarted)
    resume_latencies_ns: tuple[int, ...] = ()  # quantiles of the resumptions after the period's start
    unseen_charge_ns: int = 0  # runtime charged per resumption beyond what the probe saw running


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
                     f"{phase.resume_jitter_ns / 1e3:.0f} us of it, {phase.unseen_charge_ns / 1e3:.0f} us of "
                     f"runtime charged a resumption beyond what the probe saw ({self.phase_from})")
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


def _repeated_state(runs: list[tuple[int, int]], tick_ns: int) -> tuple[int, int]:
    """The longest stretch of ``runs`` (time seen running, periods moved) whose first and last intervals are
    followed by the same pattern of intervals (the reservation in about the same state at both ends); all of
    them when no such stretch covers half."""
    pattern = [(round(service * 8 / tick_ns), moved) for service, moved in runs]
    first_seen: dict[tuple[tuple[int, int], ...], int] = {}
    best = (0, 0)
    for k in range(len(runs) - PATTERN + 1):
        start = first_seen.setdefault(tuple(pattern[k:k + PATTERN]), k)
        best = max(best, (start, k), key=lambda span: span[1] - span[0])
    return best if 2 * (best[1] - best[0]) >= len(runs) else (0, len(runs))


def _unseen_charge(starts_ns: Sequence[int], lengths_ns: Sequence[int], ticks: float, tick_ns: int,
                   period_ns: int, runtime_ns: int) -> int:
    """The runtime the kernel charged a reservation per resumption beyond the time its probe ran between
    holes, from the runtime balance. Between two throttles the replenishment added one runtime per period its
    deadline moved, and the deadline is where the next hole ends: over a stretch of holes, the runtime added
    minus what was seen running is the unseen charge, plus the difference of the runtimes left at the stretch's
    two throttles (each within a tick of 0). The stretch ends where the next holes repeat its first ones (the
    same state again), so that difference is small. 0 where every throttle hole cannot be told from other gaps
    (a runtime of more than a period minus a tick) or too few were seen."""
    shortest = period_ns - runtime_ns - tick_ns  # a runtime of at most one budget overruns less than a tick
    if shortest <= 0:
        return 0
    # throttles, and stalls: a gap of an eighth of a tick or more off the ticks is no interrupt handler but the
    # outer hypervisor's (steal time, which the kernel does not charge), so the interval it falls in is left out
    throttles: list[tuple[int, int, bool]] = []  # (start, end, a stall since the previous throttle)
    stalled = False
    for start, length in zip(starts_ns, lengths_ns, strict=True):
        on_tick = abs(_offset(start, ticks, tick_ns)) <= tick_ns / 40
        if length >= shortest // 2 and on_tick:
            throttles.append((start, start + length, stalled))
            stalled = False
        elif length >= tick_ns // 8:
            stalled = True
    # intervals between throttles: (time seen running, periods the deadline moved); None where periods restarted
    intervals: list[tuple[int, int] | None] = []
    for (_, end, _), (next_start, next_end, stall) in itertools.pairwise(throttles):
        periods = (next_end - end) / period_ns
        moved = round(periods)
        kept = not stall and moved >= 1 and abs(periods - moved) * period_ns <= tick_ns / 4
        intervals.append((next_start - end, moved) if kept else None)
    added = seen = counted = 0
    for kept, stretch in itertools.groupby(intervals, key=lambda interval: interval is not None):
        runs = [interval for interval in stretch if interval is not None]
        if not kept or len(runs) <= PATTERN:
            continue
        first, end = _repeated_state(runs, tick_ns)
        added += sum(moved for _, moved in runs[first:end]) * runtime_ns
        seen += sum(service for service, _ in runs[first:end])
        counted += end - first
    return round((added - seen) / counted) if counted >= MIN_HOLES * 4 else 0


def tick_phase(starts_ns: Sequence[int], lengths_ns: Sequence[int], tick_ns: int, period_ns: int,
               min_hole_ns: int, min_concentration: float = 0.9, runtime_ns: int = 0) -> MeasuredPhase | None:
    """Where the ticks fall after a period's start, from a reservation's measured holes: the holes at least
    ``min_hole_ns`` long start at a tick and end when the reservation runs again after its replenishment at a
    period's start, a wake-up latency later (which varies). The period's start is taken at the earliest usual
    resumption (5th percentile), the spread up to the latest usual one (95th), and the latencies after it kept
    as quantiles. With the reservation's ``runtime_ns``, the runtime charged unseen per resumption
    (:func:`_unseen_charge`). None when there are too few such holes or their starts do not line up with a tick
    (the reservation was not throttled at one)."""
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
    latencies = tuple(max(0, round(spread[(2 * q + 1) * len(spread) // (2 * LATENCY_QUANTILES)] - early))
                      for q in range(LATENCY_QUANTILES))
    charge = _unseen_charge(starts_ns, lengths_ns, ticks, tick_ns, period_ns, runtime_ns) if runtime_ns else 0
    return MeasuredPhase(round(ticks - (resumes + early)) % tick_ns, round(late - early), len(ends) / len(holes),
                         latencies, charge)
