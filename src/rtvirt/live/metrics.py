"""``/metrics``: the live view's numbers in Prometheus' exposition format, through the prometheus-client
library (a custom collector over what the server already follows; every metric and label: docs/live.md).

Per configuration of a campaign that runs (or ended less than ``LINGER_S`` ago), its latest run: a latency
histogram in seconds (buckets from 1 us to 100 ms), samples, overruns, outliers above the threshold, the maximum,
the run's status and time; per campaign, its runs by state and the time left. A running run's numbers come from
its stream as it grows; a finished run's from what it stored (its exact histogram), so the histogram's count is
the samples the run stored once it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    StateSetMetricFamily,
)

from ..store import missed_periods
from .follow import PROMETHEUS_BUCKETS_NS, RunFollower

__all__ = ["RunMetrics", "CampaignMetrics", "LiveCollector", "stored_metrics", "followed_metrics", "RUN_LABELS",
           "RUN_STATES", "LINGER_S"]

RUN_LABELS = ("machine", "environment", "configuration")
CAMPAIGN_LABELS = ("machine", "campaign", "scenario")
RUN_STATES = ("running", "complete", "partial", "failed", "interrupted")
LINGER_S = 600.0  # a finished campaign's last numbers stay this long (a scrape or two after its end)


@dataclass
class RunMetrics:
    labels: tuple[str, str, str]  # RUN_LABELS
    status: str
    timed: bool  # values are durations in ns: histogram, maximum and threshold apply
    samples: int
    sum_ns: int
    buckets: np.ndarray  # samples per Prometheus bucket, not cumulative; the last one above the last bound
    max_ns: int | None
    outliers: int
    overruns: int
    threshold_ns: int
    elapsed_s: float
    planned_s: float


@dataclass
class CampaignMetrics:
    labels: tuple[str, str, str]  # CAMPAIGN_LABELS
    done: int
    failed: int
    running: int
    left: int
    seconds_left: float


def followed_metrics(labels: tuple[str, str, str], follower: RunFollower, planned_s: float) -> RunMetrics:
    return RunMetrics(labels, "running", follower.timed, follower.samples, follower.sum_ns,
                      follower.prometheus_counts.copy(), follower.max_ns, follower.outliers, follower.overruns,
                      follower.threshold_ns, follower.elapsed_s(), planned_s)


def stored_metrics(labels: tuple[str, str, str], manifest: dict[str, Any], histogram: Any, threshold_ns: int,
                   planned_s: float) -> RunMetrics:
    """A finished run's metrics from its manifest and exact histogram (rtvirt.stats.Histogram, or None)."""
    buckets = np.zeros(len(PROMETHEUS_BUCKETS_NS) + 1, np.int64)
    samples = total = outliers = 0
    top = None
    if histogram is not None and histogram.n:
        values, counts = histogram.values.astype(np.int64), histogram.counts.astype(np.int64)
        buckets += np.bincount(np.searchsorted(PROMETHEUS_BUCKETS_NS, values, side="left"), weights=counts,
                               minlength=buckets.size).astype(np.int64)
        samples, total, top = int(counts.sum()), int((values * counts).sum()), int(values[-1])
        outliers = int(counts[values > threshold_ns].sum())
    return RunMetrics(labels, str(manifest.get("status") or "failed"), str(manifest.get("value_field") or "")
                      .endswith("_ns"), samples, total, buckets, top, outliers, missed_periods(manifest), threshold_ns,
                      planned_s, planned_s)


class LiveCollector:
    """Collects from ``source()``: (run metrics, campaign metrics) as they are at the scrape."""

    def __init__(self, source: Callable[[], tuple[list[RunMetrics], list[CampaignMetrics]]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # nothing at registration: the metrics exist only while campaigns run

    def collect(self) -> Iterator[Metric]:
        runs, campaigns = self._source()
        yield from self._run_families(runs)
        yield from self._campaign_families(campaigns)

    @staticmethod
    def _run_families(runs: list[RunMetrics]) -> Iterator[Metric]:
        latency = HistogramMetricFamily("rtvirt_latency_seconds", "The latest run's sample values (wake-up "
                                        "latency for the timer probe; the probe's value_field), per configuration",
                                        labels=RUN_LABELS)
        samples = CounterMetricFamily("rtvirt_samples", "Samples the latest run of the configuration took so far",
                                      labels=RUN_LABELS)
        overruns = CounterMetricFamily("rtvirt_overruns", "Periods that passed without a sample (inferred from the "
                                       "samples' times while running, the agent's own count once it ended)",
                                       labels=RUN_LABELS)
        outliers = CounterMetricFamily("rtvirt_outliers", "Samples above rtvirt_outlier_threshold_seconds",
                                       labels=RUN_LABELS)
        threshold = GaugeMetricFamily("rtvirt_outlier_threshold_seconds", "The threshold outliers are counted above",
                                      labels=RUN_LABELS)
        maximum = GaugeMetricFamily("rtvirt_latency_max_seconds", "The largest sample value so far",
                                    labels=RUN_LABELS)
        elapsed = GaugeMetricFamily("rtvirt_run_elapsed_seconds", "Measured time of the latest run so far (its "
                                    "planned duration once it ended)",
                                    labels=RUN_LABELS)
        planned = GaugeMetricFamily("rtvirt_run_planned_seconds", "The run's planned duration", labels=RUN_LABELS)
        status = StateSetMetricFamily("rtvirt_run_status", "The latest run's status", labels=RUN_LABELS)
        for run in runs:
            labels = list(run.labels)
            samples.add_metric(labels, run.samples)
            overruns.add_metric(labels, run.overruns)
            elapsed.add_metric(labels, run.elapsed_s)
            planned.add_metric(labels, run.planned_s)
            status.add_metric(labels, {state: state == run.status  # a status of a newer campaign shows as itself
                                       for state in dict.fromkeys((*RUN_STATES, run.status))})
            if not run.timed:
                continue
            cumulative = np.cumsum(run.buckets)
            bounds = [f"{bound / 1e9:g}" for bound in PROMETHEUS_BUCKETS_NS] + ["+Inf"]
            latency.add_metric(labels, list(zip(bounds, (float(c) for c in cumulative), strict=True)),
                               sum_value=run.sum_ns / 1e9)
            outliers.add_metric(labels, run.outliers)
            threshold.add_metric(labels, run.threshold_ns / 1e9)
            if run.max_ns is not None:
                maximum.add_metric(labels, run.max_ns / 1e9)
        yield from (latency, samples, overruns, outliers, threshold, maximum, elapsed, planned, status)

    @staticmethod
    def _campaign_families(campaigns: list[CampaignMetrics]) -> Iterator[Metric]:
        runs = GaugeMetricFamily("rtvirt_campaign_runs", "A campaign's planned runs by state (done counts failed "
                                 "ones too)", labels=[*CAMPAIGN_LABELS, "state"])
        left = GaugeMetricFamily("rtvirt_campaign_remaining_seconds", "Planned measuring time left in the campaign",
                                 labels=CAMPAIGN_LABELS)
        for campaign in campaigns:
            for state, count in (("done", campaign.done), ("failed", campaign.failed),
                                 ("running", campaign.running), ("left", campaign.left)):
                runs.add_metric([*campaign.labels, state], count)
            left.add_metric(list(campaign.labels), campaign.seconds_left)
        yield from (runs, left)
