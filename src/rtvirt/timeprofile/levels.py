"""Level changes over a run: a start-up ramp, and what happens around timeline events (stressor on/off).

Both work on the per-window levels (p1..p99-clipped means) of :func:`rtvirt.timeprofile.windows.profile_pass`.
A *ramp* is the leading stretch of windows whose level differs from the steady state (median of the
second half's window levels) by more than ``threshold_pct`` and by more than 4 robust sigmas of the
steady windows' levels. *Transitions* split the run at its timeline events and give each segment's exact
median, mean and maximum, and for each event the window near it (± ``around`` windows) that strays
farthest outside the band between the levels before and after: the dip (or spike) at the switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..summary import Summary
from .windows import TimeProfile

__all__ = ["Ramp", "Segment", "Switch", "detect_ramp", "transitions", "event_offsets", "segments_of"]


@dataclass(frozen=True)
class Ramp:
    end_ns: int
    first_level: float
    steady_level: float
    first_deviation_pct: float


@dataclass(frozen=True)
class Segment:
    start_ns: int
    end_ns: int
    after_event: str
    count: int
    median_ns: float
    mean_ns: float
    max_ns: float


@dataclass(frozen=True)
class Switch:
    t_ns: int
    event: str
    level_before: float  # median of the segment before the event
    level_after: float  # median of the segment after it
    extreme_level: float  # the nearby window level farthest outside [before, after]
    extreme_at_ns: int
    overshoot_pct: float  # how far beyond the band, relative to level_before (negative: a dip)


def _deviation(level: float, reference: float) -> float:
    return (level - reference) / reference * 100 if reference else float("nan")


def detect_ramp(profile: TimeProfile, threshold_pct: float = 5.0, min_windows: int = 8) -> Ramp | None:
    means = np.array([w.level_ns for w in profile.windows])
    if means.size < min_windows:
        return None
    second_half = means[means.size // 2:]
    steady = float(np.median(second_half))
    if not steady:
        return None
    # A noisy run's windows wander by themselves: a ramp must also stand 4 robust sigmas out of that noise.
    noise_pct = 1.4826 * float(np.median(np.abs(second_half - steady))) / abs(steady) * 100
    off = np.abs((means - steady) / steady * 100) > max(threshold_pct, 4 * noise_pct)
    if not off[0]:
        return None
    length = int(np.argmin(off)) if not off.all() else means.size
    if length > means.size // 2:
        return None  # no steady state to ramp into
    end = profile.windows[length].start_ns
    return Ramp(end, float(means[0]), steady, _deviation(float(means[0]), steady))


def event_offsets(first_ns: int, timeline: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Timeline events as offsets from the first sample (at ``first_ns``); ``t_ns`` before the first sample
    are taken as already relative to the run's start."""
    events = []
    for item in timeline:
        t = int(item["t_ns"])
        events.append((t - first_ns if t >= first_ns else t, str(item["event"])))
    return sorted(events)


def segments_of(events: list[tuple[int, str]], duration_ns: int, between: list[Summary]) -> list[Segment]:
    """Segments from the exact statistics of the samples between consecutive events
    (:func:`rtvirt.timeprofile.windows.profile_pass` with the events' times as cuts)."""
    bounds = [(0, "start"), *events, (duration_ns, "end")]
    return [Segment(begin, end, label, summary.samples, summary.median_ns, summary.mean_ns, summary.max_ns)
            for summary, (begin, label), (end, _) in zip(between, bounds[:-1], bounds[1:], strict=True)
            if summary.samples]


def transitions(profile: TimeProfile, events: list[tuple[int, str]], segments: list[Segment],
                around: int = 2) -> list[Switch]:
    starts = np.array([w.start_ns for w in profile.windows], np.int64)
    levels = np.array([w.level_ns for w in profile.windows])
    switches: list[Switch] = []
    for t, label in events:
        before = next((s for s in segments if s.end_ns == t), None)
        after = next((s for s in segments if s.start_ns == t), None)
        position = int(np.searchsorted(starts, t))
        near = slice(max(0, position - around), min(starts.size, position + around + 1))
        if before is None or after is None or near.start >= near.stop:
            continue
        low, high = sorted((before.median_ns, after.median_ns))
        # How far each nearby window strays outside the band between the two steady levels.
        nearby = levels[near]
        outside = np.where(nearby < low, nearby - low, np.where(nearby > high, nearby - high, 0))
        pick = near.start + int(np.argmax(np.abs(outside)))
        overshoot = float(outside[pick - near.start])
        switches.append(Switch(t, label, before.median_ns, after.median_ns, float(levels[pick]), int(starts[pick]),
                               overshoot / before.median_ns * 100 if before.median_ns else float("nan")))
    return switches
