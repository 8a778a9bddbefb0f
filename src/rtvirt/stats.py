"""Exact summary statistics of integer samples (latencies, durations in ns).

Quantiles follow numpy's default definition (linear interpolation between order statistics). Latency
samples are integers whose body has a small range, so the order statistics come from an exact histogram:
one counting pass in cache-sized chunks over a dense range covering the body, and a sort of the rare
values beyond it (the tail). Both are exact. A :class:`Histogram` (distinct values and their counts) is
also what the results store keeps next to the samples, so a stored run's statistics need no pass over its
samples at all.

Confidence intervals (95 %): the mean's is mean ± 1.96·s/√n (normal approximation, s with n−1); the
median's is distribution-free, between the order statistics of ranks n/2 ∓ 1.96·√n/2 (binomial
normal approximation), so it stays valid for skewed latency distributions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from .stream import SampleStream
from .summary import SUMMARY_FIELDS, Summary

__all__ = ["Summary", "Histogram", "HistogramBuilder", "summarize", "summarize_histogram", "summarize_stream",
           "SUMMARY_FIELDS", "quantile", "fraction_of_percent"]

# Dense counting bins: at least this many, at most this many (beyond: the tail is sorted).
_DENSE_MIN = 1 << 16
_DENSE_MAX = 1 << 22
_CHUNK = 1 << 18
_Z95 = 1.959963984540054


_QUANTILES = {"q1_ns": 0.25, "median_ns": 0.5, "q3_ns": 0.75, "p99_ns": 0.99, "p999_ns": 0.999,
              "p9999_ns": 0.9999}


@dataclass(frozen=True)
class Histogram:
    """Exact distribution: ascending distinct ``values`` and how often each occurred (``counts``)."""

    values: np.ndarray
    counts: np.ndarray
    cumulative: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cumulative", np.cumsum(self.counts, dtype=np.int64))

    @property
    def n(self) -> int:
        return int(self.cumulative[-1]) if self.cumulative.size else 0

    @classmethod
    def of(cls, samples: np.ndarray) -> Histogram:
        builder = HistogramBuilder()
        builder.add(samples)
        return builder.finish()

    @classmethod
    def merged(cls, parts: Iterable[Histogram]) -> Histogram:
        parts = list(parts)
        if not parts:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64))
        values = np.concatenate([p.values for p in parts]).astype(np.int64, copy=False)
        counts = np.concatenate([p.counts for p in parts])
        if not values.size:
            return cls(values, counts.astype(np.int64))
        lo, hi = int(values.min()), int(values.max())
        top = lo + _dense_bins(values, lo, hi)
        if int(counts.sum()) >= 1 << 53 or hi - lo >= 1 << 62:
            return cls._sorted(values, counts)
        # Latency histograms: a body in a small range, summed into dense bins (faster than sorting when the
        # report pools many runs; float64 sums of integer counts below 2**53 are exact), and a rare tail
        # beyond it, sorted.
        body = values < top
        dense = np.bincount(values[body] - lo, weights=counts[body])
        present = np.flatnonzero(dense)
        tail = cls._sorted(values[~body], counts[~body])
        return cls(np.concatenate([present.astype(np.int64) + lo, tail.values]),
                   np.concatenate([dense[present].astype(np.int64), tail.counts]))

    @classmethod
    def _sorted(cls, values: np.ndarray, counts: np.ndarray) -> Histogram:
        distinct, where = np.unique(values, return_inverse=True)
        return cls(distinct, np.bincount(where, weights=counts, minlength=distinct.size).astype(np.int64))

    def kth(self, k: int) -> int:
        """The k-th smallest sample (0-based)."""
        return int(self.values[np.searchsorted(self.cumulative, k, side="right")])

    def quantile(self, q: float) -> float:
        position = (self.n - 1) * q
        below = math.floor(position)
        lower = self.kth(below)
        if below + 1 >= self.n:
            return float(lower)
        upper = self.kth(below + 1)
        return lower + (upper - lower) * (position - below)


def quantile(samples: np.ndarray, q: float) -> float:
    """The q-quantile of integer samples by the one definition of every quantile rtvirt prints or acts on (the
    p99.9 `rtvirt stats` prints is the threshold `rtvirt explain` takes): numpy's linear interpolation between
    the order statistics around (n − 1)·q, exact (from the samples' histogram)."""
    return Histogram.of(np.asarray(samples)).quantile(q)


def fraction_of_percent(percent: float) -> float:
    """The fraction a percentage denotes, as the decimal written (99.9 -> 0.999, the p99.9 of the statistics):
    99.9 / 100 is 0.9990000000000001, whose float noise moves an interpolated quantile off the statistics' by
    enough to turn a printed digit at a tie (168.148 us against stats' 168.147 in a suite run)."""
    return float(Decimal(repr(percent)) / 100)


def _distinct_counts(samples: np.ndarray) -> Histogram:
    values, counts = np.unique(samples.astype(np.int64, copy=False), return_counts=True)
    return Histogram(values, counts.astype(np.int64))


def _dense_bins(samples: np.ndarray, lo: int, hi: int) -> int:
    """Number of dense counting bins from ``lo``: enough for the body of the distribution (estimated on
    a strided subsample), small enough to stay in cache; the sparse tail beyond is counted by sorting."""
    span = hi - lo + 1
    if span <= _DENSE_MIN:
        return span
    probe = samples[:: max(1, samples.size // 65_536)]
    body = int(np.quantile(probe, 0.999)) - lo + 1
    # Never many more bins than samples: a few values spread wide are cheaper to sort.
    return int(min(span, max(_DENSE_MIN, 2 * body), _DENSE_MAX, max(_DENSE_MIN, 8 * samples.size)))


class HistogramBuilder:
    """Accumulates an exact histogram chunk by chunk (bounded memory: one chunk plus the counts)."""

    def __init__(self) -> None:
        self._parts: list[Histogram] = []

    def add(self, samples: np.ndarray) -> None:
        samples = np.asarray(samples)
        if samples.size == 0:
            return
        if not np.issubdtype(samples.dtype, np.integer):
            raise TypeError("exact statistics take integer samples (ns)")
        lo, hi = int(samples.min()), int(samples.max())
        if hi - lo >= 1 << 62:
            self._parts.append(_distinct_counts(samples))
            return
        cap = _dense_bins(samples, lo, hi)
        counts = np.zeros(cap + 1, np.int64)
        # One reused int64 buffer of cache size: bincount takes it without another conversion copy.
        buffer = np.empty(min(_CHUNK, samples.size), np.int64)
        tails = []
        for start in range(0, samples.size, _CHUNK):
            chunk = samples[start:start + _CHUNK]
            shifted = buffer[:chunk.size]
            np.subtract(chunk, lo, out=shifted, casting="unsafe")
            np.minimum(shifted, cap, out=shifted)
            # Values past the dense range all land in the last bin; they are rare and counted exactly below.
            chunk_counts = np.bincount(shifted, minlength=cap + 1)
            counts += chunk_counts
            if chunk_counts[cap]:
                tails.append(chunk[chunk >= lo + cap])
        present = np.flatnonzero(counts[:cap])
        body = Histogram(present.astype(np.int64) + lo, counts[present])
        if not tails:
            self._parts.append(body)
            return
        tail = _distinct_counts(np.concatenate(tails))
        # Tail values are all above the dense range: concatenation keeps the order.
        self._parts.append(Histogram(np.concatenate([body.values, tail.values]),
                                     np.concatenate([body.counts, tail.counts])))

    @property
    def has_samples(self) -> bool:
        return bool(self._parts)

    def finish(self) -> Histogram:
        return self._parts[0] if len(self._parts) == 1 else Histogram.merged(self._parts)


def summarize(values: np.ndarray, dropped: int = 0) -> Summary:
    """Exact statistics of integer samples; an empty input gives NaN statistics with samples=0."""
    values = np.asarray(values)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise TypeError("summarize() takes integer samples (ns)")
    return summarize_histogram(Histogram.of(values) if values.size else None, dropped)


def summarize_histogram(histogram: Histogram | None, dropped: int = 0) -> Summary:
    """Exact statistics from an exact histogram (None or empty: NaN statistics with samples=0)."""
    if histogram is None or histogram.n == 0:
        nan = math.nan
        return Summary(0, dropped, *([nan] * (len(SUMMARY_FIELDS) - 2)))
    h = histogram
    n = h.n
    as_float = h.values.astype(np.float64)
    weights = h.counts.astype(np.float64)
    # Sums, not np.dot: BLAS's threaded dot costs ~50 ms per call on a loaded machine, the whole summary <1 ms.
    mean = float((weights * as_float).sum()) / n
    var = float((weights * (as_float - mean) ** 2).sum()) / n
    q = {name: h.quantile(p) for name, p in _QUANTILES.items()}
    iqr = q["q3_ns"] - q["q1_ns"]
    low_fence, high_fence = q["q1_ns"] - 1.5 * iqr, q["q3_ns"] + 1.5 * iqr
    lower_whisker = h.values[np.searchsorted(h.values, low_fence, side="left")]
    upper_whisker = h.values[np.searchsorted(h.values, high_fence, side="right") - 1]
    lo, hi = int(h.values[0]), int(h.values[-1])
    sample_sd = math.sqrt(var * n / (n - 1)) if n > 1 else math.nan
    mean_half = _Z95 * sample_sd / math.sqrt(n)
    # Ranks (1-based) of the median's distribution-free interval, clamped to the sample.
    half_width = _Z95 * math.sqrt(n) / 2
    low_rank = max(1, math.floor(n / 2 - half_width))
    high_rank = min(n, math.ceil(n / 2 + 1 + half_width))
    return Summary(
        samples=n,
        dropped=dropped,
        min_ns=float(lo),
        lower_whisker_ns=float(lower_whisker),
        q1_ns=q["q1_ns"],
        median_ns=q["median_ns"],
        mean_ns=mean,
        q3_ns=q["q3_ns"],
        upper_whisker_ns=float(upper_whisker),
        p99_ns=q["p99_ns"],
        p999_ns=q["p999_ns"],
        p9999_ns=q["p9999_ns"],
        max_ns=float(hi),
        stdev_ns=math.sqrt(var),
        max_jitter_ns=float(hi - lo),
        mean_ci_low_ns=mean - mean_half,
        mean_ci_high_ns=mean + mean_half,
        median_ci_low_ns=float(h.kth(low_rank - 1)),
        median_ci_high_ns=float(h.kth(high_rank - 1)),
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
            label = " ".join(_label(stream, column, int(k)) for column, k in zip(group_by, key, strict=True))
            dropped = stream.dropped.get(int(key[0]), 0) if group_by == ("thread",) else 0
            result[label] = summarize(values[mask], dropped)
    result["all"] = summarize(values, stream.total_dropped)
    return result


def _label(stream: SampleStream, column: str, value: int) -> str:
    if column == "kind":
        return stream.kind_name(value)
    return f"{column} {value}"
