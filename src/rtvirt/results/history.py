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

from ..identity import distinguishing, run_identity
from ..quantity import LATENCY, Quantity, quantity_of
from ..stores.provenance import CHANGE_COLUMNS, configuration, run_row

if TYPE_CHECKING:  # numpy only for the tail test: `rtvirt trend` starts without it
    from ..stats import Histogram
    from ..stores import RunStore

__all__ = ["TailTest", "tail_test", "Trend", "trend", "trend_of", "histories", "previous_run_row", "METRICS",
           "metric_name"]

# each statistic in the run's unit (the catalog's <metric>_value), or the strictest class met (latencies only)
METRICS = ("max", "p9999", "p999", "p99", "median", "mean", "class")
_OLD_NAMES = {f"{name}_ns": name for name in METRICS if name != "class"}  # as earlier versions called them


def metric_name(metric: str) -> str:
    """A metric by its name, or by the name earlier versions gave it (``max_ns``)."""
    return _OLD_NAMES.get(metric, metric)
_EXACT_LIMIT = 200_000  # exceedances summed exactly up to here; a normal approximation beyond


@dataclass(frozen=True)
class TailTest:
    """``tail``: "upper" counts the samples above the baseline's quantile at ``level`` (times: larger is worse),
    "lower" those below its quantile at 1 - ``level`` (rounds: fewer is worse); values in the runs' unit."""

    level: float
    threshold_ns: float
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
    tail: str = "upper"

    @property
    def regression(self) -> bool:
        return self.p_value < self.alpha and self.rate_ratio >= self.min_ratio

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate_ratio": None if math.isinf(self.rate_ratio) else self.rate_ratio,
                "regression": self.regression}


def _above(histogram: Histogram, threshold: float) -> int:
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


def _mirrored(histogram: Histogram) -> Histogram:
    """The histogram of the negated values: its upper tail is the original's lower tail."""
    from ..stats import Histogram

    return Histogram(-histogram.values[::-1], histogram.counts[::-1])


def tail_test(baseline: Histogram, other: Histogram, *, level: float = 0.999, alpha: float = 1e-3,
              min_ratio: float = 2.0, lower: bool = False) -> TailTest:
    """The tail test; ``lower``: of the lower tail (a throughput, where fewer is worse). The threshold is the
    baseline's quantile by the one definition of rtvirt.stats (its p99.9 is the one `rtvirt stats` prints)."""
    if baseline.n == 0 or other.n == 0:
        raise ValueError("a run without samples has no tail to compare")
    tested, against = (_mirrored(baseline), _mirrored(other)) if lower else (baseline, other)
    threshold = tested.quantile(level)
    base_above, above = _above(tested, threshold), _above(against, threshold)
    base_rate, rate = base_above / baseline.n, above / other.n
    ratio = rate / base_rate if base_rate else (math.inf if rate else 1.0)
    p_value = binomial_upper_tail(above, base_above + above, other.n / (baseline.n + other.n))
    return TailTest(level, -threshold if lower else threshold, baseline.n, base_above, other.n, above, ratio, p_value,
                    alpha, min_ratio, int(baseline.values[-1]), int(other.values[-1]), "lower" if lower else "upper")


@dataclass
class TrendPoint:
    run_id: str
    created: str
    value: float | str | None
    status: str | None
    changes: dict[str, list[str | None]] = field(default_factory=dict)  # column -> [before, after]


@dataclass
class Trend:
    """One configuration's metric run after run: a series per machine (per machine and measurement, when runs
    of one label measured differently: the series name says how)."""

    configuration: str
    metric: str
    machines: dict[str, list[TrendPoint]]
    quantity: Quantity = LATENCY  # what the values are (a class for metric "class")

    def as_dict(self) -> dict[str, Any]:
        return {"configuration": self.configuration, "metric": self.metric, **self.quantity.as_dict(),
                "machines": {machine: [asdict(p) for p in points] for machine, points in self.machines.items()}}


def _strictest_class(row: dict[str, Any], classes: list[Any], margin: float) -> str | None:
    """The strictest class a run's latencies meet ("none"), None: not latencies, or no statistics."""
    from ..stats import Summary
    from .verdicts import judge

    if row.get("max_value") is None or row.get("min_value") is None or not _row_quantity(row).judged:
        return None
    values: dict[str, Any] = {name: math.nan for name in Summary.__dataclass_fields__}
    values |= {"samples": int(row.get("samples") or 0), "dropped": int(row.get("dropped") or 0),
               "max_ns": float(row["max_value"]), "max_jitter_ns": float(row["max_value"]) - float(row["min_value"])}
    met = [v for v in judge(Summary(**values), classes, margin) if v.outcome == "meets"]
    return min(met, key=lambda v: v.latency_budget_ns).requirement if met else "none"


def _row_quantity(row: dict[str, Any]) -> Quantity:
    return quantity_of(row.get("value_field"))


def _series_names(identities: dict[str, dict[str, Any]]) -> dict[str, str]:
    """identity key -> what tells its runs from the label's other identities ('' when the label has one)."""
    if len(identities) < 2:
        return dict.fromkeys(identities, "")
    names = distinguishing(list(identities.values()))
    return {key: name or f"identity {key}" for key, name in zip(identities, names, strict=True)}


def _series(store: RunStore, rows: list[dict[str, Any]]) -> dict[str, str]:
    """:func:`_series_names` of a store's rows (one manifest read per identity, when there are several)."""
    keys = list(dict.fromkeys(str(row["identity"]) for row in rows))
    if len(keys) < 2:
        return dict.fromkeys(keys, "")
    firsts = {key: next(row["run_id"] for row in rows if row["identity"] == key) for key in keys}
    found = {key: store.find_run(run_id) for key, run_id in firsts.items()}
    return _series_names({key: run.identity if run is not None else {} for key, run in found.items()})


def trend(store: RunStore, config: str, metric: str = "max", machine: str | None = None, *,
          classes: list[Any] | None = None, margin: float = 0.5) -> Trend:
    """Every run of ``config`` in ``store`` (oldest first) per machine, each with what changed since the
    machine's previous run of it (CHANGE_COLUMNS); runs of one label that are not comparable (rtvirt.identity)
    are separate series."""
    rows = store.rows(config=config, machine=machine)
    return trend_of(rows, config, metric, classes=classes, margin=margin, series=_series(store, rows))


def trend_of(rows: list[dict[str, Any]], config: str, metric: str = "max", *,
             classes: list[Any] | None = None, margin: float = 0.5, series: dict[str, str] | None = None) -> Trend:
    """:func:`trend` of catalog rows (rtvirt.stores.provenance.run_row) of one configuration, oldest first;
    ``series``: identity -> name of the measurement, when the rows hold several."""
    metric = metric_name(metric)
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: one of {', '.join(METRICS)}")
    machines: dict[str, list[TrendPoint]] = {}
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        measurement = (series or {}).get(str(row.get("identity")), "")
        name = str(row.get("machine") or "unknown") + (f" ({measurement})" if measurement else "")
        value = _strictest_class(row, classes or [], margin) if metric == "class" else row.get(f"{metric}_value")
        point = TrendPoint(str(row["run_id"]), str(row.get("created") or ""), value, row.get("status"))
        before = last.get(name)
        if before is not None:
            point.changes = {column: [before.get(column), row.get(column)] for column in CHANGE_COLUMNS
                             if before.get(column) != row.get(column)}
        last[name] = row
        machines.setdefault(name, []).append(point)
    return Trend(config, metric, machines, _row_quantity(rows[0]) if rows else LATENCY)


def previous_run_row(store: RunStore, row: dict[str, Any]) -> dict[str, Any] | None:
    """The last complete run of the same identity (comparable: same measurement, same setting) on the same
    machine before ``row``."""
    earlier = [r for r in store.rows(identity=row["identity"], machine=row.get("machine"))
               if r["run_id"] != row["run_id"] and r.get("machine") == row.get("machine")
               and r["identity"] == row["identity"]
               and str(r.get("created") or "") <= str(row.get("created") or "")
               and r.get("status") == "complete"]
    return earlier[-1] if earlier else None


def histories(manifests: list[dict[str, Any]]) -> list[Trend]:
    """The report's history: the maxima of each configuration with more than one run on a machine, over time
    (a series per measurement when runs of one label measured differently)."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    identities: dict[str, dict[str, Any]] = {}
    for manifest in sorted(manifests, key=lambda m: (str(m.get("created") or ""), str(m.get("run_id")))):
        row = run_row(manifest)
        if row.get("max_value") is not None:
            by_config.setdefault(configuration(row), []).append(row)
            identities.setdefault(str(row["identity"]), run_identity(manifest))
    found = [trend_of(rows, config, series=_series_names({str(row["identity"]): identities[str(row["identity"])]
                                                          for row in rows}))
             for config, rows in by_config.items()]
    return [t for t in found if any(len(points) > 1 for points in t.machines.values())]
