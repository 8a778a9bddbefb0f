"""Analysed bound, simulated distribution and measured distribution of one configuration, side by side.

Measured runs carry their configuration label (``config``); a prediction's simulated run carries
``predict.config`` naming the same label, the record kind it is compared by and the analysed bound. Values
compared: the timer probe's wake-up latency (simulated: a job's start - its arrival) or the gap probe's gap
lengths. For gaps, the ones at least ``long_gap`` long are the scheduler's holes the model explains; their
rate and lengths are compared separately from the short interrupt gaps the model does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..stats import Histogram, HistogramBuilder
from ..store import StoredRun
from ..units import parse_duration

__all__ = ["Prediction", "predictions", "PESSIMISM_FACTOR", "distribution", "long_gap_threshold"]

PESSIMISM_FACTOR = 2.0  # a bound above this many times the largest observed value is called pessimistic
DEFAULT_LONG_GAP_NS = 1_000_000
# the median of the long gaps is "stable" when the 45th and 55th percentiles lie within 5 % of each other
MEDIAN_STABILITY_BAND = 0.05
MEDIAN_STABILITY_SPREAD = 0.05
SEED_SPREAD = 1.1  # a simulated rate whose seeds differ by more than this factor is named as chance


@dataclass
class Distribution:
    """What the table shows of one source: p50/p99/max, count, and for gaps the long-gap rate and mean."""

    samples: int
    p50_ns: float | None
    p99_ns: float | None
    max_ns: float | None
    seconds: float
    long_gaps: int = 0
    long_gap_mean_ns: float | None = None
    long_gap_median_ns: float | None = None
    # False where the long gaps split about evenly between two lengths (the median jumps between them)
    long_gap_median_stable: bool | None = None
    total_ns: float = 0.0  # sum of all values: for gaps, the time the probe did not run
    # a simulated model that draws: its long-gap rate with each of several seeds (predict.campaign._seed_rates)
    long_gap_rates_by_seed: list[float] | None = None

    @property
    def share(self) -> float | None:
        """For gaps: the share of the run the probe was interrupted."""
        return self.total_ns / (self.seconds * 1e9) if self.seconds > 0 else None

    @property
    def long_gap_rate(self) -> float | None:
        return self.long_gaps / self.seconds if self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "p50_ns": self.p50_ns, "p99_ns": self.p99_ns, "max_ns": self.max_ns,
                "seconds": self.seconds, "long_gaps": self.long_gaps, "long_gap_rate_per_s": self.long_gap_rate,
                "long_gap_mean_ns": self.long_gap_mean_ns, "long_gap_median_ns": self.long_gap_median_ns,
                "long_gap_median_stable": self.long_gap_median_stable, "total_ns": self.total_ns, "share": self.share,
                "long_gap_rates_by_seed": self.long_gap_rates_by_seed}


@dataclass
class Prediction:
    config: str
    compare: str
    metric: str
    bound_ns: float | None
    bound_method: str
    simulated: Distribution
    measured: Distribution | None
    simulated_histogram: Histogram | None
    measured_histogram: Histogram | None
    mapping: list[str]
    notes: list[str]
    long_gap_ns: int | None = None
    findings: list[str] = field(default_factory=list)
    runs: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "compare": self.compare, "metric": self.metric, "bound_ns": self.bound_ns,
                "bound_method": self.bound_method, "simulated": self.simulated.as_dict(),
                "measured": None if self.measured is None else self.measured.as_dict(), "mapping": self.mapping,
                "notes": self.notes, "long_gap_ns": self.long_gap_ns, "findings": self.findings, "runs": self.runs}


def distribution(histogram: Histogram | None, seconds: float, long_gap_ns: int | None,
                 values: np.ndarray | None = None) -> Distribution:
    """p50/p99/max of ``histogram``; with ``long_gap_ns``, the count, mean and median of values at least that
    long."""
    if histogram is None or histogram.n == 0:
        return Distribution(0, None, None, None, seconds)
    result = Distribution(int(histogram.n), histogram.quantile(0.5), histogram.quantile(0.99),
                          float(histogram.values[-1]), seconds,
                          total_ns=float((histogram.values.astype(np.float64) * histogram.counts).sum()))
    if long_gap_ns is not None:
        mask = histogram.values >= long_gap_ns
        count = int(histogram.counts[mask].sum())
        result.long_gaps = count
        if count:
            result.long_gap_mean_ns = float((histogram.values[mask] * histogram.counts[mask]).sum() / count)
            long = Histogram(histogram.values[mask], histogram.counts[mask])
            result.long_gap_median_ns = long.quantile(0.5)
            low, high = long.quantile(0.5 - MEDIAN_STABILITY_BAND), long.quantile(0.5 + MEDIAN_STABILITY_BAND)
            result.long_gap_median_stable = high <= low * (1 + MEDIAN_STABILITY_SPREAD)
    return result


def long_gap_threshold(simulated: Histogram | None, set_ns: int | None) -> int:
    """The gaps counted as the model's holes: at least the scenario's ``long_gap`` (``set_ns``), else half the
    model's median gap."""
    return int(set_ns or (simulated.quantile(0.5) // 2 if simulated else DEFAULT_LONG_GAP_NS))


def _simulated_values(run: StoredRun, compare: str, metric: str) -> Histogram | None:
    columns = ["kind", "response_ns"] if metric == "gap" else ["kind", "t_ns", "start_ns"]
    builder = HistogramBuilder()
    for batch in run.iter_batches(columns):
        kinds = batch.column(0)
        if hasattr(kinds, "dictionary_decode"):
            kinds = kinds.dictionary_decode()
        mask = pc.equal(kinds, compare)
        if metric == "gap":
            values = pc.filter(batch.column(1), mask).to_numpy(zero_copy_only=False)
        else:
            start = pc.filter(batch.column(2), mask).to_numpy(zero_copy_only=False)
            values = start - pc.filter(batch.column(1), mask).to_numpy(zero_copy_only=False)
        if values.size:
            builder.add(values.astype(np.int64))
    return builder.finish() if builder.has_samples else None


def _seconds(run: StoredRun) -> float:
    """Measured time of a run: the probe's duration parameter (ns), else the span of its samples."""
    duration = (run.manifest.get("params") or {}).get("duration")
    if duration:
        try:
            return parse_duration(duration, "s") / 1e9
        except ValueError:
            pass  # not a duration: fall back to the simulated time
    simulated = (run.manifest.get("simulation") or {}).get("simulated_ns")
    return float(simulated) / 1e9 if simulated else 0.0


def _findings(p: Prediction) -> list[str]:
    out = []
    observed = [d.max_ns for d in (p.simulated, p.measured) if d is not None and d.max_ns is not None]
    unit = "gap" if p.metric == "gap" else "latency"
    if p.bound_ns is None:
        out.append(f"no analysed bound: {p.bound_method}")
    else:
        if p.measured is not None and p.measured.max_ns is not None and p.measured.max_ns > p.bound_ns:
            out.append(f"measured {unit} exceeds the bound: max {p.measured.max_ns / 1e3:.1f} us > bound "
                       f"{p.bound_ns / 1e3:.1f} us: the platform does not behave as configured, or the model "
                       "misses an effect" + (f" ({'; '.join(p.notes)})" if p.notes else ""))
        if p.simulated.max_ns is not None and p.simulated.max_ns > p.bound_ns:
            out.append(f"simulated {unit} exceeds the bound ({p.simulated.max_ns / 1e3:.1f} us): an analysis error")
        top = max(observed, default=0.0)
        if top > 0 and p.bound_ns > PESSIMISM_FACTOR * top:
            out.append(f"pessimism: the bound {p.bound_ns / 1e3:.1f} us is {p.bound_ns / top:.1f}x the largest "
                       f"observed {unit} ({top / 1e3:.1f} us)")
    if p.metric == "gap" and p.measured is not None and p.long_gap_ns is not None:
        sim_rate, meas_rate = p.simulated.long_gap_rate, p.measured.long_gap_rate
        if sim_rate is not None and meas_rate is not None:
            unstable = [name for name, d in (("simulated", p.simulated), ("measured", p.measured))
                        if d.long_gap_median_stable is False]
            out.append(f"gaps >= {p.long_gap_ns / 1e3:g} us: simulated {sim_rate:.1f}/s, mean "
                       f"{(p.simulated.long_gap_mean_ns or 0) / 1e3:.1f} us, median "
                       f"{(p.simulated.long_gap_median_ns or 0) / 1e3:.1f} us; measured {meas_rate:.1f}/s, mean "
                       f"{(p.measured.long_gap_mean_ns or 0) / 1e3:.1f} us, median "
                       f"{(p.measured.long_gap_median_ns or 0) / 1e3:.1f} us"
                       + (f" (the {' and '.join(unstable)} median{'s are' if len(unstable) > 1 else ' is'} not "
                          "stable: the long gaps split about evenly between two lengths, so compare the means)"
                          if unstable else ""))
    seeded = p.simulated.long_gap_rates_by_seed
    if seeded and max(seeded) > SEED_SPREAD * min(seeded):
        out.append(f"the simulated rate depends on chance here: {min(seeded):.1f} to {max(seeded):.1f}/s over "
                   f"{len(seeded)} seeds (the reservation's ticks fall among its resumptions, so which pattern "
                   "of holes a run of a few seconds mostly sees is chance, in the kernel too): one run may be "
                   "anywhere in that range")
    return out


def predictions(runs: list[StoredRun]) -> list[Prediction]:
    """One row per predicted configuration among ``runs`` (its simulated run and its measured runs)."""
    measured: dict[str, list[StoredRun]] = {}
    for run in runs:
        if run.manifest.get("source") in ("measured", "imported") and run.manifest.get("config"):
            measured.setdefault(str(run.manifest["config"]), []).append(run)
    rows = []
    for run in runs:
        info = run.manifest.get("predict")
        if run.manifest.get("source") != "simulated" or not isinstance(info, dict):
            continue
        config, compare, metric = str(info.get("config")), str(info.get("compare")), str(info.get("metric"))
        simulated_hist = _simulated_values(run, compare, metric)
        long_gap = long_gap_threshold(simulated_hist, info.get("long_gap_ns")) if metric == "gap" else None
        measured_runs = measured.get(config, [])
        parts = [h for h in (r.histogram() for r in measured_runs) if h is not None]
        measured_hist = Histogram.merged(parts) if parts else None
        simulated = distribution(simulated_hist, _seconds(run), long_gap)
        seeded = info.get("seed_rates")
        if isinstance(seeded, dict) and seeded.get("long_gap_ns") == long_gap:  # (rates over the same threshold)
            simulated.long_gap_rates_by_seed = [float(rate) for rate in seeded.get("rates_per_s") or []]
        row = Prediction(
            config, compare, metric, info.get("bound_ns"), str(info.get("bound_method") or ""), simulated,
            distribution(measured_hist, sum(_seconds(r) for r in measured_runs), long_gap) if measured_runs else None,
            simulated_hist, measured_hist, list(info.get("mapping") or []), list(info.get("notes") or []), long_gap,
            runs={"simulated": [run.run_id], "analysis": [str(info.get("analysis_run") or "")],
                  "measured": [r.run_id for r in measured_runs]})
        row.findings = _findings(row)
        rows.append(row)
    return rows
