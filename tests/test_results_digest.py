"""The digest stored with each run (digest.json, series.parquet): equal to a full pass over the samples,
what `rtvirt stats` and the report read instead of the samples, and runs stored without one (older
versions) still give the same statistics and report."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from results_data import SEC, real_timer_run, samples_table, synthetic_run

from rtvirt.digest import read_digest
from rtvirt.results.report import write_report
from rtvirt.results.reportdata import collect
from rtvirt.results.sources import run_summaries
from rtvirt.results.windows import run_pass
from rtvirt.stats import summarize
from rtvirt.store import load_run, new_run, write_run
from rtvirt.timeprofile.windows import TOP_KEPT

N = 60_000
EVENTS = (20 * SEC, 41 * SEC)


def _values(rng: np.random.Generator) -> np.ndarray:
    """Latency-like ns: a gamma body, a level shift between the events and rare spikes far above."""
    values = rng.gamma(3.0, 2_000.0, N).astype(np.int64) + 6_000
    values[int(N * 0.4):int(N * 0.7)] += 9_000
    spikes = rng.integers(0, N, 40)
    values[spikes] = rng.integers(200_000, 40_000_000, spikes.size)
    return values


Stored = tuple[Path, np.ndarray, np.ndarray, np.ndarray]


def _stored(root: Path, in_order: bool) -> Stored:
    """A run of two CPUs with a timeline of two events; its samples in time order, or slightly out of it
    (two threads' interleaving)."""
    rng = np.random.default_rng(17)
    values = _values(rng)
    cpus = rng.integers(0, 2, N)
    t = np.arange(N, dtype=np.int64) * 1_000_000 + 5 * SEC
    if not in_order:
        t += rng.integers(0, 3_000_000, N)
    timeline = [{"t_ns": EVENTS[0], "event": "stress on"}, {"t_ns": EVENTS[1], "event": "stress off"}]
    run = new_run(root, "digest")
    write_run(run, samples_table(t, values, cpus), {"name": "digest", "source": "measured", "probe": "timer",
                                                    "value_field": "latency_ns", "timeline": timeline,
                                                    "stream_header": {"cycles_hz": 2_000_000_000}},
              group_by="cpu")
    return run.path, t, values, cpus


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return _stored(tmp_path_factory.mktemp("digest") / "results", in_order=True)


def _same(a: object, b: object) -> bool:
    """Summaries (or any dataclasses) equal field by field, NaN equal to NaN."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(asdict(a).values(), asdict(b).values(), strict=True))  # type: ignore[call-overload]


@pytest.mark.parametrize("in_order", [True, False], ids=["in time order", "out of order"])
def test_digest_equals_a_full_pass_over_the_samples(in_order: bool, tmp_path: Path) -> None:
    path, t, values, cpus = _stored(tmp_path, in_order)
    run = load_run(path)
    digest = read_digest(path, run.run_id)
    assert digest is not None and digest.has_profile
    # The statistics `rtvirt stats` prints: per CPU and all, exactly those of the samples.
    groups = digest.groups()
    assert list(groups) == ["cpu 0", "cpu 1", "all"]
    assert _same(groups["all"], summarize(values)) and _same(groups["cpu 1"], summarize(values[cpus == 1]))
    assert all(_same(groups[k], s) for k, s in run_summaries(run).items())
    profile, largest, segments = digest.over_time()
    first = int(t.min())
    offset = t - first
    assert profile.first_ns == first and profile.duration_ns == int(t.max()) - first
    for end, summary in profile.marks:  # cumulative statistics at 1/8, 2/8, 4/8, all
        assert _same(summary, summarize(values[offset <= end])), end
    window = profile.window_ns
    assert sum(w.count for w in profile.windows) == N
    for w in profile.windows:
        inside = offset // window == w.start_ns // window
        assert w.count == inside.sum() and w.max_ns == values[inside].max()
        assert w.mean_ns == pytest.approx(values[inside].mean(), rel=1e-12)
    order = np.argsort(-values, kind="stable")[:TOP_KEPT]
    assert [v for _, v, _ in largest] == values[order].tolist()
    assert {(tt, v, c) for tt, v, c in largest} == set(zip(offset[order].tolist(), values[order].tolist(),
                                                            cpus[order].tolist(), strict=True))
    cuts = np.array(EVENTS) - first
    where = np.searchsorted(cuts, offset, side="right")
    assert [s.after_event for s in segments] == ["start", "stress on", "stress off"]
    for k, segment in enumerate(segments):
        exact = summarize(values[where == k])
        assert (segment.count, segment.median_ns, segment.max_ns) == (exact.samples, exact.median_ns, exact.max_ns)
    # every k-th sample for the plots, in time order
    series_t, series_v = digest.series()
    stride = N // 20_000
    assert np.array_equal(np.sort(series_t), np.sort(offset[::stride])) and np.all(np.diff(series_t) >= 0)
    assert sorted(series_v.tolist()) == sorted(values[::stride].tolist())
    # the pass over samples.parquet that runs without a digest take gives the same
    again = run_pass(run, cuts=cuts.tolist())
    assert [(w.start_ns, w.count, w.max_ns) for w in again.profile.windows] == \
        [(w.start_ns, w.count, w.max_ns) for w in profile.windows]
    assert all(_same(a, b) for (_, a), (_, b) in zip(again.profile.marks, profile.marks, strict=True))


def test_stats_reads_the_digest_alone(stored: Stored,
                                      tmp_path: Path) -> None:
    path, _, values, _ = stored
    copy = tmp_path / "run"
    shutil.copytree(path, copy)
    for big in ("samples.parquet", "histogram.parquet"):
        (copy / big).unlink()  # what `rtvirt stats` must not need
    document = json.loads(run_cli("stats", str(copy), "--json", check=True).stdout)
    assert next(iter(document.values()))["all"]["p9999_ns"] == float(np.percentile(values, 99.99))
    # and imports none of the numeric stack to print it
    traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "rtvirt", "stats", str(copy)],
                            capture_output=True, text=True, check=True)
    imported = {line.split("|")[-1].strip() for line in traced.stderr.splitlines() if "|" in line}
    assert not imported & {"numpy", "pyarrow", "pydantic", "duckdb"}, imported & {"numpy", "pyarrow", "pydantic"}


def test_runs_without_a_digest_report_the_same(stored: Stored,
                                               tmp_path: Path) -> None:
    path, _, _, _ = stored
    new, old = tmp_path / "new", tmp_path / "old"
    for root in (new, old):
        shutil.copytree(path, root / "runs" / path.name)
    for derived in ("digest.json", "series.parquet"):
        (old / "runs" / path.name / derived).unlink()  # as an older version stored it
    fresh, aged = (collect(root).configurations[0].runs[0] for root in (new, old))
    assert fresh.profile is not None and aged.profile is not None
    assert _same(fresh.summary, aged.summary)
    assert [(w.start_ns, w.count, w.max_ns) for w in fresh.profile.windows] == \
        [(w.start_ns, w.count, w.max_ns) for w in aged.profile.windows]
    assert all(_same(a, b) for (_, a), (_, b) in zip(fresh.profile.marks, aged.profile.marks, strict=True))
    assert fresh.outliers == aged.outliers and fresh.outliers[0].value_cycles is not None
    assert fresh.segments == aged.segments and fresh.ramp == aged.ramp
    assert [s.event for s in fresh.switches] == [s.event for s in aged.switches] == ["stress on", "stress off"]
    assert all(_same(a, b) for a, b in zip(fresh.switches, aged.switches, strict=True))
    # the HTML report of the old run draws its time series from the pass (the new one: test_results_report)
    assert "time series" in write_report(old, old / "report.html").read_text()
    for spec in (Path("runs") / path.name, Path(".")):  # the run, and its results directory
        stats = [json.loads(run_cli("stats", str(root / spec), "--json", check=True).stdout) for root in (new, old)]
        assert stats[0] == stats[1] and list(stats[0]) == [path.name]
    over_time = [run_cli("stats", str(root / "runs" / path.name), "--over-time", check=True).stdout
                 for root in (new, old)]
    assert over_time[0] == over_time[1] and "per-window maxima" in over_time[0]
    assert f"{fresh.summary.max_ns / 1000:.3f}" in over_time[0].split("over time")[1]
    # another window than the stored one: computed from the samples
    other = collect(new, window_ns=7 * SEC).configurations[0].runs[0]
    assert other.profile is not None and other.profile.window_ns == 7 * SEC
    assert sum(w.count for w in other.profile.windows) == N


def test_every_writer_stores_a_digest(tmp_path: Path) -> None:
    # a real probe run (as `rtvirt probe` and the campaign engine write them)
    manifest = real_timer_run(tmp_path, "1s")
    run = load_run(tmp_path / "runs" / manifest["run_id"])
    digest = read_digest(run.path, run.run_id)
    assert digest is not None and digest.has_profile
    assert all(_same(digest.groups()[k], s) for k, s in run_summaries(run).items())
    values = run.samples([str(run.value_field)]).column(0).to_numpy()
    assert digest.over_time()[1][0][1] == values.max()
    # a simulated run: statistics per task
    sim = write_run(new_run(tmp_path, "sim"), samples_table(np.arange(5), np.array([10, 20, 30, 400, 500]),
                                                           kinds=["a", "a", "a", "b", "b"], value_field="response_ns"),
                    {"name": "sim", "source": "simulated", "value_field": "response_ns"})
    sim_digest = read_digest(tmp_path / "runs" / sim["run_id"], sim["run_id"])
    assert sim_digest is not None and list(sim_digest.groups()) == ["a", "b", "all"]
    assert sim_digest.groups()["b"].median_ns == 450
    # an analysis run (no samples): statistics of nothing, no time profile
    analysis = write_run(new_run(tmp_path, "rta"), None, {"name": "rta", "source": "analysis"})
    empty = read_digest(tmp_path / "runs" / analysis["run_id"], analysis["run_id"])
    assert empty is not None and not empty.has_profile and empty.groups()["all"].samples == 0


def test_a_foreign_or_broken_digest_is_not_trusted(stored: Stored,
                                                   tmp_path: Path) -> None:
    path = stored[0]
    other = synthetic_run(tmp_path, "other", np.arange(1000))
    other_dir = tmp_path / "runs" / other["run_id"]
    shutil.copy(path / "digest.json", other_dir / "digest.json")  # another run's digest
    document = json.loads(run_cli("stats", str(other_dir), "--json", check=True).stdout)
    assert document[other["run_id"]]["all"]["max_ns"] == 999
    (other_dir / "digest.json").write_text('{"digest_version": 1, "run_id": "' + other["run_id"] + '", "groups": 5}')
    document = json.loads(run_cli("stats", str(other_dir), "--json", check=True).stdout)
    assert document[other["run_id"]]["all"]["samples"] == 1000
