"""Statistics over time: per-window maxima (long-term monitoring) and cumulative marks (stability).

Each window also has a *level*: its mean with values clipped to the run's 1st and 99th percentiles, so
that a rare outlier shows in the window's maximum but does not look like a change of level, while a
shift lasting more than 1 % of the run keeps its full size (Tukey's whiskers would clip a 50 % shift).

Times are the samples' ``t_ns`` relative to the run's first sample. One chunked pass over the samples
bounds memory whatever the run length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..stats import HistogramBuilder, Summary, summarize_histogram
from ..store import StoredRun

__all__ = ["Window", "TimeProfile", "time_profile", "MARK_FRACTIONS", "load_series"]

# The studies judge 8 h runs at 1, 2, 4 and 8 h: the same fractions of any run's length.
MARK_FRACTIONS = (1 / 8, 2 / 8, 4 / 8, 1.0)
DEFAULT_WINDOW_NS = 300 * 10**9


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


def _columns(run: StoredRun) -> list[str]:
    if not run.has_samples or not run.value_field:
        raise InputError(f"{run.path}: run has no samples (time statistics need samples.parquet)")
    return ["t_ns", run.value_field]


def _time_range(run: StoredRun) -> tuple[int, int]:
    first, last = None, None
    for batch in run.iter_batches(["t_ns"]):
        t = batch.column(0).to_numpy()
        if t.size:
            first = int(t.min()) if first is None else min(first, int(t.min()))
            last = int(t.max()) if last is None else max(last, int(t.max()))
    if first is None or last is None:
        raise InputError(f"{run.path}: run has no samples")
    return first, last


def _window_maxima(maxima: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """maxima[i] = max(maxima[i], values where index == i)."""
    steps = np.diff(index)
    if steps.size and steps.min() >= 0:
        # Samples in time order (the usual case): one reduction per run of equal windows.
        starts = np.concatenate([[0], np.flatnonzero(steps) + 1])
        windows = index[starts]
        maxima[windows] = np.maximum(maxima[windows], np.maximum.reduceat(values, starts))
    else:
        np.maximum.at(maxima, index, values)


def default_window(duration_ns: int) -> int:
    """5 min windows (OSADL) for long runs; a shorter run gets a round window giving about 50 windows."""
    if duration_ns >= 50 * DEFAULT_WINDOW_NS:
        return DEFAULT_WINDOW_NS
    target = max(duration_ns / 50, 1)
    magnitude = 10 ** int(np.floor(np.log10(target)))
    return int(next(step * magnitude for step in (1, 2, 5, 10) if step * magnitude >= target))


def time_profile(run: StoredRun, window_ns: int | None = None) -> TimeProfile:
    """Per-window count/max/mean and cumulative summaries at 1/8, 2/8, 4/8 and all of the run."""
    columns = _columns(run)
    first, last = _time_range(run)
    duration = last - first
    if window_ns is None:
        window_ns = default_window(duration)
    if window_ns <= 0:
        raise InputError(f"--window {window_ns}: must be positive")
    count = duration // window_ns + 1
    if count > 10_000_000:
        raise InputError(f"--window {window_ns} ns: {count} windows is too many for this run")
    maxima = np.full(count, np.iinfo(np.int64).min, np.int64)
    counts = np.zeros(count, np.int64)
    sums = np.zeros(count, np.float64)
    clipped_sums = np.zeros(count, np.float64)
    overall = run.histogram()
    assert overall is not None  # the run has samples (checked above)
    fences = (overall.quantile(0.01), overall.quantile(0.99))
    mark_ends = [int(round(duration * f)) for f in MARK_FRACTIONS]
    builders = [HistogramBuilder() for _ in mark_ends]
    for batch in run.iter_batches(columns):
        t = batch.column(0).to_numpy() - first
        values = batch.column(1).to_numpy()
        index = t // window_ns
        _window_maxima(maxima, index, values)
        counts += np.bincount(index, minlength=count)
        sums += np.bincount(index, weights=values, minlength=count)
        clipped_sums += np.bincount(index, weights=np.clip(values, *fences), minlength=count)
        for end, builder in zip(mark_ends, builders, strict=True):
            builder.add(values if end >= duration else values[t <= end])
    windows = [Window(int(i) * window_ns, int(counts[i]), int(maxima[i]), float(sums[i] / counts[i]),
                      float(clipped_sums[i] / counts[i])) for i in np.flatnonzero(counts)]
    marks = [(end, summarize_histogram(b.finish())) for end, b in zip(mark_ends, builders, strict=True)]
    return TimeProfile(window_ns, first, duration, windows, marks)


def load_series(run: StoredRun, limit: int = 20_000, keep_largest: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns from the first sample, value) in time order, for plots: every k-th sample so that about
    ``limit`` remain, plus the ``keep_largest`` largest values (one chunked pass, bounded memory)."""
    columns = _columns(run)
    rows = run.row_count()
    stride = max(1, rows // limit)
    kept_t, kept_v = [], []
    top_t, top_v = np.empty(0, np.int64), np.empty(0, np.int64)
    offset = 0
    for batch in run.iter_batches(columns):
        t = batch.column(0).to_numpy().astype(np.int64)
        values = batch.column(1).to_numpy().astype(np.int64)
        first_kept = (-offset) % stride
        kept_t.append(t[first_kept::stride].copy())  # a copy: a strided view would keep the whole batch alive
        kept_v.append(values[first_kept::stride].copy())
        offset += t.size
        top_t, top_v = np.concatenate([top_t, t]), np.concatenate([top_v, values])
        if top_v.size > keep_largest:
            largest = np.argpartition(top_v, -keep_largest)[-keep_largest:]
            top_t, top_v = top_t[largest], top_v[largest]
    t = np.concatenate([*kept_t, top_t])
    values = np.concatenate([*kept_v, top_v])
    if t.size == 0:
        return t, values
    order = np.argsort(t, kind="stable")
    return t[order] - t[order[0]], values[order]
