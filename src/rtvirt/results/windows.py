"""The one-pass time profile (rtvirt.timeprofile) over a stored run's samples.parquet: for runs stored without a
digest, or read with another window."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import InputError
from ..store import StoredRun
from ..timeprofile.windows import RunPass, TimeProfile, profile_pass

__all__ = ["run_pass", "time_profile", "time_range"]


def _columns(run: StoredRun) -> list[str]:
    if not run.has_samples or not run.value_field:
        raise InputError(f"{run.path}: run has no samples (time statistics need samples.parquet)")
    return ["t_ns", run.value_field]


def time_range(run: StoredRun) -> tuple[int, int]:
    first, last = None, None
    for batch in run.iter_batches(["t_ns"]):
        t = batch.column(0).to_numpy()
        if t.size:
            first = int(t.min()) if first is None else min(first, int(t.min()))
            last = int(t.max()) if last is None else max(last, int(t.max()))
    if first is None or last is None:
        raise InputError(f"{run.path}: run has no samples")
    return first, last


def run_pass(run: StoredRun, window_ns: int | None = None, cuts: Sequence[int] = (),
             first_last: tuple[int, int] | None = None) -> RunPass:
    """The pass over a stored run's samples.parquet (runs stored without a digest, or another window)."""
    columns = _columns(run)
    first, last = first_last or time_range(run)
    with_cpu = "cpu" in run.sample_columns()
    overall = run.histogram()
    assert overall is not None  # the run has samples (checked above)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        for batch in run.iter_batches(columns + (["cpu"] if with_cpu else [])):
            yield (batch.column(0).to_numpy(), batch.column(1).to_numpy(),
                   batch.column(2).to_numpy() if with_cpu else None)

    return profile_pass(chunks(), first_ns=first, last_ns=last, rows=run.row_count(), overall=overall,
                        window_ns=window_ns, cuts=cuts)


def time_profile(run: StoredRun, window_ns: int | None = None) -> TimeProfile:
    """Per-window count/max/mean and cumulative summaries at 1/8, 2/8, 4/8 and all of the run."""
    return run_pass(run, window_ns).profile
