"""Everything the report shows, computed once from a results directory (renderers only format it)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..digest import Digest, read_digest
from ..errors import InputError
from ..explain.model import Explanation
from ..identity import distinguishing, measurement_differences
from ..quantity import Quantity
from ..stats import Histogram, Summary, summarize_histogram
from ..store import StoredRun, resolve_runs
from ..stores import RunStore
from ..timeprofile.levels import Ramp, Segment, Switch, detect_ramp, event_offsets, segments_of, transitions
from ..timeprofile.windows import TOP_KEPT, TimeProfile
from .explained import (
    CauseShare,
    Timeline,
    caused_by,
    configuration_causes,
    explanation_json,
    load_explanation,
    worst_timelines,
)
from .history import Trend, histories
from .isolation import IsolationRow, Outlier, isolation_of, outlier_rows
from .verdicts import DEFAULT_MARGIN, RequirementClass, Verdict, judge, load_classes
from .windows import run_pass, time_range

__all__ = ["ReportData", "Configuration", "RunView", "TaskBounds", "collect", "as_json"]

_BASELINE_WORDS = ("baseline", "solo", "bare", "native")


@dataclass
class RunView:
    run: StoredRun
    summary: Summary
    profile: TimeProfile | None = None
    ramp: Ramp | None = None
    segments: list[Segment] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    outliers: list[Outlier] = field(default_factory=list)
    # (t from the first sample, value) of every k-th sample and of the largest ones, for plots
    series: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
    explanation: Explanation | None = None  # its outliers' causes, when it was explained (docs/explain.md)


@dataclass
class Configuration:
    label: str
    runs: list[RunView]
    histogram: Histogram | None
    per_cpu: dict[int, Histogram]
    summary: Summary
    verdicts: list[Verdict]  # none when its values are not latencies (rtvirt.quantity)
    causes: list[CauseShare] = field(default_factory=list)  # share of outlier latency by cause, over its runs
    timelines: list[Timeline] = field(default_factory=list)  # its worst explained outliers

    @property
    def quantity(self) -> Quantity:
        """What its values are (its runs share one measurement: rtvirt.identity)."""
        return self.runs[0].run.quantity

    @property
    def identity(self) -> dict[str, Any]:
        return self.runs[0].run.identity

    @property
    def partial(self) -> bool:
        return any(view.run.partial for view in self.runs)

    @property
    def short(self) -> bool:
        """Some run ran to its end with far fewer samples than promised (the shortfalls say which, and why)."""
        return any(view.run.short for view in self.runs)

    @property
    def shortfalls(self) -> list[str]:
        """Runs that took far fewer samples than their duration and period promise, each with why (the
        manifest's ``expectation``, docs/results-store.md)."""
        found = []
        for view in self.runs:
            expectation = view.run.manifest.get("expectation") or {}
            if expectation.get("why"):
                found.append(f"{view.run.run_id}: {expectation.get('taken')} of {expectation.get('expected')} "
                             f"samples expected: {str(expectation['why'])[:300]}")
        return found


@dataclass
class TaskBounds:
    vm: str
    task: str
    bound_ns: float | None = None
    deadline_ns: float | None = None
    schedulable: bool | None = None
    simulated_max_ns: float | None = None
    measured_max_ns: float | None = None


@dataclass
class ReportData:
    source: str
    configurations: list[Configuration]
    baselines: list[str]  # one per measurement: isolation compares each configuration with its measurement's
    isolation: list[IsolationRow]
    classes: list[RequirementClass]
    margin: float
    tasks: list[TaskBounds]
    analysis_runs: list[StoredRun]
    predictions: list[Any] = field(default_factory=list)  # rtvirt.predict.compare.Prediction per configuration
    experiments: list[dict[str, Any]] = field(default_factory=list)  # rtvirt.experiment.report.experiment_section
    history: list[Trend] = field(default_factory=list)  # maxima of configurations run more than once on a machine
    top: int = 10  # outliers shown per run (and explained outliers' parts in the JSON)

    @property
    def baseline(self) -> str | None:
        """The first measurement's baseline (the only one when every configuration measures the same)."""
        return self.baselines[0] if self.baselines else None

    def caused_by(self, label: str) -> str:
        """What caused most of a configuration's outlier latency ("-": not explained)."""
        return caused_by(next((c.causes for c in self.configurations if c.label == label), []))


def _per_cpu(table: Any) -> dict[int, Histogram]:
    """A stored histogram table's rows per CPU (as stored: per kind, so a value may repeat; merging sums them)."""
    cpus = table["cpu"].to_numpy()
    values, counts = table["value"].to_numpy(), table["count"].to_numpy()
    if cpus.size and cpus.min() == cpus.max():
        return {int(cpus[0]): Histogram(values, counts)}
    return {int(cpu): Histogram(values[cpus == cpu], counts[cpus == cpu]) for cpu in np.unique(cpus).tolist()}


def _pick_baseline(labels: list[str], wanted: str | None) -> str | None:
    """The baseline among configurations of one measurement: ``wanted`` when it is one of them, else the one
    whose label says so (solo, baseline, bare, native), else the first (None: nothing to compare it with)."""
    if wanted is not None and wanted in labels:
        return wanted
    for label in labels:
        if any(word in label.lower() for word in _BASELINE_WORDS):
            return label
    return labels[0] if len(labels) > 1 else None


def _comparable(a: Configuration, b: Configuration) -> bool:
    return not measurement_differences(a.identity, b.identity)


def _isolation(configurations: list[Configuration], wanted: str | None) -> tuple[list[str], list[IsolationRow]]:
    """Baselines and isolation rows: each configuration against the baseline of its own measurement (same probe,
    workload and parameters, so the same unit); simulated response times are not compared with measurements."""
    if wanted is not None and wanted not in [c.label for c in configurations]:
        raise InputError(f"--baseline {wanted!r}: no configuration of that name (have: "
                         f"{', '.join(c.label for c in configurations)})")
    measured = [c for c in configurations if c.summary.samples
                and all(v.run.manifest.get("source") != "simulated" for v in c.runs)]
    groups: list[list[Configuration]] = []
    for c in measured:
        group = next((g for g in groups if _comparable(g[0], c)), None)
        if group is None:
            groups.append([c])
        else:
            group.append(c)
    baselines, rows = [], []
    for group in groups:
        chosen = _pick_baseline([c.label for c in group], wanted)
        if chosen is None:
            continue
        baselines.append(chosen)
        base = next(c for c in group if c.label == chosen)
        rows += [isolation_of(c.label, c.summary, base.label, base.summary, c.quantity) for c in group if c is not base]
    return baselines, rows


def _by_measurement(runs: list[StoredRun]) -> dict[str, list[StoredRun]]:
    """Runs by configuration label; a label whose runs measured differently (two `rtvirt probe timer` runs, one
    thread on CPU 1 and two on CPUs 0-1) becomes one configuration per measurement, named by what differs."""
    by_label: dict[str, list[list[StoredRun]]] = {}
    for run in runs:
        kinds = by_label.setdefault(run.label, [])
        same = next((kind for kind in kinds if not measurement_differences(kind[0].identity, run.identity)), None)
        if same is None:
            kinds.append([run])
        else:
            same.append(run)
    labelled: dict[str, list[StoredRun]] = {}
    for label, kinds in by_label.items():
        if len(kinds) == 1:
            labelled[label] = kinds[0]
            continue
        for kind, suffix in zip(kinds, distinguishing([kind[0].identity for kind in kinds]), strict=True):
            labelled[f"{label} ({suffix or kind[0].quantity.title})"] = kind
    return labelled


def _task_bounds(runs: list[StoredRun]) -> list[TaskBounds]:
    # a campaign's predictions are shown per configuration (rtvirt.predict), not merged here by task name
    runs = [r for r in runs if not (r.manifest.get("predict") or (r.manifest.get("analysis") or {}).get("predict"))]
    tasks: dict[str, TaskBounds] = {}
    for run in runs:
        for task in ((run.manifest.get("analysis") or {}).get("tasks") or []):
            entry = tasks.setdefault(str(task["task"]), TaskBounds(str(task.get("vm", "")), str(task["task"])))
            entry.bound_ns, entry.deadline_ns = task.get("wcrt_bound_ns"), task.get("deadline_ns")
            entry.schedulable = task.get("schedulable")
    for run in runs:
        source = run.manifest.get("source")
        if source not in ("simulated", "measured"):
            continue
        for group, summary in (run.manifest.get("summary") or {}).items():
            if group in tasks and summary.get("max_ns") is not None:
                attribute = "simulated_max_ns" if source == "simulated" else "measured_max_ns"
                current = getattr(tasks[group], attribute)
                setattr(tasks[group], attribute, max(current or 0.0, float(summary["max_ns"])))
    return list(tasks.values())


def _over_time(view: RunView, digest: Digest | None, window_ns: int | None, top: int) -> None:
    """Time profile, ramp, transitions, outliers and plot series of a run with samples: from the digest stored
    with it, else (older runs, another window) from one pass over its samples."""
    run = view.run
    timeline = run.manifest.get("timeline") or []
    if digest is not None and digest.has_profile and window_ns in (None, digest.window_ns) and top <= TOP_KEPT:
        view.profile, largest, segments = digest.over_time()
        events = event_offsets(view.profile.first_ns, timeline)
        thinned: Callable[[], tuple[np.ndarray, np.ndarray]] = digest.series
    else:
        first_last = time_range(run)
        events = event_offsets(first_last[0], timeline)
        result = run_pass(run, window_ns, [t for t, _ in events], first_last)
        view.profile = result.profile
        segments = segments_of(events, result.profile.duration_ns, result.between_cuts) if events else []
        largest = [(int(t), int(v), int(c)) for t, v, c in zip(result.top_t, result.top_values, result.top_cpu,
                                                              strict=True)]

        def thinned() -> tuple[np.ndarray, np.ndarray]:
            return result.series_t, result.series_values

    def series() -> tuple[np.ndarray, np.ndarray]:
        # the largest samples join the thinned series, so no spike is thinned away
        t, values = thinned()
        t = np.concatenate([t, np.array([row[0] for row in largest], np.int64)])
        values = np.concatenate([values, np.array([row[1] for row in largest], np.int64)])
        order = np.argsort(t, kind="stable")
        return t[order], values[order]

    view.ramp = detect_ramp(view.profile)
    if timeline:
        view.segments, view.switches = segments, transitions(view.profile, events, segments)
    view.outliers = outlier_rows(run, largest[:top], view.summary.median_ns)
    view.series = series


def _run_view(run: StoredRun, window_ns: int | None, top: int) -> tuple[RunView, dict[int, Histogram]] | None:
    """A run as the report shows it, with its histogram per CPU (None: a run without values)."""
    dropped = int(run.manifest.get("dropped") or 0)
    table = run.histogram_table()
    digest = read_digest(run.path, run.run_id)
    per_cpu: dict[int, Histogram] = {}
    if table is None:
        whole = run.histogram()
        if whole is None:
            return None
        summary = summarize_histogram(whole, dropped)
    else:
        per_cpu = _per_cpu(table)
        # the digest's statistics are those of the whole histogram: no merge per run
        summary = digest.groups()["all"] if digest is not None and "all" in digest.document["groups"] \
            else summarize_histogram(Histogram.merged(per_cpu.values()), dropped)
    view = RunView(run, summary, explanation=load_explanation(run.path))
    if run.has_samples and view.summary.samples:
        _over_time(view, digest, window_ns, top)
    return view, per_cpu


def _configuration(label: str, found: list[tuple[RunView, dict[int, Histogram]]], classes: list[RequirementClass],
                   margin: float) -> Configuration:
    """One configuration: its runs pooled (histograms per CPU merged), judged when its values are latencies."""
    views = [view for view, _ in found]
    per_cpu_runs: dict[int, list[Histogram]] = {}
    for _, per_cpu in found:
        for cpu, h in per_cpu.items():
            per_cpu_runs.setdefault(cpu, []).append(h)
    merged = {cpu: Histogram.merged(hs) for cpu, hs in sorted(per_cpu_runs.items())}
    pooled = Histogram.merged(merged.values()) if merged else None
    summary = summarize_histogram(pooled, sum(v.summary.dropped for v in views)) if pooled is not None \
        else views[0].summary
    explained = [(view.run.run_id, view.explanation) for view in views if view.explanation is not None]
    return Configuration(label, views, pooled, merged, summary,
                         judge(summary, classes, margin, views[0].run.quantity),
                         configuration_causes([e for _, e in explained]), worst_timelines(explained))


def collect(results: Path | RunStore, *, baseline: str | None = None, classes_file: Path | None = None,
            margin: float = DEFAULT_MARGIN, top: int = 10, window_ns: int | None = None,
            run_ids: Collection[str] | None = None) -> ReportData:
    """Gather what the report shows of a results directory (or run) or a store; ``run_ids`` limits it to those
    runs (e.g. one campaign's)."""
    # a store lists its failed runs too (for the catalog); like resolve_runs, the report shows the others
    runs = resolve_runs(results) if isinstance(results, Path | str) else \
        [run for run in results.list_runs() if not run.failed]
    if run_ids is not None:
        runs = [run for run in runs if run.manifest.get("run_id") in run_ids]
    classes = load_classes(classes_file)
    configurations = []
    for label, labelled in _by_measurement([r for r in runs if r.manifest.get("source") != "analysis"]).items():
        found = [view for view in (_run_view(run, window_ns, top) for run in labelled) if view is not None]
        if found:
            configurations.append(_configuration(label, found, classes, margin))
    baselines, rows = _isolation(configurations, baseline)
    analysis_runs = [r for r in runs if r.manifest.get("source") == "analysis"]
    from ..experiment.report import experiment_section  # acceptance curves of experiment runs
    from ..predict.compare import predictions  # bound, simulated and measured of each predicted configuration

    source = str(results) if isinstance(results, Path | str) else results.label
    measured = [r.manifest for r in runs if r.manifest.get("source") != "analysis"]
    return ReportData(source, configurations, baselines, rows, classes, margin, _task_bounds(runs), analysis_runs,
                      predictions(runs), [experiment_section(r) for r in analysis_runs if "experiment" in r.manifest],
                      histories(measured), top)


def as_json(data: ReportData) -> dict[str, Any]:
    """The report's content as plain JSON-able data (``rtvirt report --format json``)."""
    return {
        "results": data.source,
        "baseline": data.baseline,
        "baselines": data.baselines,
        "margin": data.margin,
        "configurations": [{
            "label": c.label, **c.quantity.as_dict(), "partial": c.partial, "short": c.short,
            "shortfalls": c.shortfalls, "summary": c.summary.as_dict(), "judged": c.quantity.judged,
            "verdicts": [asdict(v) for v in c.verdicts],
            "causes": [asdict(share) for share in c.causes],
            "timelines": [timeline.as_dict() for timeline in c.timelines],
            "runs": [{
                "run_id": v.run.run_id, "name": v.run.manifest.get("name"), "source": v.run.manifest.get("source"),
                "status": v.run.manifest.get("status"), "summary": v.summary.as_dict(),
                "expectation": v.run.manifest.get("expectation"), "delivery": v.run.manifest.get("delivery"),
                "system": v.run.manifest.get("system") or {},
                "ramp": asdict(v.ramp) if v.ramp else None,
                "segments": [asdict(s) for s in v.segments], "switches": [asdict(s) for s in v.switches],
                "outliers": [asdict(o) for o in v.outliers],
                "window_ns": v.profile.window_ns if v.profile else None,
                "window_maxima": [asdict(w) for w in v.profile.windows] if v.profile else [],
                "marks": [{"end_ns": end, **s.as_dict()} for end, s in v.profile.marks] if v.profile else [],
                "explanation": explanation_json(v.run, v.explanation, data.top) if v.explanation else None,
            } for v in c.runs],
        } for c in data.configurations],
        "isolation": [{**asdict(r), "caused_by": data.caused_by(r.label)} for r in data.isolation],
        "tasks": [asdict(t) for t in data.tasks],
        "predictions": [p.as_dict() for p in data.predictions],
        "experiments": data.experiments,
        "history": [t.as_dict() for t in data.history],
    }
