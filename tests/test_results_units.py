"""Every number true: values carry their unit (a Thread-Metric run's rounds are never microseconds), runs are
compared only with comparable runs (same probe, parameters, threads, CPUs), and a statistic has one definition
wherever it is printed or used as a threshold (the p99.9 of `rtvirt stats` is `rtvirt explain`'s threshold)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from results_data import synthetic_run

from rtvirt.explain.attribute import choose_threshold
from rtvirt.explain.config import ExplainConfig
from rtvirt.explain.recorder import keep_rule  # the recorder's rule as the sources set it
from rtvirt.results.reportdata import collect
from rtvirt.stats import summarize

CPUS = sorted(os.sched_getaffinity(0))
CPU = CPUS[-1]


def _probe(results: Path, name: str, *args: str) -> dict[str, Any]:
    done = run_cli("probe", name, *args, "--results", str(results), "--no-progress", "--json", timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _stats(path: str) -> dict[str, Any]:
    return json.loads(run_cli("stats", path, "--json", check=True).stdout)  # type: ignore[no-any-return]


def _stat_row(table: str, name: str) -> list[str]:
    """The cells of one statistic's row of `rtvirt stats`' table."""
    line = next(line for line in table.splitlines() if re.match(rf"│ {re.escape(name)}\s+│", line))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_thread_metric_rounds_are_rounds_in_the_probe_table_stats_and_sql(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shown = run_cli("probe", "threadmetric", "-D", "3s", "--report-interval", "250ms", "-a", str(CPU), "--results",
                    str(results), "--no-progress", timeout=180)
    assert shown.returncode == 0, shown.stderr
    assert "min rounds" in shown.stdout and "median rounds" in shown.stdout and " us" not in shown.stdout
    run = re.search(r"run (\S+) written to (\S+)", shown.stdout)
    assert run is not None, shown.stdout
    run_id, path = run[1], run[2]
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert (manifest["quantity"], manifest["unit"]) == ("rounds per interval", "rounds")
    rounds = manifest["summary"]["all"]
    assert rounds["samples"] >= 3 and rounds["min_ns"] > 1000  # thousands of rounds per 250 ms, even under TCG
    table = run_cli("stats", path, check=True).stdout
    header = next(line for line in table.splitlines() if "statistic" in line)
    assert "statistic (rounds)" in header and "µs" not in table
    assert _stat_row(table, "min")[-1] == f"{rounds['min_ns']:.0f}"  # 31431 rounds, not 31.431
    assert _stat_row(table, "max")[-1] == f"{rounds['max_ns']:.0f}"
    document = _stats(path)[run_id]["all"]
    assert document["unit"] == "rounds" and document["median_ns"] == rounds["median_ns"]
    sql = run_cli("sql", "SELECT probe, quantity, unit, median_value, median_ns, max_value, max_ns FROM runs",
                  "--results", str(results), "--format", "json", check=True)
    assert json.loads(sql.stdout)["rows"] == [["threadmetric", "rounds per interval", "rounds", rounds["median_ns"],
                                               None, rounds["max_ns"], None]]
    samples = run_cli("sql", "SELECT DISTINCT unit FROM samples UNION ALL SELECT DISTINCT unit FROM histograms",
                      "--results", str(results), "--format", "json", check=True)
    assert json.loads(samples.stdout)["rows"] == [["rounds"], ["rounds"]]


def test_the_p999_stats_prints_is_the_threshold_explain_states(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run = _probe(results, "timer", "--explain", "-D", "3s", "-i", "1ms", "-a", str(CPU))
    p999 = _stats(run["path"])[run["run_id"]]["all"]["p999_ns"]
    shown = f"{p999 / 1000:.3f}"
    assert _stat_row(run_cli("stats", run["path"], check=True).stdout, "p99.9")[-1] == shown
    explained = json.loads(run_cli("explain", run["path"], "--json", check=True).stdout)
    assert f"p99.9 = {shown} us" in explained["threshold_rule"], explained["threshold_rule"]
    assert explained["threshold_ns"] == max(int(p999), ExplainConfig().floor)
    text = run_cli("explain", run["path"], "--top", "1", check=True).stdout
    assert f"p99.9 = {shown} us" in text


def test_explains_threshold_is_the_stats_quantile_and_never_below_the_recorders_floor() -> None:
    """The flight recorder keeps the samples above its rule's floor while the run goes; the threshold chosen at
    the end (the linear p99.9, or the floor) is never below that floor, so every outlier's trace was kept."""
    rng = np.random.default_rng(3)
    config = ExplainConfig()
    rule = keep_rule(config)
    assert rule is not None
    for size in (1, 7, 1000, 20_001):
        values = (rng.gamma(1.5, 9_000.0, size) + rng.integers(0, 2, size) * 25_000).astype(np.int64)
        threshold, text = choose_threshold(values, floor_ns=config.floor, quantile=config.quantile)
        level = float(np.quantile(values, 0.999))  # numpy's linear: the definition docs/statistics.md states
        assert threshold == max(int(level), config.floor) and threshold >= rule.above_ns
        assert f"p99.9 = {level / 1000:.3f} us" in text
        assert np.array_equal(values > threshold, values > max(level, config.floor))  # integers: same outliers
        assert np.all(values[values > threshold] > rule.above_ns)


def test_at_a_tie_the_threshold_explain_states_is_the_p999_stats_prints() -> None:
    """The suite's run whose stats said p99.9 168.147 us and whose explanation said 168.148: of its 2,901 samples,
    p99.9 lies a tenth of the way from 103,495 to 750,020 ns, at 168,147.5, a tie in the third decimal of its us
    that float noise decides. explain took 99.9 / 100 (0.9990000000000001) where stats takes 0.999, and the two
    noises fell on either side."""
    values = np.concatenate([np.arange(1_000, 3_897), [103_495, 750_020, 800_000, 900_000]]).astype(np.int64)
    p999 = summarize(values).p999_ns
    assert 168_147.4 < p999 < 168_147.6
    threshold, text = choose_threshold(values, floor_ns=20_000, quantile=99.9)
    assert f"p99.9 = {p999 / 1000:.3f} us" in text and threshold == int(p999), (p999, text)


def test_compare_takes_only_comparable_runs(tmp_path: Path) -> None:
    """A 1-thread run on one CPU, a 2-thread run on two, another 1-thread run on the first CPU: the last one's
    baseline is the first, not the run between them; the first two are refused, naming how they differ."""
    results = tmp_path / "results"
    pair = ",".join(map(str, CPUS[:2]))
    one = _probe(results, "timer", "-D", "2s", "-i", "1ms", "-t", "1", "-a", str(CPU))
    two = _probe(results, "timer", "-D", "2s", "-i", "1ms", "-t", "2", "-a", pair)
    again = _probe(results, "timer", "-D", "2s", "-i", "1ms", "-t", "1", "-a", str(CPU))
    refused = run_cli("compare", one["run_id"], two["run_id"], "--results", str(results))
    both = f"{CPUS[0]}-{CPUS[1]}" if CPUS[1] == CPUS[0] + 1 else pair
    expected = f"threads 1 vs 2; CPUs {CPU} vs {both}"
    assert refused.returncode == 2 and expected in refused.stderr, refused.stderr
    assert "--anyway" in refused.stderr and "Traceback" not in refused.stderr
    picked = run_cli("compare", again["run_id"], "--results", str(results), "--json")
    assert picked.returncode in (0, 3), picked.stderr  # 3: a regression of the same configuration, a real gate
    document = json.loads(picked.stdout)
    assert document["baseline_run"] == one["run_id"] and document["comparable"] and document["same_configuration"]
    # the tail test's threshold is the baseline's p99.9 as `rtvirt stats` prints it
    assert document["tail"]["threshold_ns"] == pytest.approx(_stats(one["path"])[one["run_id"]]["all"]["p999_ns"])
    nothing = run_cli("compare", two["run_id"], "--results", str(results))
    assert nothing.returncode == 2 and "no earlier complete run comparable" in nothing.stderr, nothing.stderr
    anyway = run_cli("compare", one["run_id"], two["run_id"], "--results", str(results), "--anyway", "--json")
    assert anyway.returncode == 0, anyway.stderr  # never the gate: no exit 3 from runs that are not comparable
    document = json.loads(anyway.stdout)
    assert not document["comparable"] and not document["gated"] and document["differences"] == expected.split("; ")
    gated = run_cli("compare", one["run_id"], two["run_id"], "--results", str(results), "--anyway", "--gate")
    assert gated.returncode == 2 and "option --gate" in gated.stderr


def test_a_label_with_two_measurements_is_two_configurations_in_the_report(tmp_path: Path) -> None:
    """Two `rtvirt probe timer` runs share the label "timer": measured differently, they are not pooled."""
    results = tmp_path / "results"
    rng = np.random.default_rng(4)
    for threads, cpus, level in ((1, [1], 20_000), (2, [0, 1], 30_000), (1, [1], 21_000)):
        synthetic_run(results, "timer", level + rng.integers(0, 2_000, 2_000), config=None,
                      params={"interval": "1ms", "threads": threads, "affinity": cpus, "duration": "2s"})
    data = collect(results)
    labels = {c.label: len(c.runs) for c in data.configurations}
    assert labels == {"timer (threads 1, CPUs 1)": 2, "timer (threads 2, CPUs 0-1)": 1}
    assert data.isolation == []  # and neither is the other's baseline


def test_verdicts_and_isolation_keep_to_their_quantity(tmp_path: Path) -> None:
    """Latencies are judged; durations and rounds are not (no verdict, not "meets"); each is compared only with
    the solo run of its own probe and workload."""
    results = tmp_path / "results"
    rng = np.random.default_rng(5)
    runs = [("timer", "latency_ns", {"interval": "1ms"}, "solo", 20_000), ("timer", "latency_ns",
            {"interval": "1ms"}, "spin", 40_000), ("workload", "duration_ns", {"kernel": "qsort"}, "solo", 9_000_000),
            ("workload", "duration_ns", {"kernel": "qsort"}, "spin", 18_000_000),
            ("workload", "duration_ns", {"kernel": "basicmath"}, "solo", 4_000_000),
            ("threadmetric", "rounds", {"report_interval": "50ms"}, "spin", 9_000),
            ("threadmetric", "rounds", {"report_interval": "50ms"}, "solo", 18_000)]
    for probe, field, params, disturbance, level in runs:
        group = params.get("kernel", probe)
        synthetic_run(results, group, level + rng.integers(0, level // 10, 300), config=f"{group}: {disturbance}",
                      probe=probe, value_field=field, params=params)
    data = collect(results)
    by_label = {c.label: c for c in data.configurations}
    assert [v.outcome for v in by_label["timer: solo"].verdicts] and not by_label["qsort: solo"].verdicts
    assert not by_label["threadmetric: spin"].verdicts
    assert {(r.label, r.baseline, r.unit) for r in data.isolation} == {
        ("timer: spin", "timer: solo", "ns"), ("qsort: spin", "qsort: solo", "ns"),
        ("threadmetric: spin", "threadmetric: solo", "rounds")}
    row = next(r for r in data.isolation if r.label == "threadmetric: spin")
    assert row.median_increase_pct == pytest.approx(
        (by_label["threadmetric: spin"].summary.median_ns / by_label["threadmetric: solo"].summary.median_ns - 1)
        * 100)


def test_cpu_numbers_are_compared_only_within_one_place() -> None:
    """A guest's vCPU 0 is no host CPU: a VM run against a host run (the virtualisation question) is comparable
    whatever their CPU numbers; two host runs on different CPUs are not."""
    from rtvirt.identity import measurement_differences, run_identity

    def manifest(environment: str, cpus: list[int], threads: int = 1) -> dict[str, Any]:
        return {"source": "measured", "probe": "timer", "value_field": "latency_ns", "environment": environment,
                "config": f"{environment} / solo", "environment_detail": {"kind": environment},
                "params": {"interval": "1ms", "threads": threads, "affinity": cpus, "duration": "10s"}}

    host, guest = run_identity(manifest("host", [1])), run_identity(manifest("qemu", [0]))
    assert measurement_differences(host, guest) == []
    assert measurement_differences(host, run_identity(manifest("host", [0]))) == ["CPUs 1 vs 0"]
    assert measurement_differences(host, run_identity(manifest("qemu", [0], threads=2))) == ["threads 1 vs 2"]
