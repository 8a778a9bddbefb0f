"""Everything the report shows, computed once from a results directory (renderers only format it)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..stats import Histogram, Summary, summarize_histogram
from ..store import StoredRun, resolve_runs
from .isolation import IsolationRow, Outlier, isolation_of, outliers
from .levels import Ramp, Segment, Switch, detect_ramp, transitions
from .verdicts import DEFAULT_MARGIN, RequirementClass, Verdict, judge, load_classes
from .windows import TimeProfile, time_profile

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


@dataclass
class Configuration:
    label: str
    runs: list[RunView]
    histogram: Histogram | None
    per_cpu: dict[int, Histogram]
    summary: Summary
    verdicts: list[Verdict]

    @property
    def partial(self) -> bool:
        return any(view.run.partial for view in self.runs)


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


def _histograms(run: StoredRun) -> tuple[Histogram | None, dict[int, Histogram]]:
    table = run.histogram_table()
    if table is None:
        whole = run.histogram()
        return whole, {}
    per_cpu = {}
    cpus = table["cpu"].to_numpy()
    values, counts = table["value"].to_numpy(), table["count"].to_numpy()
    for cpu in sorted(set(cpus.tolist())):
        mask = cpus == cpu
        per_cpu[int(cpu)] = Histogram.merged([Histogram(values[mask], counts[mask])])
    return Histogram.merged(per_cpu.values()), per_cpu


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


def collect(results: Path, *, baseline: str | None = None, classes_file: Path | None = None,
            margin: float = DEFAULT_MARGIN, top: int = 10, window_ns: int | None = None,
            run_ids: Collection[str] | None = None) -> ReportData:
    """Gather what the report shows; ``run_ids`` limits it to those runs (e.g. one campaign's)."""
    runs = resolve_runs(results)
    if run_ids is not None:
        runs = [run for run in runs if run.manifest.get("run_id") in run_ids]
    classes = load_classes(classes_file)
    by_label: dict[str, list[RunView]] = {}
    per_cpu_by_label: dict[str, dict[int, list[Histogram]]] = {}
    for run in runs:
        if run.manifest.get("source") == "analysis":
            continue
        whole, per_cpu = _histograms(run)
        if whole is None:
            continue
        view = RunView(run, summarize_histogram(whole, int(run.manifest.get("dropped") or 0)))
        if run.has_samples and view.summary.samples:
            view.profile = time_profile(run, window_ns)
            view.ramp = detect_ramp(view.profile)
            if run.manifest.get("timeline"):
                view.segments, view.switches = transitions(run, view.profile, run.manifest["timeline"])
            view.outliers = outliers(run, top, view.summary.median_ns)
        by_label.setdefault(run.label, []).append(view)
        for cpu, h in per_cpu.items():
            per_cpu_by_label.setdefault(run.label, {}).setdefault(cpu, []).append(h)
    configurations = []
    for label, views in by_label.items():
        pooled = Histogram.merged([h for hs in per_cpu_by_label.get(label, {}).values() for h in hs]) \
            if label in per_cpu_by_label else None
        summary = summarize_histogram(pooled, sum(v.summary.dropped for v in views)) if pooled is not None \
            else views[0].summary
        per_cpu = {cpu: Histogram.merged(hs) for cpu, hs in sorted(per_cpu_by_label.get(label, {}).items())}
        configurations.append(Configuration(label, views, pooled, per_cpu, summary, judge(summary, classes, margin)))
    chosen = _pick_baseline([c.label for c in configurations], baseline)
    rows: list[IsolationRow] = []
    if chosen is not None:
        base = next(c for c in configurations if c.label == chosen)
        # Simulated response times are not comparable with a measured baseline.
        rows = [isolation_of(c.label, c.summary, base.label, base.summary) for c in configurations
                if c.label != chosen and c.summary.samples and base.summary.samples
                and all(v.run.manifest.get("source") != "simulated" for v in c.runs)]
    analysis_runs = [r for r in runs if r.manifest.get("source") == "analysis"]
    from ..predict.compare import predictions  # bound, simulated and measured of each predicted configuration

    return ReportData(str(results), configurations, chosen, rows, classes, margin, _task_bounds(runs), analysis_runs,
                      predictions(runs))


def as_json(data: ReportData) -> dict[str, Any]:
    """The report's content as plain JSON-able data (``rtvirt report --format json``)."""
    return {
        "results": data.source,
        "baseline": data.baseline,
        "margin": data.margin,
        "configurations": [{
            "label": c.label, "partial": c.partial, "summary": c.summary.as_dict(),
            "verdicts": [asdict(v) for v in c.verdicts],
            "runs": [{
                "run_id": v.run.run_id, "name": v.run.manifest.get("name"), "source": v.run.manifest.get("source"),
                "status": v.run.manifest.get("status"), "summary": v.summary.as_dict(),
                "system": v.run.manifest.get("system") or {},
                "ramp": asdict(v.ramp) if v.ramp else None,
                "segments": [asdict(s) for s in v.segments], "switches": [asdict(s) for s in v.switches],
                "outliers": [asdict(o) for o in v.outliers],
                "window_ns": v.profile.window_ns if v.profile else None,
                "window_maxima": [asdict(w) for w in v.profile.windows] if v.profile else [],
                "marks": [{"end_ns": end, **s.as_dict()} for end, s in v.profile.marks] if v.profile else [],
            } for v in c.runs],
        } for c in data.configurations],
        "isolation": [asdict(r) for r in data.isolation],
        "tasks": [asdict(t) for t in data.tasks],
        "predictions": [p.as_dict() for p in data.predictions],
    }
