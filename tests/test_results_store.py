"""The store's shared API (write_run for measured, simulated, imported and analysis runs), the DuckDB
catalog behind `rtvirt sql`, and `rtvirt stats` / `rtvirt compare` on real and broken runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from results_data import real_timer_run, samples_table, synthetic_run

from rtvirt.errors import InputError
from rtvirt.results.catalog import query
from rtvirt.stats import summarize
from rtvirt.store import list_runs, load_run, new_run, write_run


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store") / "results"
    real_timer_run(root, "1s", config="host/solo")
    rng = np.random.default_rng(2)
    synthetic_run(root, "synthetic", rng.integers(1000, 90_000, 5000), config="vm/busy")
    write_run(new_run(root, "rta"), None, {"name": "rta", "source": "analysis", "analysis": {"tasks": [
        {"vm": "vm1", "task": "ctl", "wcrt_bound_ns": 5e5, "deadline_ns": 1e6, "schedulable": True}]}})
    return root


def test_simulated_run_summarised_per_task(tmp_path: Path) -> None:
    response = np.array([10, 20, 30, 400, 500])
    kinds = ["a", "a", "a", "b", "b"]
    manifest = write_run(new_run(tmp_path, "sim"), samples_table(np.arange(5), response, kinds=kinds,
                                                                 value_field="response_ns"),
                         {"name": "sim", "source": "simulated", "value_field": "response_ns"})
    assert manifest["summary"]["a"]["max_ns"] == 30 and manifest["summary"]["b"]["median_ns"] == 450
    assert manifest["summary"]["all"]["samples"] == 5
    stored = load_run(tmp_path / "runs" / manifest["run_id"])
    assert stored.manifest == json.loads((stored.path / "manifest.json").read_text())
    assert stored.summary().median_ns == 30


def test_manifest_is_validated_with_field_paths(tmp_path: Path) -> None:
    run = new_run(tmp_path, "bad")
    with pytest.raises(InputError, match="'source'"):
        write_run(run, None, {"name": "x", "source": "guessed"})
    with pytest.raises(InputError, match=r"timeline\.0\.t_ns"):
        write_run(run, None, {"name": "x", "source": "measured", "timeline": [{"t_ns": "soon", "event": "e"}]})
    with pytest.raises(InputError, match="value_field"):
        write_run(run, samples_table(np.arange(2), np.arange(2)), {"name": "x", "source": "measured"})


def test_real_probe_run_stats_match_numpy(results: Path) -> None:
    run = next(r for r in list_runs(results) if r.label == "host/solo")
    values = run.samples()["latency_ns"].to_numpy()
    assert values.size > 500 and run.manifest["status"] == "complete"
    result = run_cli("stats", str(run.path), "--json", check=True)
    document = json.loads(result.stdout)[run.run_id]
    assert document["all"]["samples"] == values.size
    assert document["all"]["p99_ns"] == pytest.approx(float(np.percentile(values, 99)))
    assert document["all"]["median_ci_low_ns"] <= document["all"]["median_ns"] <= document["all"]["median_ci_high_ns"]
    # The same file read as a foreign Parquet file (no stored histogram) gives the same numbers.
    foreign = run_cli("stats", str(run.path / "samples.parquet"), "--column", "latency_ns", "--json", check=True)
    assert json.loads(foreign.stdout)[str(run.path / "samples.parquet")]["all"] == pytest.approx(
        summarize(values).as_dict() | {"dropped": 0, "quantity": "latency", "unit": "ns"}, nan_ok=True)


def test_catalog_sql(results: Path) -> None:
    columns, rows = query(results, "SELECT source, count(*) FROM runs GROUP BY source ORDER BY source")
    assert rows == [("analysis", 1), ("measured", 2)]
    _, rows = query(results, "SELECT count(*) FROM samples")
    total = sum(r.summary().samples for r in list_runs(results) if r.has_samples)
    assert rows == [(total,)]
    _, rows = query(results, "SELECT sum(count) FROM histograms")
    assert rows == [(total,)]
    _, rows = query(results, "SELECT task, wcrt_bound_ns FROM analysis_tasks")
    assert rows == [("ctl", 5e5)]
    cli = run_cli("sql", "SELECT config FROM runs WHERE config IS NOT NULL ORDER BY 1", "--results", str(results),
                  "--format", "csv", check=True)
    assert cli.stdout.split() == ["config", "host/solo", "vm/busy"]
    bad = run_cli("sql", "SELEC nonsense", "--results", str(results))
    assert bad.returncode == 2 and "SQL" in bad.stderr and "Traceback" not in bad.stderr


def test_compare_cli(results: Path) -> None:
    solo, busy = (next(r for r in list_runs(results) if r.label == label) for label in ("host/solo", "vm/busy"))
    result = run_cli("compare", str(solo.path), str(busy.path), "--json", check=True)
    document = json.loads(result.stdout)
    expected = (busy.summary().median_ns - solo.summary().median_ns) / solo.summary().median_ns * 100
    assert document["isolation"]["median_increase_pct"] == pytest.approx(expected)
    assert document["outliers"][0]["value_ns"] == busy.summary().max_ns


def test_broken_runs_give_exit_2_naming_the_file(tmp_path: Path) -> None:
    values = np.arange(1000)
    manifest = synthetic_run(tmp_path, "victim", values)
    run_dir = tmp_path / "runs" / manifest["run_id"]
    for stored in ("histogram.parquet", "digest.json"):  # force reading the samples
        (run_dir / stored).unlink()
    data = (run_dir / "samples.parquet").read_bytes()
    (run_dir / "samples.parquet").write_bytes(data[: len(data) // 2])
    truncated = run_cli("stats", str(run_dir))
    assert truncated.returncode == 2 and "samples.parquet" in truncated.stderr, truncated.stderr
    assert "Traceback" not in truncated.stderr
    (run_dir / "manifest.json").write_text('{"run_id": "x", "name": ')
    corrupt = run_cli("stats", str(run_dir))
    assert corrupt.returncode == 2 and "manifest.json" in corrupt.stderr
    foreign = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"name": ["a", "b"]}), foreign)
    wrong = run_cli("stats", str(foreign))
    assert wrong.returncode == 2 and "foreign.parquet" in wrong.stderr
    missing = run_cli("stats", str(tmp_path / "nothing-here"))
    assert missing.returncode == 2 and "nothing-here" in missing.stderr
