"""Explanations where they show: the ``explain_parts`` view of ``rtvirt sql``, and the report (HTML rendered by
headless Chromium, Markdown, JSON) carrying the stored numbers: per configuration the causes' shares, the worst
outliers' timelines, the isolation table's "caused by"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from results_data import real_timer_run, synthetic_run
from test_results_report import chromium_console

from rtvirt.explain.attribute import summarize_parts
from rtvirt.explain.model import Explanation, LayerTrace, Occupancy, Part
from rtvirt.explain.stored import read_explanation, write_explanation
from rtvirt.results.catalog import query
from rtvirt.results.report import render, write_report
from rtvirt.results.reportdata import collect
from rtvirt.store import resolve_runs

HOSTILE = "<img src=x onerror=alert(1)>"
STRESSOR = f"task stress-cpu/4242 SCHED_FIFO 99 {HOSTILE}"


def _explain(run_dir: Path, stressor_share: float, top: int = 12) -> Explanation:
    """An explanation of a run's real largest samples as a source would leave it: a FIFO task held each
    window's first ``stressor_share``, a timer IRQ the next 2 us, the rest no layer saw."""
    run = resolve_runs(run_dir)[0]
    assert run.value_field is not None
    batches = list(run.iter_batches(["t_ns", run.value_field, "cpu"]))
    t, values, cpus = (np.concatenate([b.column(i).to_numpy() for b in batches]).astype(np.int64) for i in range(3))
    order = np.argsort(-values, kind="stable")[:top]
    threshold = int(values[order[-1]]) - 1
    parts, occupancies = [], []
    for rank, index in enumerate(order.tolist(), 1):
        start, latency, cpu = int(t[index]), int(values[index]), int(cpus[index])
        held = int(latency * stressor_share)
        irq = min(2_000, latency - held)
        occupancies += [Occupancy("host", start - 30_000, start + held, STRESSOR, "task", cpu,
                                  {"comm": "stress-cpu", "pid": 4242}),
                        Occupancy("host", start + held, start + held + irq, "irq 0 timer", "irq", cpu),
                        Occupancy("host", start - 200_000, start - 150_000, "task kworker/0:1/17 SCHED_OTHER nice 0",
                                  "task", cpu)]
        cuts = [("host", "task", STRESSOR, 0, held), ("host", "irq", "irq 0 timer", held, irq),
                ("unexplained", "unexplained", "unexplained (vm not traced)", held + irq, latency - held - irq)]
        parts += [Part(start, latency, cpu, rank, layer, kind, cause, offset, duration,  # type: ignore[arg-type]
                       json.dumps({"alignment_ns": 1000})) for layer, kind, cause, offset, duration in cuts if duration]
    layers = [LayerTrace("host", True, occupancies=occupancies, alignment_ns=1000, dropped_events=3,
                         notes=["rtvirt runs inside a VM itself: host steal rose by 1.5 ms"]),
              LayerTrace("vm", False, why_not="no VM in this run")]
    totals: dict[str, int] = {}
    for part in parts:
        totals[part.cause] = totals.get(part.cause, 0) + part.duration_ns
    latency_sum = sum({p.rank: p.latency_ns for p in parts}.values())
    summary = [{"layer": next(p.layer for p in parts if p.cause == cause), "cause": cause, "total_ns": total,
                "share": round(total / latency_sum, 6)} for cause, total in sorted(totals.items(), key=lambda x: -x[1])]
    explanation = Explanation(threshold, f"threshold {threshold / 1000:.1f} us (set)", int((values > threshold).sum()),
                              parts, layers, summary)
    write_explanation(run_dir, explanation)
    return explanation


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explained") / "results"
    real_timer_run(root, "1s", config="host/solo")
    rng = np.random.default_rng(3)
    values = rng.integers(15_000, 25_000, 5000)
    values[rng.choice(5000, 40, replace=False)] = rng.integers(300_000, 900_000, 40)
    for repetition in range(2):
        synthetic_run(root, f"stressed {repetition}", values if repetition == 0 else values[::-1].copy(),
                      cpu=np.arange(5000) % 2, config=f"host/stressed {HOSTILE}")
    runs = {r.run_id: r for r in resolve_runs(root)}
    for run in runs.values():
        stressed = run.label.startswith("host/stressed")
        _explain(run.path, 0.9 if stressed else 0.25)
    return root


def _pooled(root: Path, label: str) -> dict[str, float]:
    """Each cause's share of a configuration's explained outlier latency, from the stored parts."""
    totals: dict[str, int] = {}
    latency = 0
    for run in resolve_runs(root):
        if run.label != label:
            continue
        explanation = read_explanation(run.path)
        assert explanation is not None
        latency += sum({p.rank: p.latency_ns for p in explanation.parts}.values())
        for part in explanation.parts:
            totals[part.cause] = totals.get(part.cause, 0) + part.duration_ns
    return {cause: total / latency for cause, total in totals.items()}


def test_report_json_carries_the_stored_numbers(results: Path) -> None:
    document = json.loads(render(collect(results, top=5), "json"))
    runs = {r.run_id: r for r in resolve_runs(results)}
    for configuration in document["configurations"]:
        pooled = _pooled(results, configuration["label"])
        assert {c["cause"]: c["share"] for c in configuration["causes"]} == pytest.approx(pooled, abs=1e-6)
        assert configuration["causes"][0]["cause"] == max(pooled, key=lambda cause: pooled[cause])
        for shown in configuration["runs"]:
            stored = read_explanation(runs[shown["run_id"]].path)
            assert stored is not None
            explanation = shown["explanation"]
            # (pooled by culprit from the parts: this explanation was written with causes only, read as culprits)
            assert explanation["summary"] == summarize_parts(stored.parts)
            assert explanation["threshold_ns"] == stored.threshold_ns
            assert [[p["cause"], p["offset_ns"], p["duration_ns"]] for worst in explanation["worst"]
                    for p in worst["parts"]] == [[p.cause, p.offset_ns, p.duration_ns] for p in stored.parts
                                                 if p.rank <= 5]
            shown_by_cli = run_cli("explain", str(runs[shown["run_id"]].path), "--json", "--top", "5", check=True)
            assert json.loads(shown_by_cli.stdout) == explanation
            assert explanation["explained"] == 12 and explanation["outliers"] == stored.outliers
            assert [layer["layer"] for layer in explanation["layers"]] == ["host", "vm"]
        # the worst outliers' timelines: the configuration's largest explained samples, each with what ran
        worst = sorted((p.latency_ns for r in runs.values() if r.label == configuration["label"]
                        for p in (read_explanation(r.path) or Explanation(0, "", 0, [], [], [])).parts
                        if p.offset_ns == 0), reverse=True)
        timelines = configuration["timelines"]
        assert [t["latency_ns"] for t in timelines] == worst[:3]
        for timeline in timelines:
            causes = {o["cause"] for o in timeline["occupancies"]}
            assert STRESSOR in causes and "irq 0 timer" in causes
            assert all(o["end_ns"] > timeline["from_ns"] and o["start_ns"] < timeline["to_ns"]
                       for o in timeline["occupancies"])
    caused = {row["label"]: row["caused_by"] for row in document["isolation"]}
    stressed = f"host/stressed {HOSTILE}"
    assert caused[stressed] == f"{STRESSOR} ({max(_pooled(results, stressed).values()):.0%})"
    assert caused[stressed].endswith("(90%)")
    isolation = next(t for t in document["tables"] if t["title"].startswith("Isolation"))
    assert isolation["header"][-1] == "caused by" and isolation["rows"][0][-1] == caused[stressed]


def test_markdown_names_the_causes_and_what_was_not_seen(results: Path) -> None:
    markdown = render(collect(results), "markdown")
    assert "## Outlier causes per configuration" in markdown and "## Worst outliers part by part" in markdown
    assert "vm: no VM in this run" in markdown and "host steal rose by 1.5 ms" in markdown
    assert "unexplained (vm not traced)" in markdown


def test_sql_explain_parts_sums_to_the_stored_parts(results: Path) -> None:
    columns, rows = query(results, "SELECT run_id, cause, sum(duration_ns), count(*) FROM explain_parts "
                                   "GROUP BY ALL ORDER BY ALL")
    assert columns[:2] == ["run_id", "cause"]
    expected = []
    for run in resolve_runs(results):
        explanation = read_explanation(run.path)
        assert explanation is not None
        by_cause: dict[str, list[int]] = {}
        for part in explanation.parts:
            entry = by_cause.setdefault(part.cause, [0, 0])
            entry[0] += part.duration_ns
            entry[1] += 1
        expected += [(run.run_id, cause, total, count) for cause, (total, count) in by_cause.items()]
    assert rows == sorted(expected)
    # "which cause dominates the p99.99 across all my runs", as a user would ask it
    result = run_cli("sql", "--results", str(results), "--format", "json",
                     "SELECT cause, sum(duration_ns) AS ns FROM explain_parts WHERE layer != 'unexplained' "
                     "GROUP BY cause ORDER BY ns DESC LIMIT 1", check=True)
    assert json.loads(result.stdout)["rows"][0][0] == STRESSOR


def test_sql_explain_parts_is_empty_without_explanations(tmp_path: Path) -> None:
    synthetic_run(tmp_path / "r", "plain", np.full(100, 20_000))
    columns, rows = query(tmp_path / "r", "SELECT * FROM explain_parts")
    assert rows == [] and columns == ["run_id", "sample_t_ns", "latency_ns", "cpu", "rank", "layer", "kind", "cause",
                                      "culprit", "variant", "offset_ns", "duration_ns", "detail"]


def test_html_shows_the_cause_bars_and_timelines_in_chromium(results: Path, tmp_path: Path) -> None:
    html = write_report(results, tmp_path / "report.html").read_text()
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "share of outlier latency by cause per configuration" in html
    timelines = re.findall(r'<img alt="timeline of outlier', html)
    assert len(timelines) == 3 + 3  # the worst three of each explained configuration
    console = chromium_console(html, tmp_path)
    assert len(console) == 1 and f"IMAGES-OK {html.count('<img ')}" in console[0], console


def test_a_damaged_explanation_is_an_error_naming_it(results: Path, tmp_path: Path) -> None:
    synthetic_run(tmp_path / "r", "plain", np.full(100, 20_000))
    run = resolve_runs(tmp_path / "r")[0]
    (run.path / "explain.parquet").write_bytes(b"not parquet")
    (run.path / "explain.json").write_text(json.dumps({"explain_version": 1}))
    result = run_cli("report", str(tmp_path / "r"), "--format", "json", "--out", str(tmp_path / "x.json"))
    assert result.returncode == 2 and "explain.json" in result.stderr and "Traceback" not in result.stderr


def test_compare_names_what_caused_the_runs_outliers(results: Path) -> None:
    runs = resolve_runs(results)
    base = next(r for r in runs if r.label == "host/solo")
    stressed = next(r for r in runs if r.label != "host/solo")
    shown = run_cli("compare", str(base.path), str(stressed.path), "--json", check=True)
    assert json.loads(shown.stdout)["isolation"]["caused_by"] == f"{STRESSOR} (90%)"
    table = run_cli("compare", str(base.path), str(stressed.path), check=True)
    assert "caused by" in table.stdout and "stress-cpu/4242" in table.stdout
