"""Exact statistics against numpy's sort-based definitions, histogram merging, and the stored histogram."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from results_data import synthetic_run

from rtvirt.stats import Histogram, HistogramBuilder, Summary, summarize, summarize_histogram
from rtvirt.store import load_run

Z95 = 1.959963984540054


def reference_ci(values: np.ndarray) -> dict[str, float]:
    ordered = np.sort(values)
    n = values.size
    half = Z95 * math.sqrt(n) / 2
    low_rank, high_rank = max(1, math.floor(n / 2 - half)), min(n, math.ceil(n / 2 + 1 + half))
    sd = float(np.std(values.astype(float), ddof=1)) if n > 1 else math.nan
    mean = float(values.mean())
    return {"median_ci_low_ns": float(ordered[low_rank - 1]), "median_ci_high_ns": float(ordered[high_rank - 1]),
            "mean_ci_low_ns": mean - Z95 * sd / math.sqrt(n), "mean_ci_high_ns": mean + Z95 * sd / math.sqrt(n)}


def same(a: Summary, b: Summary) -> bool:
    """Equal field by field, NaN (e.g. the CI of one sample) equal to NaN."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a.as_dict().values(), b.as_dict().values(), strict=True))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**7), min_size=2, max_size=300))
def test_confidence_intervals_match_their_definition(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    got = summarize(array)
    for name, expected in reference_ci(array).items():
        assert getattr(got, name) == pytest.approx(expected, rel=1e-9, abs=1e-6), name
    assert got.median_ci_low_ns <= got.median_ns <= got.median_ci_high_ns


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=-(10**9), max_value=10**12), min_size=1, max_size=60),
                min_size=1, max_size=5))
def test_chunked_histogram_equals_whole(chunks: list[list[int]]) -> None:
    builder = HistogramBuilder()
    for chunk in chunks:
        builder.add(np.array(chunk, dtype=np.int64))
    whole = np.concatenate([np.array(c, dtype=np.int64) for c in chunks])
    assert same(summarize_histogram(builder.finish()), summarize(whole))
    distinct, counts = np.unique(whole, return_counts=True)
    merged = builder.finish()
    assert merged.values.tolist() == distinct.tolist() and merged.counts.tolist() == counts.tolist()


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64, np.uint32])
def test_integer_widths_give_the_same_statistics(dtype: type) -> None:
    rng = np.random.default_rng(3)
    values: np.ndarray[Any, Any] = rng.gamma(3, 1500, 50_000).astype(dtype)
    assert summarize(values) == summarize(values.astype(np.int64))
    assert summarize(values).median_ns == float(np.median(values.astype(np.int64)))


def test_tail_beyond_the_dense_range_across_chunks() -> None:
    # 1 % of values spread far above the body, over several internal chunks: the sorted-tail path.
    rng = np.random.default_rng(9)
    values: np.ndarray[Any, Any] = rng.gamma(4, 2000, 700_000).astype(np.int64)
    tail = rng.integers(0, values.size, 7000)
    values[tail] = rng.integers(10**6, 10**10, tail.size)
    assert same(summarize(values), summarize(np.sort(values)))
    got = summarize(values)
    assert got.p99_ns == float(np.percentile(values, 99)) and got.p999_ns == float(np.percentile(values, 99.9))
    assert got.mean_ns == pytest.approx(values.mean(), rel=1e-12)


def test_floats_are_refused() -> None:
    with pytest.raises(TypeError):
        summarize(np.array([1.5, 2.0]))
    with pytest.raises(TypeError):
        Histogram.of(np.array([1.5]))


def test_stored_histogram_gives_the_exact_statistics(tmp_path) -> None:
    rng = np.random.default_rng(11)
    values = np.concatenate([rng.gamma(4, 2000, 100_000).astype(np.int64), [9_000_000, 40]])
    cpus = rng.integers(0, 2, values.size)
    manifest = synthetic_run(tmp_path, "stored", values, cpu=cpus)
    run = load_run(tmp_path / "runs" / manifest["run_id"])
    assert run.summary() == summarize(values)
    assert manifest["summary"]["all"]["p9999_ns"] == pytest.approx(float(np.percentile(values, 99.99)))
    assert manifest["summary"]["cpu 1"]["samples"] == int((cpus == 1).sum())
    # The Parquet samples keep every value, stored as int32 since they fit.
    stored = run.samples()
    assert str(stored.schema.field("latency_ns").type) == "int32"
    assert np.array_equal(stored["latency_ns"].to_numpy(), values)
