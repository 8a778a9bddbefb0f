"""The report: content computed right (isolation, ramp, transitions, verdicts, bounds), strings escaped,
and the HTML rendered by real headless Chromium without console errors and with visible figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from html import escape
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from matplotlib import image
from results_data import SEC, real_timer_run, samples_table, synthetic_run

from rtvirt.results.report import render, write_report
from rtvirt.results.reportdata import collect
from rtvirt.results.verdicts import judge, load_classes
from rtvirt.stats import summarize
from rtvirt.store import new_run, write_run

CHROMIUM = "/usr/bin/chromium"
HOSTILE = "<script>alert('x')</script>"
N = 20_000  # synthetic samples, 1 ms apart: a 20 s run


def _disturbed_values(rng: np.random.Generator) -> np.ndarray:
    """Level 20 us; the first 10 % 35 % low (start-up ramp); 30 us while a stressor runs (40 %-70 %),
    with a 1 s dip to 12 us as it starts."""
    level = np.full(N, 20_000)
    level[: N // 10] = 13_000
    level[int(N * 0.4): int(N * 0.7)] = 30_000
    level[int(N * 0.4): int(N * 0.4) + 1000] = 12_000  # a dip at the switch
    return level + rng.integers(-500, 500, N)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "results"
    rng = np.random.default_rng(5)
    real_timer_run(root, "1s", config="host/solo", system={"governor": "performance", "warnings": []})
    timeline = [{"t_ns": 10 * SEC + int(N * 0.4) * 1_000_000, "event": "stress on"},
                {"t_ns": 10 * SEC + int(N * 0.7) * 1_000_000, "event": "stress off"}]
    synthetic_run(root, f"disturbed {HOSTILE}", _disturbed_values(rng), config=f"vm/disturbed {HOSTILE}",
                  timeline=timeline, system={"smt": "on", "warnings": [f"SMT is on <b>{HOSTILE}</b>"]})
    synthetic_run(root, "cut", rng.integers(20_000, 40_000, 3000), config="vm/cut", status="partial")
    # The same task seen by analysis, simulation and measurement.
    write_run(new_run(root, "analysis"), None, {"name": "rta", "source": "analysis", "analysis": {"tasks": [
        {"vm": "vm1", "task": "ctl", "wcrt_bound_ns": 900_000, "deadline_ns": 1_000_000, "schedulable": True}]}})
    simulated = rng.integers(100_000, 700_000, 500)
    write_run(new_run(root, "sim"), samples_table(np.arange(500) * 1000, simulated, kinds=["ctl"] * 500,
                                                 value_field="response_ns"),
              {"name": "sim", "source": "simulated", "value_field": "response_ns", "config": "sim"})
    measured = rng.integers(100_000, 600_000, 400)
    write_run(new_run(root, "app"), samples_table(np.arange(400) * 1000, measured, kinds=["ctl"] * 400),
              {"name": "app", "source": "measured", "value_field": "latency_ns", "config": "vm/app"})
    # A run that produced no samples at all still shows up (as such) without breaking the report.
    write_run(new_run(root, "empty"), samples_table(np.empty(0), np.empty(0, np.int64)),
              {"name": "empty", "source": "measured", "value_field": "latency_ns", "config": "vm/empty"})
    return root


def test_report_content(results: Path) -> None:
    data = collect(results)
    labels = {c.label: c for c in data.configurations}
    assert data.baseline == "host/solo"
    disturbed = labels[f"vm/disturbed {HOSTILE}"]
    values = _disturbed_values(np.random.default_rng(5))  # same generator order as the fixture
    row = next(r for r in data.isolation if r.label == disturbed.label)
    base = labels["host/solo"].summary
    assert row.median_increase_pct == pytest.approx((np.median(values) - base.median_ns) / base.median_ns * 100)
    assert row.wcet_ns == values.max() and row.baseline_wcet_ns == base.max_ns
    view = disturbed.runs[0]
    assert view.ramp is not None and view.ramp.first_deviation_pct == pytest.approx(-35, abs=3)
    assert view.ramp.end_ns == pytest.approx(2 * SEC, rel=0.1)
    levels = [s.median_ns for s in view.segments]
    assert levels[1] == pytest.approx(30_000, rel=0.02) and levels[2] == pytest.approx(20_000, rel=0.02)
    assert [s.event for s in view.switches] == ["stress on", "stress off"]
    assert view.switches[0].overshoot_pct < -10  # the dip below the old level
    assert view.switches[0].level_after == pytest.approx(30_000, rel=0.02)
    assert abs(view.switches[1].overshoot_pct) < 3  # a clean step back
    assert labels["vm/cut"].partial
    assert labels["vm/empty"].summary.samples == 0 and labels["vm/empty"].runs[0].profile is None
    task = next(t for t in data.tasks if t.task == "ctl")
    assert task.bound_ns == 900_000
    assert task.simulated_max_ns is not None and task.simulated_max_ns <= 700_000
    assert task.measured_max_ns is not None and task.measured_max_ns <= 600_000
    assert view.outliers[0].value_ns == values.max()


def test_verdicts_follow_the_margin() -> None:
    classes = {c.name: c for c in load_classes()}
    summary = summarize(np.array([10_000, 20_000, 300_000]))  # worst 300 us, jitter 290 us
    outcome = {v.requirement: v.outcome for v in judge(summary, list(classes.values()), margin=0.5)}
    assert outcome["motion control"] == "fails"  # 1 us jitter
    assert outcome["factory automation"] == "fails"  # 100 us jitter: 290 > 50
    assert outcome["process monitoring"] == "meets"
    assert outcome["PLC with fast sensors"] == "partly"  # only the loose end (10 ms / 1 ms)
    loose = {v.requirement: v.outcome for v in judge(summary, list(classes.values()), margin=0.0)}
    assert loose["high-voltage distribution"] == "meets"


# headless, offline, no first-run or background work (tests/live_page.py keeps a page open with these too)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def _chromium(url: str, screenshot: Path) -> str:
    with tempfile.TemporaryDirectory() as profile:  # also its TMPDIR: Chromium's own temporary directories go with it
        result = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                                 "--v=0", "--window-size=1280,2400", f"--screenshot={screenshot}", url],
                                capture_output=True, text=True, timeout=90, env={**os.environ, "TMPDIR": profile})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr


def chromium_console(html: str, tmp_path: Path) -> list[str]:
    """The console lines of Chromium rendering a copy of ``html`` with a probe that reports each image the
    browser could not decode (``IMAGE-BROKEN alt``) and then ``IMAGES-OK <count>``; screenshot in shot.png."""
    probe = ("<script>window.addEventListener('load',()=>{for(const i of document.images){"
             "if(!i.complete||i.naturalWidth===0)console.error('IMAGE-BROKEN '+i.alt)}"
             "console.log('IMAGES-OK '+document.images.length)})</script></body>")
    checked = tmp_path / "checked.html"
    checked.write_text(html.replace("</body>", probe))
    log = _chromium(checked.as_uri(), tmp_path / "shot.png")
    return [line for line in log.splitlines() if "CONSOLE" in line]


def test_html_renders_in_chromium(results: Path, tmp_path: Path) -> None:
    out = write_report(results, tmp_path / "report.html")
    html = out.read_text()
    assert HOSTILE not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    # offline: no links out (a URL scheme's "://" cannot occur in the embedded base64 images, "http" can)
    assert "(partial)" in html and "://" not in html
    images = len(re.findall(r"<img ", html))
    assert images >= 4 + 2 * 5  # box/violin, CDF, histograms; time series + window maxima per configuration
    console = chromium_console(html, tmp_path)
    assert console == [next(line for line in console if "IMAGES-OK" in line)], console
    assert f"IMAGES-OK {images}" in console[0]
    pixels = image.imread(tmp_path / "shot.png")
    assert pixels.shape[0] == 2400 and float(pixels[..., :3].std()) > 0.05  # not blank


def test_markdown_and_json(results: Path) -> None:
    data = collect(results)
    markdown = render(data, "markdown")
    assert "| host/solo |" in markdown and "Isolation against the baseline host/solo" in markdown
    document = json.loads(render(data, "json"))
    assert {c["label"] for c in document["configurations"]} >= {"host/solo", "vm/cut", "sim"}
    assert document["tasks"][0]["task"] == "ctl" and document["isolation"]


def test_report_cli(results: Path, tmp_path: Path) -> None:
    result = run_cli("report", str(results), "--out", str(tmp_path / "r.md"), "--format", "markdown", check=True)
    assert (tmp_path / "r.md").read_text().startswith("# rtvirt report")
    assert "r.md" in result.stdout
    missing = run_cli("report", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr
    bad_baseline = run_cli("report", str(results), "--baseline", "nope", "--out", str(tmp_path / "x.html"))
    assert bad_baseline.returncode == 2 and "--baseline" in bad_baseline.stderr


def test_every_format_carries_the_studies_tables_published_figures_and_readings(tmp_path: Path) -> None:
    """JSON holds every table HTML and Markdown show (a study's with the paper's figures as its table prints them
    and a reading of each), and the published figures themselves."""
    root = tmp_path / "results"
    rng = np.random.default_rng(3)
    study = {"name": "interrupt-latency", "modified": [], "modified_count": 0, "scale": 0.02, "repetitions": 1,
             "study_repetitions": 3}
    synthetic_run(root, "native", rng.integers(2_000, 3_500, 2000), config="native: native / alone", study=study)
    synthetic_run(root, "vm", rng.integers(4_500, 12_000, 2000), config="virtualised: vm / alone", study=study)
    data = collect(root)
    document = json.loads(render(data, "json"))
    markdown, html = render(data, "markdown"), render(data, "html")
    tables = {table["title"]: table for table in document["tables"]}
    latency = tables["Interrupt-latency study: min / avg / max per configuration (µs)"]
    rows = {(row[0], row[1]): row for row in latency["rows"]}
    assert rows[("native", "native: native / alone")][5:8] == ["2.28", "2.50", "3.03"]
    vm = rows[("virtualised, alone", "virtualised: vm / alone")]
    assert vm[5:8] == ["4.67", "5.53", "11.78"] and "paper +121 %" in vm[8] and "x the paper" in vm[8]
    assert any(title.startswith("Study interrupt-latency") for title in tables)
    for table in document["tables"]:  # the same tables, cell for cell, in the other formats
        assert f"## {table['title']}" in markdown and escape(table["title"]) in html
        for row in table["rows"]:
            assert "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" in markdown
    assert document["published"]["interrupt-latency"]["rows"][3]["avg_us"] == "5.84"
    assert [s["configuration"] for s in document["served"]] == [c.label for c in data.configurations]
