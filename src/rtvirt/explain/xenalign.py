"""The Xen layer's clock alignment: xentrace's TSC mapped onto the domU's sample clock from the run itself.

A wait Xen imposed on the measuring vCPU lies inside the sample window it caused, sharing one of its edges (or
both, where the windows are the guest's own stolen spans); candidate offsets come from the largest windows and
the rarest lengths, each is refitted through the edges it shares, and offsets whole periods of a periodic schedule
apart are told apart by the windows they disagree on (a sign test), not by how many each matched (docs/explain.md,
the Xen layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EDGE_NS", "Alignment", "align"]

MATCH_CANDIDATES = 12  # the largest windows proposing an alignment, and as many of the rarest lengths
LENGTH_ALIKE_NS = 50_000  # windows this close in length are alike (a periodic schedule's waits)
MATCH_BINS = 20  # the most proposed offsets (EDGE_NS wide) tried
EDGE_NS = 300_000  # a wait and its window share an edge within this (nested TCG: the guest sees time late)
RIVAL_SHARE = 0.9  # another offset matching this share of the best one's windows contends with it
SIGN_TEST_Z = 3.0  # windows only the best offset explains must outnumber a contender's own by this many sigma


@dataclass(frozen=True, slots=True)
class Alignment:
    """sample_ns = slope * tsc + offset, within uncertainty_ns (the largest residual of the matched pairs);
    ``rival``: another offset (ns from this one) that a periodic schedule makes as good: the windows holding a
    wait under this alignment alone, and under the rival alone (None: every other offset is clearly worse);
    ``alike``: every such rival explains no window this one does not, and puts waits alike to this one's (lengths
    within what the matching tells apart, _alike) in the windows both explain: it is no better anywhere, so this
    one stands, and only where in the trace a window lies is unsure (whole periods of a periodic schedule)."""

    slope: float
    offset: float
    uncertainty_ns: int
    matched: int
    rival: tuple[float, int, int] | None = None
    alike: bool = False

    def to_ns(self, tsc: int) -> int:
        return int(round(self.slope * tsc + self.offset))


@dataclass(frozen=True, slots=True)
class _Fit:
    slope: float
    offset: float
    residuals: np.ndarray  # per window: how far its closest wait's shared edge lies from it (inf: holds none)
    waits: np.ndarray  # per window: that closest wait (-1: none)
    tolerance: float  # the residuals that count as a match: within 5 median residuals (+5 us)

    def matched(self, tolerance: float | None = None) -> np.ndarray:
        return self.residuals <= (self.tolerance if tolerance is None else tolerance)


def align(ready: np.ndarray, resumes: np.ndarray, windows: np.ndarray, ns_per_tick: float,
          whole: bool = False) -> Alignment | None:
    """Map TSC to the sample clock so that the vCPU's waits to run (``ready`` to ``resumes``, TSC) fall inside
    the outlier windows: a wait Xen imposed lies within the window it caused, sharing its start (a preemption)
    or its end (the resumption); the window may be longer (time the guest lost elsewhere). ``whole``: the windows
    are the waits themselves (the guest's stolen spans), so both edges are held to match. None when fewer than
    three windows hold a wait under any mapping."""
    if len(windows) == 0 or len(resumes) == 0:
        return None
    starts = windows["start_ns"].astype(np.int64)
    order = np.argsort(starts)
    starts, ends = starts[order], windows["end_ns"].astype(np.int64)[order]
    lengths = ends - starts
    first, last = ready.astype(np.float64), resumes.astype(np.float64)
    waits = (last - first) * ns_per_tick
    # the largest windows, and the rarest lengths: in a periodic schedule only the waits that differ point at
    # one offset (the others, alike, point at every period's)
    ordered = np.sort(lengths)
    rarity = (np.searchsorted(ordered, lengths + LENGTH_ALIKE_NS, side="right")
              - np.searchsorted(ordered, lengths - LENGTH_ALIKE_NS, side="left"))
    votes: list[np.ndarray] = []
    for index in np.union1d(np.argsort(-lengths)[:MATCH_CANDIDATES],
                            np.lexsort((-lengths, rarity))[:MATCH_CANDIDATES]):
        fits = (waits >= 0.3 * lengths[index]) & (waits <= lengths[index] + EDGE_NS)
        votes += [starts[index] - first[fits] * ns_per_tick, ends[index] - last[fits] * ns_per_tick]
    offsets = np.concatenate(votes)
    if offsets.size == 0:
        return None
    bins = np.floor(offsets / EDGE_NS)
    values, counts = np.unique(bins, return_counts=True)
    fitted = [_fit(starts, ends, first, last, ns_per_tick, float(np.median(offsets[bins == bin_value])), whole)
              for bin_value in values[np.argsort(-counts)[:MATCH_BINS]]]
    traced = (float(first.min()), float(last.max()))
    matches = [int(fit.matched().sum()) for fit in fitted]
    # offsets well apart that matched nearly as many windows contend; the windows two disagree on decide between
    # them, not how many each matched (a periodic schedule's alike waits, the run's edges)
    contenders = [fit for fit, count in zip(fitted, matches, strict=True) if count >= RIVAL_SHARE * max(matches)]
    best = fitted[matches.index(max(matches))]
    for fit in contenders:
        if _apart(best, fit, traced) and _sign_test(fit, best, starts, ends, traced)[2]:
            best = fit
    matched = best.matched()
    if matched.sum() < 3:
        return None
    rivals = [(fit, distance, *_sign_test(best, fit, starts, ends, traced)) for fit in contenders
              if (distance := _apart(best, fit, traced))]
    undecided = [(fit, distance, ours, theirs) for fit, distance, ours, theirs, decided in rivals if not decided]
    closest = min(undecided, key=lambda r: r[2] - r[3], default=None)
    wait_ns = (last - first) * ns_per_tick
    return Alignment(best.slope, best.offset, int(np.ceil(best.residuals[matched].max())), int(matched.sum()),
                     closest[1:] if closest else None,
                     bool(undecided) and all(theirs == 0 and _alike(best, fit, wait_ns)
                                             for fit, _, _, theirs in undecided))


def _fit(starts: np.ndarray, ends: np.ndarray, first: np.ndarray, last: np.ndarray, slope: float,
         offset: float, whole: bool) -> _Fit:
    """The line through the shared edges of the waits a proposed ``offset`` puts inside windows (the closest
    ones), matched again with it, three times; ``whole``: a wait's residual is its farther edge's."""

    def shared_edges() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(window, wait, TSC of the shared edge, its sample-clock time, residual) of each wait inside a window."""
        windows_at, waits_at = _contained(starts, ends, first * slope + offset, last * slope + offset)
        from_start = starts[windows_at] - (first[waits_at] * slope + offset)
        from_end = ends[windows_at] - (last[waits_at] * slope + offset)
        by_start = np.abs(from_start) <= np.abs(from_end)
        return (windows_at, waits_at, np.where(by_start, first[waits_at], last[waits_at]),
                np.where(by_start, starts[windows_at], ends[windows_at]).astype(np.float64),
                (np.maximum if whole else np.minimum)(np.abs(from_start), np.abs(from_end)))

    for _ in range(3):
        _, _, ticks, edges, residuals = shared_edges()
        close = residuals <= 5 * np.median(residuals) + 5_000 if len(residuals) else residuals > 0
        if close.sum() >= 4 and np.ptp(ticks[close]) > 0:
            slope, offset = (float(v) for v in np.polyfit(ticks[close], edges[close], 1))
    windows_at, waits_at, _, _, residuals = shared_edges()
    order = np.lexsort((residuals, windows_at))  # per window, its closest wait first
    chosen = order[np.unique(windows_at[order], return_index=True)[1]]
    closest, waits = np.full(len(starts), np.inf), np.full(len(starts), -1)
    closest[windows_at[chosen]], waits[windows_at[chosen]] = residuals[chosen], waits_at[chosen]
    return _Fit(slope, offset, closest, waits, 5 * float(np.median(residuals)) + 5_000 if len(residuals) else 0.0)


def _apart(best: _Fit, fit: _Fit, traced: tuple[float, float]) -> float:
    """How far ``fit`` places the traced span's middle from where ``best`` does (ns), when that is well apart
    (more than twice EDGE_NS and four times the best's largest residual); else 0."""
    middle = sum(traced) / 2
    distance = (fit.slope - best.slope) * middle + fit.offset - best.offset
    matched = best.matched()
    apart = max(2 * EDGE_NS, 4 * float(best.residuals[matched].max()) if matched.any() else 0.0)
    return distance if abs(distance) > apart else 0.0


def _alike(best: _Fit, fit: _Fit, wait_ns: np.ndarray) -> bool:
    """Whether ``fit`` puts, in every window both explain (if any), a wait whose length is the best's within
    EDGE_NS or the two fits' tolerances (what the matching itself cannot tell apart)."""
    both = best.matched() & fit.matched()
    alike_ns = max(EDGE_NS, best.tolerance + fit.tolerance)  # each wait within its fit's tolerance of the window
    return bool(np.all(np.abs(wait_ns[best.waits[both]] - wait_ns[fit.waits[both]]) <= alike_ns))


def _sign_test(ours: _Fit, theirs: _Fit, starts: np.ndarray, ends: np.ndarray,
               traced: tuple[float, float]) -> tuple[int, int, bool]:
    """(windows holding a wait under ``ours`` alone, under ``theirs`` alone, whether ours wins by SIGN_TEST_Z
    sigma): matched as closely as the tighter of the two asks, over the windows both place within the
    ``traced`` TSC span (the first wait's start to the last one's end: beyond it neither could hold one)."""

    def within(fit: _Fit) -> np.ndarray:
        return ((starts - fit.offset) / fit.slope >= traced[0]) & ((ends - fit.offset) / fit.slope <= traced[1])

    tolerance, both = min(ours.tolerance, theirs.tolerance), within(ours) & within(theirs)
    mine, other = ours.matched(tolerance) & both, theirs.matched(tolerance) & both
    alone, rival_alone = int((mine & ~other).sum()), int((other & ~mine).sum())
    wins = alone + rival_alone > 0 and alone - rival_alone >= SIGN_TEST_Z * np.sqrt(alone + rival_alone)
    return alone, rival_alone, bool(wins)


def _contained(starts: np.ndarray, ends: np.ndarray, first: np.ndarray,
               last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(window index, wait index) of waits that lie within a window and share one of its edges (EDGE_NS)."""
    at = np.searchsorted(starts, first + EDGE_NS, side="right") - 1
    valid = at >= 0
    window = np.where(valid, at, 0)
    inside = valid & (first >= starts[window] - EDGE_NS) & (last <= ends[window] + EDGE_NS)
    edge = (np.abs(first - starts[window]) <= EDGE_NS) | (np.abs(last - ends[window]) <= EDGE_NS)
    waits = np.flatnonzero(inside & edge)
    return window[waits], waits
