"""Statistics over time: per-window maxima (long-term monitoring) and cumulative marks (stability), the
largest samples, a thinned series for plots and exact statistics between timeline events: all from one
pass over a run's samples.

Each window also has a *level*: its mean with values clipped to the run's 1st and 99th percentiles, so
that a rare outlier shows in the window's maximum but does not look like a change of level, while a
shift lasting more than 1 % of the run keeps its full size (Tukey's whiskers would clip a 50 % shift).

Times are the samples' ``t_ns`` relative to the run's first sample. The pass takes the samples in chunks,
so memory stays bounded whatever the run length: when a run is stored it runs over the table in memory
(rtvirt.digest keeps its outcome beside the samples), for older runs over samples.parquet
(results.windows). Pure: it knows no store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..stats import Histogram, HistogramBuilder, Summary, summarize_histogram

__all__ = ["Window", "TimeProfile", "RunPass", "profile_pass", "MARK_FRACTIONS", "TOP_KEPT", "SERIES_POINTS",
           "default_window"]

# The studies judge 8 h runs at 1, 2, 4 and 8 h: the same fractions of any run's length.
MARK_FRACTIONS = (1 / 8, 2 / 8, 4 / 8, 1.0)
DEFAULT_WINDOW_NS = 300 * 10**9
TOP_KEPT = 1000  # largest samples kept: `rtvirt report --top` goes up to this, the plots show them all
SERIES_POINTS = 20_000  # every k-th sample kept for the time-series plot


@dataclass(frozen=True)
class Window:
    start_ns: int
    count: int
    max_ns: int
    mean_ns: float
    level_ns: float  # mean with values clipped to the run's p1..p99: a level one outlier cannot move


@dataclass(frozen=True)
class TimeProfile:
    window_ns: int
    first_ns: int  # t_ns of the first sample (window and mark times count from it)
    duration_ns: int
    windows: list[Window]
    marks: list[tuple[int, Summary]]  # (end of the cumulative stretch in ns from the start, its summary)


@dataclass(frozen=True)
class RunPass:
    """What one pass over a run's samples gives."""

    profile: TimeProfile
    top_t: np.ndarray  # the TOP_KEPT largest samples, largest first: time from the first sample,
    top_values: np.ndarray  # value,
    top_cpu: np.ndarray  # CPU
    series_t: np.ndarray  # every k-th sample (time from the first sample) and its value, for plots
    series_values: np.ndarray
    between_cuts: list[Summary]  # exact statistics of the samples before, between and after the cuts


def default_window(duration_ns: int) -> int:
    """5 min windows (OSADL) for long runs; a shorter run gets a round window giving about 50 windows."""
    if duration_ns >= 50 * DEFAULT_WINDOW_NS:
        return DEFAULT_WINDOW_NS
    target = max(duration_ns / 50, 1)
    magnitude = 10 ** int(np.floor(np.log10(target)))
    return int(next(step * magnitude for step in (1, 2, 5, 10) if step * magnitude >= target))


def _by_part(builders: list[HistogramBuilder], part: np.ndarray, values: np.ndarray) -> None:
    """builders[i] counts the values whose part is i (parts beyond the builders are not counted)."""
    for index in np.unique(part):
        if index < len(builders):
            builders[int(index)].add(values[part == index])


def _by_bounds(builders: list[HistogramBuilder], ends: np.ndarray, values: np.ndarray) -> None:
    """builders[i] counts values[ends[i-1]:ends[i]] (samples in time order: parts are slices)."""
    begin = 0
    for builder, end in zip(builders, ends.tolist(), strict=False):
        if end > begin:
            builder.add(values[begin:end])
        begin = max(begin, end)


class _Pass:
    """The running state of :func:`profile_pass`."""

    def __init__(self, count: int, window_ns: int, fences: tuple[float, float], mark_ends: np.ndarray,
                 cuts: np.ndarray, stride: int) -> None:
        self.window_ns, self.fences, self.stride = window_ns, fences, stride
        self.maxima = np.full(count, np.iinfo(np.int64).min, np.int64)
        self.counts = np.zeros(count, np.int64)
        self.sums = np.zeros(count, np.float64)
        self.clipped_sums = np.zeros(count, np.float64)
        # The disjoint stretches up to 1/8, 1/8..2/8, 2/8..4/8 of the run, merged into the cumulative marks at
        # the end (the last mark is the whole run, whose histogram is known): half the samples are counted once.
        self.mark_ends = mark_ends[:-1]
        self.stretches = [HistogramBuilder() for _ in self.mark_ends]
        self.cuts = cuts
        self.between = [HistogramBuilder() for _ in range(cuts.size + 1)] if cuts.size else []
        self.kept_t: list[np.ndarray] = []
        self.kept_v: list[np.ndarray] = []
        self.top_t, self.top_v, self.top_cpu = (np.empty(0, np.int64) for _ in range(3))
        self.offset = 0

    def add(self, t: np.ndarray, values: np.ndarray, cpu: np.ndarray | None) -> None:
        """One chunk: t from the first sample (int64), values, CPUs."""
        if t.size > 1 and bool((t[1:] >= t[:-1]).all()):
            self._in_order(t, values)
        else:
            self._any_order(t, values)
        first_kept = (-self.offset) % self.stride
        self.kept_t.append(t[first_kept::self.stride].copy())  # copies: a strided view keeps the chunk alive
        self.kept_v.append(values[first_kept::self.stride].astype(np.int64))
        self.offset += t.size
        cpu = np.zeros(t.size, np.int64) if cpu is None else cpu
        if values.size > TOP_KEPT:
            keep = np.argpartition(values, -TOP_KEPT)[-TOP_KEPT:]
            t, values, cpu = t[keep], values[keep], cpu[keep]
        self.top_t, self.top_v, self.top_cpu = (
            np.concatenate([a, b.astype(np.int64)]) for a, b in ((self.top_t, t), (self.top_v, values),
                                                                 (self.top_cpu, cpu)))
        order = np.argsort(-self.top_v, kind="stable")[:TOP_KEPT]
        self.top_t, self.top_v, self.top_cpu = self.top_t[order], self.top_v[order], self.top_cpu[order]

    def _in_order(self, t: np.ndarray, values: np.ndarray) -> None:
        """Samples in time order (the usual case): every window, stretch and segment is a slice."""
        first_window, last_window = int(t[0]) // self.window_ns, int(t[-1]) // self.window_ns
        windows = np.arange(first_window, last_window + 1, dtype=np.int64)
        starts = np.searchsorted(t, windows * self.window_ns, side="left")
        ends = np.append(starts[1:], t.size)
        used = starts < ends
        windows, starts = windows[used], starts[used]
        self.counts[windows] += ends[used] - starts
        self.maxima[windows] = np.maximum(self.maxima[windows], np.maximum.reduceat(values, starts))
        self.sums[windows] += np.add.reduceat(values, starts, dtype=np.float64)
        self.clipped_sums[windows] += np.add.reduceat(np.clip(values, *self.fences), starts, dtype=np.float64)
        _by_bounds(self.stretches, np.searchsorted(t, self.mark_ends, side="right"), values)
        if self.between:
            # a sample at an event's time belongs to the segment after it
            _by_bounds(self.between, np.append(np.searchsorted(t, self.cuts, side="left"), t.size), values)

    def _any_order(self, t: np.ndarray, values: np.ndarray) -> None:
        index = t // self.window_ns
        np.maximum.at(self.maxima, index, values)
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.sums += np.bincount(index, weights=values, minlength=self.counts.size)
        self.clipped_sums += np.bincount(index, weights=np.clip(values, *self.fences), minlength=self.counts.size)
        _by_part(self.stretches, np.searchsorted(self.mark_ends, t, side="left"), values)
        if self.between:
            _by_part(self.between, np.searchsorted(self.cuts, t, side="right"), values)


def profile_pass(batches: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]], *, first_ns: int,
                 last_ns: int, rows: int, overall: Histogram, window_ns: int | None = None,
                 cuts: Sequence[int] = ()) -> RunPass:
    """One pass over (t_ns, value, cpu or None) chunks of a run whose time stamps span first_ns..last_ns
    (``rows`` samples, exact histogram ``overall``): per-window count/max/mean/level, cumulative summaries at
    1/8, 2/8, 4/8 and all of the run, the largest samples, a thinned series, and exact statistics between
    ``cuts`` (ascending offsets from the first sample, e.g. timeline events; none given: no statistics)."""
    duration = last_ns - first_ns
    if window_ns is None:
        window_ns = default_window(duration)
    if window_ns <= 0:
        raise InputError(f"--window {window_ns}: must be positive")
    count = duration // window_ns + 1
    if count > 10_000_000:
        raise InputError(f"--window {window_ns} ns: {count} windows is too many for this run")
    mark_ends = np.array([int(round(duration * f)) for f in MARK_FRACTIONS], np.int64)
    state = _Pass(count, window_ns, (overall.quantile(0.01), overall.quantile(0.99)), mark_ends,
                  np.asarray(cuts, np.int64), max(1, rows // SERIES_POINTS))
    for t, values, cpu in batches:
        if t.size:
            state.add(t.astype(np.int64) - first_ns, values, None if cpu is None else cpu.astype(np.int64))
    counts = state.counts
    windows = [Window(int(i) * window_ns, int(counts[i]), int(state.maxima[i]), float(state.sums[i] / counts[i]),
                      float(state.clipped_sums[i] / counts[i])) for i in np.flatnonzero(counts)]
    marks = []
    for k, end in enumerate(mark_ends[:-1]):
        upto = [b.finish() for b in state.stretches[:k + 1] if b.has_samples]
        marks.append((int(end), summarize_histogram(Histogram.merged(upto) if upto else None)))
    marks.append((int(mark_ends[-1]), summarize_histogram(overall)))
    series_t = np.concatenate(state.kept_t) if state.kept_t else np.empty(0, np.int64)
    series_v = np.concatenate(state.kept_v) if state.kept_v else np.empty(0, np.int64)
    order = np.argsort(series_t, kind="stable")
    return RunPass(TimeProfile(window_ns, first_ns, duration, windows, marks), state.top_t, state.top_v,
                   state.top_cpu, series_t[order], series_v[order],
                   [summarize_histogram(b.finish() if b.has_samples else None) for b in state.between])
