"""History and regressions across a store: a metric of one configuration over time per machine with every
change of kernel, hypervisor or scenario marked (`rtvirt trend`), and the tail test of `rtvirt compare`.

The tail test asks whether a run exceeds its baseline's tail more often than chance allows, from the runs'
exact histograms: the threshold is the baseline's quantile at ``level`` (p99.9 by default); under "same
distribution" the candidate's share of all samples above it is binomial given their total (the conditional test
for two rates), and a regression needs both a one-sided p below ``alpha`` and an exceedance rate at least
``min_ratio`` times the baseline's: with millions of samples the first alone flags differences smaller than two
runs of one configuration differ by on a live machine (docs/results-store.md, "Regressions").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..stores.provenance import CHANGE_COLUMNS, configuration, run_row

if TYPE_CHECKING:  # numpy only for the tail test: `rtvirt trend` starts without it
    from ..stats import Histogram
    from ..stores import RunStore

__all__ = ["TailTest", "tail_test", "Trend", "trend", "trend_of", "histories", "previous_run_row", "METRICS"]

METRICS = ("max_ns", "p9999_ns", "p999_ns", "p99_ns", "median_ns", "mean_ns", "class")
_EXACT_LIMIT = 200_000  # exceedances summed exactly up to here; a normal approximation beyond


@dataclass(frozen=True)
class TailTest:
    level: float
    threshold_ns: int
    baseline_samples: int
    baseline_above: int
    samples: int
    above: int
    rate_ratio: float
    p_value: float
    alpha: float
    min_ratio: float
    baseline_max_ns: int
    max_ns: int

    @property
    def regression(self) -> bool:
        return self.p_value < self.alpha and self.rate_ratio >= self.min_ratio

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate_ratio": None if math.isinf(self.rate_ratio) else self.rate_ratio,
                "regression": self.regression}


def _quantile(histogram: Histogram, level: float) -> int:
    import numpy as np

    rank = max(1, math.ceil(level * histogram.n))
    return int(histogram.values[int(np.searchsorted(histogram.cumulative, rank))])


def _above(histogram: Histogram, threshold: int) -> int:
    import numpy as np

    at_or_below = int(np.searchsorted(histogram.values, threshold, side="right"))
    return histogram.n - (int(histogram.cumulative[at_or_below - 1]) if at_or_below else 0)


def binomial_upper_tail(successes: int, trials: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, p)."""
    if successes <= 0:
        return 1.0
    if successes > trials or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    import numpy as np

    if trials > _EXACT_LIMIT:
        mean, sd = trials * p, math.sqrt(trials * p * (1 - p))
        return 0.5 * math.erfc((successes - 0.5 - mean) / (sd * math.sqrt(2)))
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(trials + 1)
    terms = np.array([log_n - math.lgamma(j + 1) - math.lgamma(trials - j + 1) + j * log_p + (trials - j) * log_q
                      for j in range(successes, trials + 1)])
    top = float(terms.max())
    return min(1.0, math.exp(top) * float(np.exp(terms - top).sum()))


def tail_test(baseline: Histogram, other: Histogram, *, level: float = 0.999, alpha: float = 1e-3,
              min_ratio: float = 2.0) -> TailTest:
    if baseline.n == 0 or other.n == 0:
        raise ValueError("a run without samples has no tail to compare")
    threshold = _quantile(baseline, level)
    base_above, above = _above(baseline, threshold), _above(other, threshold)
    base_rate, rate = base_above / baseline.n, above / other.n
    ratio = rate / base_rate if base_rate else (math.inf if rate else 1.0)
    p_value = binomial_upper_tail(above, base_above + above, other.n / (baseline.n + other.n))
    return TailTest(level, threshold, baseline.n, base_above, other.n, above, ratio, p_value, alpha, min_ratio,
                    int(baseline.values[-1]), int(other.values[-1]))


@dataclass
class TrendPoint:
    run_id: str
    created: str
    value: float | str | None
    status: str | None
    changes: dict[str, list[str | None]] = field(default_factory=dict)  # column -> [before, after]


@dataclass
class Trend:
    configuration: str
    metric: str
    machines: dict[str, list[TrendPoint]]

    def as_dict(self) -> dict[str, Any]:
        return {"configuration": self.configuration, "metric": self.metric,
                "machines": {machine: [asdict(p) for p in points] for machine, points in self.machines.items()}}


def _strictest_class(row: dict[str, Any], classes: list[Any], margin: float) -> str | None:
    from ..stats import Summary
    from .verdicts import judge

    if row.get("max_ns") is None or row.get("min_ns") is None:
        return None
    values: dict[str, Any] = {name: math.nan for name in Summary.__dataclass_fields__}
    values |= {"samples": int(row.get("samples") or 0), "dropped": int(row.get("dropped") or 0),
               "max_ns": float(row["max_ns"]), "max_jitter_ns": float(row["max_ns"]) - float(row["min_ns"])}
    met = [v for v in judge(Summary(**values), classes, margin) if v.outcome == "meets"]
    return min(met, key=lambda v: v.latency_budget_ns).requirement if met else "none"


def trend(store: RunStore, config: str, metric: str = "max_ns", machine: str | None = None, *,
          classes: list[Any] | None = None, margin: float = 0.5) -> Trend:
    """Every run of ``config`` in ``store`` (oldest first) per machine, each with what changed since the
    machine's previous run of it (CHANGE_COLUMNS)."""
    return trend_of(store.rows(config=config, machine=machine), config, metric, classes=classes, margin=margin)


def trend_of(rows: list[dict[str, Any]], config: str, metric: str = "max_ns", *,
             classes: list[Any] | None = None, margin: float = 0.5) -> Trend:
    """:func:`trend` of catalog rows (rtvirt.stores.provenance.run_row) of one configuration, oldest first."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS)}")
    machines: dict[str, list[TrendPoint]] = {}
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = str(row.get("machine") or "unknown")
        value = _strictest_class(row, classes or [], margin) if metric == "class" else row.get(metric)
        point = TrendPoint(str(row["run_id"]), str(row.get("created") or ""), value, row.get("status"))
        before = last.get(name)
        if before is not None:
            point.changes = {column: [before.get(column), row.get(column)] for column in CHANGE_COLUMNS
                             if before.get(column) != row.get(column)}
        last[name] = row
        machines.setdefault(name, []).append(point)
    return Trend(config, metric, machines)


def previous_run_row(store: RunStore, row: dict[str, Any]) -> dict[str, Any] | None:
    """The last complete run of the same configuration on the same machine before ``row``."""
    earlier = [r for r in store.rows(config=configuration(row), machine=row.get("machine"))
               if r["run_id"] != row["run_id"] and r.get("machine") == row.get("machine")
               and str(r.get("created") or "") <= str(row.get("created") or "")
               and r.get("status") == "complete"]
    return earlier[-1] if earlier else None


def histories(manifests: list[dict[str, Any]]) -> list[Trend]:
    """The report's history: the maxima of each configuration with more than one run on a machine, over time."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for row in sorted((run_row(m) for m in manifests), key=lambda r: (str(r.get("created") or ""), r["run_id"])):
        if row.get("max_ns") is not None:
            by_config.setdefault(configuration(row), []).append(row)
    found = [trend_of(rows, config) for config, rows in by_config.items()]
    return [t for t in found if any(len(points) > 1 for points in t.machines.values())]
