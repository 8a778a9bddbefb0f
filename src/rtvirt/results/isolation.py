"""Isolation against a baseline run (solo or bare metal): how much a configuration slows the RT work.

Increase % = (run − baseline) / baseline × 100 for mean, median and p99; WCET is the largest
observed value of each run. Both runs must hold the same quantity (rtvirt.quantity): the row carries its unit
(ns; rounds for Thread-Metric, whose largest value is its best interval, not a worst case). Outliers are the
run's top N samples with their time, shown next to the run's median, in ns and (when the stream header gives
``cycles_hz``) in cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..digest import read_digest
from ..errors import InputError
from ..quantity import LATENCY, Quantity
from ..stats import Summary
from ..store import StoredRun
from ..timeprofile.windows import TOP_KEPT

__all__ = ["IsolationRow", "Outlier", "isolation", "isolation_of", "outliers", "outlier_rows", "cycles_hz"]


@dataclass(frozen=True)
class IsolationRow:
    label: str
    baseline: str
    mean_increase_pct: float
    median_increase_pct: float
    p99_increase_pct: float
    wcet_ns: float  # the largest value of each, in ``unit``
    baseline_wcet_ns: float
    wcet_ratio: float
    quantity: str = LATENCY.name
    unit: str = LATENCY.unit


@dataclass(frozen=True)
class Outlier:
    t_ns: int
    value_ns: int
    median_ns: float
    cpu: int
    value_cycles: float | None
    median_cycles: float | None


def _increase(value: float, base: float) -> float:
    return (value - base) / base * 100 if base else float("nan")


def isolation(run: StoredRun, baseline: StoredRun) -> IsolationRow:
    """Isolation of one run against one baseline run."""
    a, b = run.summary(), baseline.summary()
    for stored, summary in ((run, a), (baseline, b)):
        if summary.samples == 0:
            raise InputError(f"{stored.path}: run has no samples to compare")
    if run.quantity.unit != baseline.quantity.unit:
        raise InputError(f"{run.run_id} holds {run.quantity.title}, {baseline.run_id} {baseline.quantity.title}: "
                         "values in different units are not compared")
    return isolation_of(run.label, a, baseline.label, b, run.quantity)


def isolation_of(label: str, a: Summary, baseline_label: str, b: Summary,
                 quantity: Quantity = LATENCY) -> IsolationRow:
    """Isolation from two summaries of one quantity (e.g. configurations pooled over repetitions)."""
    return IsolationRow(
        label=label, baseline=baseline_label,
        mean_increase_pct=_increase(a.mean_ns, b.mean_ns),
        median_increase_pct=_increase(a.median_ns, b.median_ns),
        p99_increase_pct=_increase(a.p99_ns, b.p99_ns),
        wcet_ns=a.max_ns, baseline_wcet_ns=b.max_ns,
        wcet_ratio=a.max_ns / b.max_ns if b.max_ns else float("nan"),
        **quantity.as_dict(),
    )


def cycles_hz(run: StoredRun) -> float | None:
    header = run.manifest.get("stream_header") or {}
    hz = header.get("cycles_hz") if isinstance(header, dict) else None
    return float(hz) if isinstance(hz, int | float) and hz > 0 else None


def outliers(run: StoredRun, top: int = 10, median_ns: float | None = None) -> list[Outlier]:
    """The ``top`` largest samples, in descending order (from the run's digest, else one chunked pass)."""
    if not run.has_samples or not run.value_field:
        return []
    median = run.summary().median_ns if median_ns is None else median_ns
    digest = read_digest(run.path, run.run_id)
    if digest is not None and digest.has_profile and top <= TOP_KEPT:
        return outlier_rows(run, digest.over_time()[1][:top], median)
    best_t = np.empty(0, np.int64)
    best_v = np.empty(0, np.int64)
    best_cpu = np.empty(0, np.int64)
    first = None
    columns = ["t_ns", run.value_field, "cpu"]
    for batch in run.iter_batches(columns):
        t = batch.column(0).to_numpy().astype(np.int64)
        first = int(t.min()) if first is None else min(first, int(t.min()))
        v = batch.column(1).to_numpy().astype(np.int64)
        cpu = batch.column(2).to_numpy().astype(np.int64)
        if v.size > top:
            keep = np.argpartition(v, -top)[-top:]
            t, v, cpu = t[keep], v[keep], cpu[keep]
        best_t, best_v, best_cpu = (np.concatenate(x) for x in ((best_t, t), (best_v, v), (best_cpu, cpu)))
        order = np.argsort(-best_v, kind="stable")[:top]
        best_t, best_v, best_cpu = best_t[order], best_v[order], best_cpu[order]
    return outlier_rows(run, [(int(t) - (first or 0), int(v), int(c))
                              for t, v, c in zip(best_t, best_v, best_cpu, strict=True)], median)


def outlier_rows(run: StoredRun, largest: list[tuple[int, int, int]], median_ns: float) -> list[Outlier]:
    """Outliers from (t from the first sample, value, CPU) of the largest samples, with cycle counts when the
    run's stream header gives its clock and the values are times (e.g. the largest samples kept in the run's
    digest)."""
    hz = cycles_hz(run) if run.quantity.is_time else None
    per_ns = hz / 1e9 if hz else None
    return [Outlier(t, v, median_ns, c, v * per_ns if per_ns else None, median_ns * per_ns if per_ns else None)
            for t, v, c in largest]
