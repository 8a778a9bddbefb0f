"""Exact summary statistics of integer samples (latencies, durations in ns).

Quantiles follow numpy's default definition (linear interpolation between order statistics). Latency
samples are integers with a small range, so the order statistics come from an exact histogram (one
counting pass) rather than a sort; a wide range falls back to a sort. Both are exact.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .stream import SampleStream

__all__ = ["Summary", "summarize", "summarize_stream", "SUMMARY_FIELDS"]

# Histogram when the value range is at most this many bins (or a few per sample).
_HIST_MAX_BINS = 1 << 24


@dataclass(frozen=True)
class Summary:
    samples: int
    dropped: int
    min_ns: float
    lower_whisker_ns: float
    q1_ns: float
    median_ns: float
    mean_ns: float
    q3_ns: float
    upper_whisker_ns: float
    p99_ns: float
    p999_ns: float
    p9999_ns: float
    max_ns: float
    stdev_ns: float
    max_jitter_ns: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


SUMMARY_FIELDS = tuple(Summary.__dataclass_fields__)
_QUANTILES = {"q1_ns": 0.25, "median_ns": 0.5, "q3_ns": 0.75, "p99_ns": 0.99, "p999_ns": 0.999,
              "p9999_ns": 0.9999}


class _OrderStatistics:
    """k-th smallest value (0-based) of the samples, from counts or from a sorted copy."""

    def __init__(self, values: np.ndarray) -> None:
        self.n = int(values.size)
        self.lo = int(values.min())
        hi = int(values.max())
        self.hi = hi
        span = hi - self.lo + 1
        if span <= max(_HIST_MAX_BINS, 4 * self.n) and span <= 1 << 28:
            counts = np.bincount((values - self.lo).astype(np.intp, copy=False), minlength=span)
            self.cumulative: np.ndarray | None = np.cumsum(counts)
            self.sorted: np.ndarray | None = None
            bins = np.arange(self.lo, self.lo + span, dtype=np.float64)
            self.total = float(np.dot(counts.astype(np.float64), bins))
            self.mean = self.total / self.n
            self.var = float(np.dot(counts.astype(np.float64), (bins - self.mean) ** 2)) / self.n
        else:
            self.cumulative = None
            self.sorted = np.sort(values)
            as_float = self.sorted.astype(np.float64)
            self.mean = float(as_float.mean())
            self.var = float(as_float.var())

    def kth(self, k: int) -> int:
        if self.sorted is not None:
            return int(self.sorted[k])
        assert self.cumulative is not None
        return self.lo + int(np.searchsorted(self.cumulative, k, side="right"))

    def quantile(self, q: float) -> float:
        position = (self.n - 1) * q
        below = math.floor(position)
        lower = self.kth(below)
        if below + 1 >= self.n:
            return float(lower)
        upper = self.kth(below + 1)
        return lower + (upper - lower) * (position - below)

    def smallest_at_least(self, threshold: float) -> int:
        if self.sorted is not None:
            return int(self.sorted[np.searchsorted(self.sorted, threshold, side="left")])
        assert self.cumulative is not None
        start = max(0, math.ceil(threshold) - self.lo)
        before = int(self.cumulative[start - 1]) if start > 0 else 0
        return self.kth(before)

    def largest_at_most(self, threshold: float) -> int:
        if self.sorted is not None:
            return int(self.sorted[np.searchsorted(self.sorted, threshold, side="right") - 1])
        assert self.cumulative is not None
        end = min(self.hi, math.floor(threshold)) - self.lo
        return self.kth(int(self.cumulative[end]) - 1)


def summarize(values: np.ndarray, dropped: int = 0) -> Summary:
    """Exact statistics of integer samples; an empty input gives NaN statistics with samples=0."""
    values = np.asarray(values)
    if values.size == 0:
        nan = float("nan")
        return Summary(0, dropped, *([nan] * (len(SUMMARY_FIELDS) - 2)))
    if not np.issubdtype(values.dtype, np.integer):
        raise TypeError("summarize() takes integer samples (ns)")
    order = _OrderStatistics(values)
    q = {name: order.quantile(p) for name, p in _QUANTILES.items()}
    iqr = q["q3_ns"] - q["q1_ns"]
    return Summary(
        samples=order.n,
        dropped=dropped,
        min_ns=float(order.lo),
        lower_whisker_ns=float(order.smallest_at_least(q["q1_ns"] - 1.5 * iqr)),
        q1_ns=q["q1_ns"],
        median_ns=q["median_ns"],
        mean_ns=order.mean,
        q3_ns=q["q3_ns"],
        upper_whisker_ns=float(order.largest_at_most(q["q3_ns"] + 1.5 * iqr)),
        p99_ns=q["p99_ns"],
        p999_ns=q["p999_ns"],
        p9999_ns=q["p9999_ns"],
        max_ns=float(order.hi),
        stdev_ns=math.sqrt(order.var),
        max_jitter_ns=float(order.hi - order.lo),
    )


def summarize_stream(stream: SampleStream, group_by: tuple[str, ...] = ("thread",)) -> dict[str, Summary]:
    """Per-group summaries (e.g. per thread, per operation) and ``all``; drops are charged per thread."""
    records = stream.records
    values = records["value"]
    result: dict[str, Summary] = {}
    if group_by and records.size:
        keys = np.stack([records[column].astype(np.int64) for column in group_by], axis=1)
        for key in np.unique(keys, axis=0):
            mask = np.all(keys == key, axis=1)
            label = " ".join(_label(stream, column, int(k)) for column, k in zip(group_by, key))
            dropped = stream.dropped.get(int(key[0]), 0) if group_by == ("thread",) else 0
            result[label] = summarize(values[mask], dropped)
    result["all"] = summarize(values, stream.total_dropped)
    return result


def _label(stream: SampleStream, column: str, value: int) -> str:
    if column == "kind":
        return stream.kind_name(value)
    return f"{column} {value}"
