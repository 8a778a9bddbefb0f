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
    verdicts: list[Verdict]
    causes: list[CauseShare] = field(default_factory=list)  # share of outlier latency by cause, over its runs
    timelines: list[Timeline] = field(default_factory=list)  # its worst explained outliers

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
    baseline: str | None
    isolation: list[IsolationRow]
    classes: list[RequirementClass]
    margin: float
    tasks: list[TaskBounds]
    analysis_runs: list[StoredRun]
    predictions: list[Any] = field(default_factory=list)  # rtvirt.predict.compare.Prediction per configuration
    experiments: list[dict[str, Any]] = field(default_factory=list)  # rtvirt.experiment.report.experiment_section
    history: list[Trend] = field(default_factory=list)  # maxima of configurations run more than once on a machine
    top: int = 10  # outliers shown per run (and explained outliers' parts in the JSON)

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
    if wanted is not None:
        if wanted not in labels:
            raise InputError(f"--baseline {wanted!r}: no configuration of that name (have: {', '.join(labels)})")
        return wanted
    for label in labels:
        if any(word in label.lower() for word in _BASELINE_WORDS):
            return label
    return labels[0] if len(labels) > 1 else None


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
    by_label: dict[str, list[RunView]] = {}
    per_cpu_by_label: dict[str, dict[int, list[Histogram]]] = {}
    for run in runs:
        if run.manifest.get("source") == "analysis":
            continue
        dropped = int(run.manifest.get("dropped") or 0)
        table = run.histogram_table()
        digest = read_digest(run.path, run.run_id)
        per_cpu: dict[int, Histogram] = {}
        if table is None:
            whole = run.histogram()
            if whole is None:
                continue
            summary = summarize_histogram(whole, dropped)
        else:
            per_cpu = _per_cpu(table)
            # the digest's statistics are those of the whole histogram: no merge per run
            summary = digest.groups()["all"] if digest is not None and "all" in digest.document["groups"] \
                else summarize_histogram(Histogram.merged(per_cpu.values()), dropped)
        view = RunView(run, summary, explanation=load_explanation(run.path))
        if run.has_samples and view.summary.samples:
            _over_time(view, digest, window_ns, top)
        by_label.setdefault(run.label, []).append(view)
        for cpu, h in per_cpu.items():
            per_cpu_by_label.setdefault(run.label, {}).setdefault(cpu, []).append(h)
    configurations = []
    for label, views in by_label.items():
        per_cpu = {cpu: Histogram.merged(hs) for cpu, hs in sorted(per_cpu_by_label.get(label, {}).items())}
        pooled = Histogram.merged(per_cpu.values()) if label in per_cpu_by_label else None
        summary = summarize_histogram(pooled, sum(v.summary.dropped for v in views)) if pooled is not None \
            else views[0].summary
        explained = [(view.run.run_id, view.explanation) for view in views if view.explanation is not None]
        configurations.append(Configuration(label, views, pooled, per_cpu, summary, judge(summary, classes, margin),
                                            configuration_causes([e for _, e in explained]),
                                            worst_timelines(explained)))
    chosen = _pick_baseline([c.label for c in configurations], baseline)
    rows: list[IsolationRow] = []
    if chosen is not None:
        base = next(c for c in configurations if c.label == chosen)
        # Simulated response times are not comparable with a measured baseline.
        rows = [isolation_of(c.label, c.summary, base.label, base.summary) for c in configurations
                if c.label != chosen and c.summary.samples and base.summary.samples
                and all(v.run.manifest.get("source") != "simulated" for v in c.runs)]
    analysis_runs = [r for r in runs if r.manifest.get("source") == "analysis"]
    from ..experiment.report import experiment_section  # acceptance curves of experiment runs
    from ..predict.compare import predictions  # bound, simulated and measured of each predicted configuration

    source = str(results) if isinstance(results, Path | str) else results.label
    measured = [r.manifest for r in runs if r.manifest.get("source") != "analysis"]
    return ReportData(source, configurations, chosen, rows, classes, margin, _task_bounds(runs), analysis_runs,
                      predictions(runs), [experiment_section(r) for r in analysis_runs if "experiment" in r.manifest],
                      histories(measured), top)


def as_json(data: ReportData) -> dict[str, Any]:
    """The report's content as plain JSON-able data (``rtvirt report --format json``)."""
    return {
        "results": data.source,
        "baseline": data.baseline,
        "margin": data.margin,
        "configurations": [{
            "label": c.label, "partial": c.partial, "short": c.short, "shortfalls": c.shortfalls,
            "summary": c.summary.as_dict(),
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
