import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvirt.stats import summarize

QUANTILES = {"q1_ns": 25, "median_ns": 50, "q3_ns": 75, "p99_ns": 99, "p999_ns": 99.9, "p9999_ns": 99.99}


def reference(values: np.ndarray) -> dict[str, float]:
    """The definitions written out with numpy's sort-based functions."""
    q = {name: float(np.percentile(values, p)) for name, p in QUANTILES.items()}
    iqr = q["q3_ns"] - q["q1_ns"]
    inside = values[(values >= q["q1_ns"] - 1.5 * iqr) & (values <= q["q3_ns"] + 1.5 * iqr)]
    return q | {
        "min_ns": float(values.min()), "max_ns": float(values.max()), "mean_ns": float(values.mean()),
        "stdev_ns": float(values.std()), "max_jitter_ns": float(values.max() - values.min()),
        "lower_whisker_ns": float(inside.min()), "upper_whisker_ns": float(inside.max()),
    }


def assert_matches(values: np.ndarray) -> None:
    got = summarize(values).as_dict()
    assert got["samples"] == values.size
    for name, expected in reference(values).items():
        assert got[name] == pytest.approx(expected, rel=1e-9, abs=1e-6), name


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-10**6, max_value=10**6), min_size=1, max_size=400))
def test_histogram_path_matches_numpy(values: list[int]) -> None:
    assert_matches(np.array(values, dtype=np.int64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=50))
def test_sort_path_matches_numpy(values: list[int]) -> None:
    # A range far wider than the sample count takes the sort path.
    assert_matches(np.array(values, dtype=np.int64))


def test_latency_like_distribution_with_outliers() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.gamma(4, 2000, 200_000).astype(np.int64), [540_000_000, 3, 12_000_000]])
    assert_matches(values)


def test_whiskers_exclude_outliers() -> None:
    values = np.array([10] * 50 + [11] * 50 + [1000], dtype=np.int64)
    s = summarize(values)
    assert s.upper_whisker_ns == 11 and s.max_ns == 1000 and s.max_jitter_ns == 990


def test_empty_input_reports_zero_samples() -> None:
    s = summarize(np.array([], dtype=np.int64), dropped=4)
    assert s.samples == 0 and s.dropped == 4 and math.isnan(s.median_ns)


def test_floats_are_refused() -> None:
    with pytest.raises(TypeError):
        summarize(np.array([1.5, 2.5]))
