"""The shared results store: a real PostgreSQL (started here from a temporary directory) as the catalog and a
directory as the shared storage; several rtvirt processes writing at once, a store lost mid-campaign and
`rtvirt push`, history (`rtvirt trend`) and regressions (`rtvirt compare`) on a local and a shared store alike,
and bad URLs or refused credentials (exit 2 naming the URL without its password)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import RTVIRT
from pg_server import PASSWORD, PgServer
from results_data import synthetic_run

from rtvirt import __version__
from rtvirt.results.history import binomial_upper_tail

SCENARIO = """\
name = "lab-{tag}"
duration = "600ms"
repetitions = {repetitions}
run_timeout = "60s"

[workload]
probe = "timer"
params = {{ interval = "1ms" }}

[[environments]]
kind = "host"

[[disturbances]]
name = "solo"

[timeline]
settle = "50ms"
"""


# one PostgreSQL server for the file: the store fixture asks for it at run time, which tests/conftest.py cannot see
pytestmark = pytest.mark.xdist_group("module:tests/test_results_shared.py")


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    with PgServer() as pg:
        yield pg


@pytest.fixture
def env(server: PgServer, tmp_path: Path) -> dict[str, str]:
    return {**server.env(), "RTVIRT_SPOOL": str(tmp_path / "spool"), "COLUMNS": "200"}


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RTVIRT, *args], capture_output=True, text=True, env=env, timeout=timeout)


def _sql(statement: str, url: str, env: dict[str, str]) -> list[list[object]]:
    result = _cli("sql", statement, "--results", url, "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["rows"]


def _scenario(tmp_path: Path, tag: str, repetitions: int) -> Path:
    path = tmp_path / f"{tag}.toml"
    path.write_text(SCENARIO.format(tag=tag, repetitions=repetitions))
    return path


@pytest.mark.slow
def test_two_campaigns_from_two_processes_write_one_store_exactly_once(server: PgServer, tmp_path: Path) -> None:
    url = server.url(data=tmp_path / "shared")
    procs = []
    for machine in ("a", "b"):  # two machines: each its own spool; the store from RTVIRT_RESULTS
        machine_env = {**server.env(), "RTVIRT_RESULTS": url, "RTVIRT_SPOOL": str(tmp_path / f"spool-{machine}")}
        procs.append(subprocess.Popen([*RTVIRT, "run", str(_scenario(tmp_path, machine, 3)), "--json",
                                       "--no-progress"], env=machine_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    documents = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "delivered 3 run(s)" in err, err
        documents.append(json.loads(out))
    written = {run["run_id"] for d in documents for run in d["runs"].values()}
    assert len(written) == 6
    env = server.env()
    rows = _sql("SELECT run_id, scenario, machine, kernel, rtvirt_version, scenario_sha256, samples FROM runs",
                url, env)
    assert sorted(r[0] for r in rows) == sorted(written)  # every run once
    assert {r[1] for r in rows} == {"lab-a", "lab-b"}
    assert {r[2] for r in rows} == {socket.gethostname()} and {r[3] for r in rows} == {os.uname().release}
    assert {r[4] for r in rows} == {__version__}
    assert len({r[5] for r in rows if r[1] == "lab-a"}) == 1 and all(len(str(r[5])) == 64 for r in rows)
    # a query across both campaigns is exact: the histograms' counts are the samples in the shared Parquet files
    counted = dict(_sql("SELECT run_id, sum(count)::BIGINT FROM histograms GROUP BY run_id", url, env))
    on_disk = {rid: pq.ParquetFile(tmp_path / "shared" / "runs" / rid / "samples.parquet").metadata.num_rows
               for rid in written}
    assert counted == on_disk and {r[0]: r[6] for r in rows} == on_disk
    assert dict(_sql("SELECT run_id, count(*) FROM samples GROUP BY run_id", url, env)) == on_disk
    top = _sql("SELECT max(value) FROM histograms", url, env)[0][0]
    assert top == max(pq.read_table(tmp_path / "shared" / "runs" / rid / "samples.parquet")["latency_ns"]
                      .to_numpy().max() for rid in written)
    # the other reading commands take the store's URL like a directory
    stats = _cli("stats", url, "--json", env=env)
    assert stats.returncode == 0 and set(json.loads(stats.stdout)) == written, stats.stderr
    report = _cli("report", url, "--format", "json", "--out", str(tmp_path / "r.json"), env=env)
    assert report.returncode == 0, report.stderr
    assert {r["run_id"] for c in json.loads((tmp_path / "r.json").read_text())["configurations"]
            for r in c["runs"]} == written
    assert not list((tmp_path / "spool-a" / "runs").iterdir())  # delivered runs leave the spool


def test_concurrent_importers_each_run_once_and_a_retry_adds_nothing(server: PgServer, tmp_path: Path) -> None:
    url = server.url(data=tmp_path / "shared")
    files = []
    for i in range(12):
        path = tmp_path / f"in{i}.csv"
        path.write_text("latency_us\n" + "\n".join(str(10 + (i * 7 + k) % 23) for k in range(200)) + "\n")
        files.append(path)
    procs = [subprocess.Popen([*RTVIRT, "import", "column", *map(str, files[w::4]), "--results", url,
                               "--unit", "us"], env={**server.env(), "RTVIRT_SPOOL": str(tmp_path / f"spool{w}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    env = server.env()
    rows = _sql("SELECT count(*), count(DISTINCT run_id), sum(samples)::BIGINT FROM runs", url, env)
    assert rows == [[12, 12, 12 * 200]]
    # a machine that crashed after its delivery committed but before it emptied its spool delivers again
    run_id = str(_sql("SELECT min(run_id) FROM runs", url, env)[0][0])
    spool = tmp_path / "spool0"
    (spool / "runs").mkdir(exist_ok=True)
    subprocess.run(["cp", "-r", str(tmp_path / "shared" / "runs" / run_id), str(spool / "runs")], check=True)
    for _ in range(2):
        pushed = _cli("push", "--results", url, "--json", env={**env, "RTVIRT_SPOOL": str(spool)})
        assert pushed.returncode == 0, pushed.stderr
    assert _sql("SELECT count(*) FROM runs", url, env) == [[12]]


@pytest.mark.slow
def test_a_store_lost_mid_campaign_keeps_the_runs_in_the_spool_and_push_delivers_them_once(
        tmp_path: Path) -> None:
    with PgServer() as pg:  # its own server: this test stops it
        url = pg.url(data=tmp_path / "shared")
        env = {**pg.env(), "RTVIRT_SPOOL": str(tmp_path / "spool")}
        proc = subprocess.Popen([*RTVIRT, "run", str(_scenario(tmp_path, "lost", 4)), "--results", url, "--json",
                                 "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((tmp_path / "spool").glob("runs/*/manifest.json")):
            time.sleep(0.05)
        pg.pause()  # the store goes away after the first run (delivered as it ended, or not yet)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        written = {run["run_id"] for run in json.loads(out)["runs"].values()}
        spooled = {p.name for p in (tmp_path / "spool" / "runs").iterdir()}
        assert spooled <= written and len(spooled) >= 3, (spooled, err)
        assert f"{len(spooled)} run(s) stay in the spool" in err and "rtvirt push" in err, err
        assert "delivered when the store answers again" in err  # said once, at the first run it could not deliver
        refused = _cli("push", "--results", url, env=env)
        assert refused.returncode == 1 and "unreachable" in refused.stderr
        pg.resume()
        first = _cli("push", "--results", url, "--json", env=env)
        assert first.returncode == 0, first.stderr
        assert set(json.loads(first.stdout)["delivered"]) == spooled
        second = _cli("push", "--results", url, "--json", env=env)
        assert json.loads(second.stdout)["delivered"] == []
        rows = _sql("SELECT run_id, status FROM runs", url, env)
        # (a loaded machine's timer misses periods: such a run is short, and finished as well)
    assert sorted(r[0] for r in rows) == sorted(written) and {r[1] for r in rows} <= {"complete", "short"}


def _lab_run(results: Path, kernel: str, values: np.ndarray, **manifest: Any) -> str:
    system = {"hostname": "board-7", "kernel": kernel, "preemption": "PREEMPT_RT", "cmdline": "isolcpus=1",
              "virtualization": {"dmi": "Acme RT-board"}}
    written = synthetic_run(results, "lab", values, **{"config": "kvm/solo", "scenario": "lab", "system": system,
                                                        "environment_detail": {"kind": "qemu", "qemu": "7.2.0"},
                                                        **manifest})
    return str(written["run_id"])


@pytest.fixture(params=["local", "shared"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, dict[str, str]]:
    """(--results value, where the test writes runs, environment) for a results directory or a shared store."""
    if request.param == "local":
        return str(tmp_path / "results"), tmp_path / "results", {**os.environ, "COLUMNS": "200"}
    server = request.getfixturevalue("server")
    return (server.url(data=tmp_path / "shared", spool=str(tmp_path / "spool")), tmp_path / "spool",
            {**server.env(), "COLUMNS": "200"})


def _deliver(spec: str, env: dict[str, str]) -> None:
    if "://" in spec:
        assert _cli("push", "--results", spec, env=env).returncode == 0


def test_trend_marks_the_kernel_change(store: tuple[str, Path, dict[str, str]]) -> None:
    spec, write_to, env = store
    rng = np.random.default_rng(1)
    ids = [_lab_run(write_to, kernel, rng.integers(5_000, 20_000 + 10_000 * i, 2_000))
           for i, kernel in enumerate(["6.6.30-rt30", "6.6.30-rt30", "6.12.1-rt5", "6.12.1-rt5"])]
    _deliver(spec, env)
    result = _cli("trend", "kvm/solo", "--results", spec, "--json", env=env)
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout)["machines"]["board-7"]
    assert [p["run_id"] for p in points] == ids
    assert [p["changes"] for p in points] == [{}, {}, {"kernel": ["6.6.30-rt30", "6.12.1-rt5"]}, {}]
    assert [p["value"] for p in points] == [
        float(json.loads(_cli("stats", str(_run_dir(spec, write_to, i)), "--json", env=env).stdout)[i]["all"]
              ["max_ns"]) for i in ids]
    table = _cli("trend", "kvm/solo", "--results", spec, "--metric", "class", env=env)
    assert table.returncode == 0 and "kernel: 6.6.30-rt30 → 6.12.1-rt5" in table.stdout, table.stdout
    missing = _cli("trend", "no-such-config", "--results", spec, env=env)
    assert missing.returncode == 2 and "no-such-config" in missing.stderr
    # the report's history section: the same series, the change marked
    out = write_to.parent / "report.md"
    report = _cli("report", spec, "--format", "markdown", "--out", str(out), env=env)
    assert report.returncode == 0, report.stderr
    history = [line for line in out.read_text().splitlines() if line.startswith("| kvm/solo | board-7 |")]
    assert [line.split(" | ")[2] for line in history] == ids
    assert "kernel: 6.6.30-rt30 → 6.12.1-rt5" in history[2] and history[3].endswith("|  |")


def _run_dir(spec: str, write_to: Path, run_id: str) -> Path:
    return (Path(spec.split("data=")[1].split("&")[0]) if "://" in spec else write_to) / "runs" / run_id


def test_compare_flags_an_injected_tail_regression_and_not_a_rerun(store: tuple[str, Path, dict[str, str]]) -> None:
    spec, write_to, env = store
    rng = np.random.default_rng(7)

    def draw() -> np.ndarray:
        return (8_000 + rng.gamma(2.0, 1_500.0, 100_000)).astype(np.int64)

    _lab_run(write_to, "6.6.30-rt30", draw())
    rerun = _lab_run(write_to, "6.6.30-rt30", draw())
    regressed = draw()
    hit = rng.choice(regressed.size, 400, replace=False)  # 0.4 % of the wake-ups now take 40-60 µs longer
    regressed[hit] += rng.integers(40_000, 60_000, hit.size)
    worse = _lab_run(write_to, "6.12.1-rt5", regressed)
    _deliver(spec, env)
    same = _cli("compare", rerun, "--results", spec, "--json", env=env)  # against the last run of its config
    assert same.returncode == 0, same.stderr
    tail = json.loads(same.stdout)["tail"]
    assert tail["regression"] is False and tail["rate_ratio"] < 1.5
    flagged = _cli("compare", worse, "--results", spec, "--json", env=env)
    assert flagged.returncode == 3, flagged.stderr
    document = json.loads(flagged.stdout)
    assert document["baseline_run"] == rerun and document["tail"]["regression"] is True
    assert document["tail"]["p_value"] < 1e-6 and "tail regression" in flagged.stderr
    # a comparison of two configurations (isolation) reports the test but gates only when asked
    assert _cli("compare", rerun, worse, "--results", spec, "--no-gate", env=env).returncode == 0


def test_compare_and_trend_take_comparable_runs_only(store: tuple[str, Path, dict[str, str]]) -> None:
    """One label, two measurements (1 thread on CPU 1; 2 threads on CPUs 0-1): `compare RUN` takes its baseline
    from the comparable runs even with another run between them, exits 3 only on comparable runs, and `trend`
    keeps the two apart."""
    spec, write_to, env = store
    rng = np.random.default_rng(11)
    one_thread = {"params": {"interval": "1ms", "threads": 1, "affinity": [1], "priority": 99}}
    two_threads = {"params": {"interval": "1ms", "threads": 2, "affinity": [0, 1], "priority": 99}}

    def draw() -> np.ndarray:
        return (8_000 + rng.gamma(2.0, 1_500.0, 50_000)).astype(np.int64)

    regressed = draw()
    regressed[rng.choice(regressed.size, 400, replace=False)] += 50_000
    base = _lab_run(write_to, "6.6.30-rt30", draw(), **one_thread)
    between = _lab_run(write_to, "6.6.30-rt30", draw(), **two_threads)
    worse = _lab_run(write_to, "6.6.30-rt30", regressed, **one_thread)
    _deliver(spec, env)
    flagged = _cli("compare", worse, "--results", spec, "--json", env=env)
    assert flagged.returncode == 3, flagged.stderr  # the gate: a comparable run of the same configuration
    assert json.loads(flagged.stdout)["baseline_run"] == base
    refused = _cli("compare", between, worse, "--results", spec, env=env)
    assert refused.returncode == 2 and "threads 2 vs 1; CPUs 0-1 vs 1" in refused.stderr, refused.stderr
    anyway = _cli("compare", between, worse, "--results", spec, "--anyway", "--json", env=env)
    assert anyway.returncode == 0, anyway.stderr  # the same regression, but no gate between incomparable runs
    assert json.loads(anyway.stdout)["tail"]["regression"] is True and json.loads(anyway.stdout)["gated"] is False
    assert _cli("compare", between, "--results", spec, env=env).returncode == 2  # nothing earlier to compare with
    identities = _sql("SELECT run_id, identity FROM runs", spec, env)
    assert len({key for _, key in identities}) == 2 and dict(identities)[base] == dict(identities)[worse]
    series = json.loads(_cli("trend", "kvm/solo", "--results", spec, "--json", env=env).stdout)["machines"]
    assert {name: [p["run_id"] for p in points] for name, points in series.items()} == {
        "board-7 (threads 1, CPUs 1)": [base, worse], "board-7 (threads 2, CPUs 0-1)": [between]}


def test_an_older_stores_catalog_gains_units_and_identity(server: PgServer, tmp_path: Path) -> None:
    """A catalog created before units and identities: the first command adds the columns, fills them from the
    manifests, and empties the *_ns columns that held Thread-Metric's rounds."""
    url = server.url(data=tmp_path / "shared", spool=str(tmp_path / "spool"))
    env = server.env()
    rounds = synthetic_run(tmp_path / "spool", "tm", np.arange(20_000, 21_000), config="guest / solo",
                           probe="threadmetric", value_field="rounds", params={"report_interval": "5s"})
    latency = _lab_run(tmp_path / "spool", "6.6.30-rt30", np.arange(1_000, 3_000))
    assert _cli("push", "--results", url, env=env).returncode == 0
    database = url.split("/")[3].split("?")[0]
    old = [f"DROP COLUMN {name}" for name in ("quantity", "unit", "identity", "min_value", "median_value",
                                               "mean_value", "p99_value", "p999_value", "p9999_value", "max_value")]
    psql = [str(next(Path("/usr/lib/postgresql").glob("*/bin/psql"))), "-h", "127.0.0.1", "-p", str(server.port),
            "-U", "rtvirt", "-d", database, "-qc"]
    subprocess.run([*psql, f"ALTER TABLE rtvirt_runs {', '.join(old)}; DROP INDEX IF EXISTS rtvirt_runs_identity; "
                    f"UPDATE rtvirt_runs SET median_ns = 20499.5 WHERE run_id = '{rounds['run_id']}'"],
                   env=env, check=True, capture_output=True, timeout=60)
    rows = _sql("SELECT run_id, unit, median_ns, median_value, identity IS NOT NULL FROM runs ORDER BY created",
                url, env)
    assert rows == [[rounds["run_id"], "rounds", None, 20499.5, True], [latency, "ns", 1999.5, 1999.5, True]]
    compared = _cli("compare", latency, rounds["run_id"], "--results", url, env=env)
    assert compared.returncode == 2 and "different units" in compared.stderr, compared.stderr


def test_binomial_tail_is_the_exact_sum() -> None:
    for successes, trials, p in [(0, 10, 0.3), (3, 10, 0.3), (10, 10, 0.3), (40, 100, 0.25), (7, 20, 0.01)]:
        exact = sum(math.comb(trials, j) * p**j * (1 - p) ** (trials - j) for j in range(successes, trials + 1))
        assert binomial_upper_tail(successes, trials, p) == pytest.approx(exact, rel=1e-9)


def test_bad_urls_and_refused_credentials_exit_2_naming_the_url_without_the_password(
        server: PgServer, tmp_path: Path) -> None:
    env = {**os.environ, "RTVIRT_SPOOL": str(tmp_path / "spool")}
    env.pop("PGPASSWORD", None)
    good = server.url(data=tmp_path / "shared", password=PASSWORD)
    wrong = good.replace(f":{PASSWORD}@", ":not-the-password@")
    csv = tmp_path / "x.csv"
    csv.write_text("latency_ns\n1\n2\n")
    for argv in (["sql", "SELECT 1", "--results", wrong], ["import", "column", str(csv), "--results", wrong]):
        result = _cli(*argv, env=env)
        assert result.returncode == 2, result.stderr
        assert "access refused" in result.stderr and f"rtvirt:***@127.0.0.1:{server.port}" in result.stderr
        assert "not-the-password" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "spool" / "runs").exists() or not list((tmp_path / "spool" / "runs").iterdir())
    for url, words in ((f"postgresql://127.0.0.1:{server.port}/postgres", "no data=DIR"),
                       (f"postgresql://rtvirt:{PASSWORD}@127.0.0.1:{server.port}/nosuchdb?data={tmp_path}",
                        'database "nosuchdb" does not exist'),
                       (f"postgresql://u:{PASSWORD}@127.0.0.1:99999/x?data={tmp_path}", "not a valid PostgreSQL URL"),
                       ("s3://bucket/rtvirt", "unknown kind of store")):
        result = _cli("sql", "SELECT 1", "--results", url, env=env)
        shown = url.replace(f":{PASSWORD}@", ":***@")
        assert result.returncode == 2 and words in result.stderr and shown in result.stderr, result.stderr
        assert PASSWORD not in result.stderr
    # a password given in the URL works, and reaches no manifest, report or catalog row
    imported = _cli("import", "column", str(csv), "--results", good, env=env)
    assert imported.returncode == 0, imported.stderr
    assert PASSWORD not in imported.stderr + imported.stdout
    for path in (tmp_path / "shared").rglob("*.json"):
        assert PASSWORD not in path.read_text()
    rows = _sql("SELECT manifest FROM runs", good, env)
    assert rows and all(PASSWORD not in str(r[0]) for r in rows)


def test_a_run_whose_files_arrived_but_not_its_row_is_not_visible_until_delivered(server: PgServer,
                                                                                  tmp_path: Path) -> None:
    url = server.url(data=tmp_path / "shared", spool=str(tmp_path / "spool"))
    env = server.env()
    first = _lab_run(tmp_path / "spool", "6.6.30-rt30", np.arange(1_000, 3_000))
    assert _cli("push", "--results", url, env=env).returncode == 0
    # a delivery that placed the second run's files and then lost the server before its insert
    second = _lab_run(tmp_path / "spool", "6.6.30-rt30", np.arange(1_000, 4_000))
    subprocess.run(["cp", "-r", str(tmp_path / "spool" / "runs" / second), str(tmp_path / "shared" / "runs")],
                   check=True)
    assert _sql("SELECT run_id FROM runs", url, env) == [[first]]
    assert _sql("SELECT run_id, sum(count)::BIGINT FROM histograms GROUP BY run_id", url, env) == [[first, 2_000]]
    assert _sql("SELECT count(*) FROM samples", url, env) == [[2_000]]
    assert _cli("compare", second, "--results", url, env=env).returncode == 2  # not a run of the store yet
    pushed = _cli("push", "--results", url, "--json", env=env)
    assert json.loads(pushed.stdout)["delivered"] == [second], pushed.stderr
    assert sorted(_sql("SELECT run_id, samples FROM runs", url, env)) == sorted([[first, 2_000], [second, 3_000]])
    assert sorted(p.name for p in (tmp_path / "shared" / "runs").iterdir()) == sorted([first, second])


def test_explain_parts_and_the_reports_causes_on_a_local_and_a_shared_store(
        store: tuple[str, Path, dict[str, str]]) -> None:
    """An explained run's parts reach `rtvirt sql`'s explain_parts and the report's causes alike on both stores;
    a run without an explanation adds no row."""
    from rtvirt.explain.model import Explanation, LayerTrace, Part
    from rtvirt.explain.stored import write_explanation

    spec, write_to, env = store
    explained = _lab_run(write_to, "6.6.30-rt30", np.arange(1_000, 3_000))
    _lab_run(write_to, "6.6.30-rt30", np.arange(1_000, 2_000))
    parts = [Part(10 * 10**9 + rank, 2_000, 0, rank, "host", "task", cause, offset, length, "{}")
             for rank in (1, 2) for cause, offset, length in (("task stress/7 SCHED_FIFO 90", 0, 1_500 - rank),
                                                               ("irq 24 eth0", 1_500 - rank, 500 + rank))]
    write_explanation(write_to / "runs" / explained, Explanation(1_900, "threshold 1.9 us (set)", 2, parts,
                                                                 [LayerTrace("host", True)], []))
    _deliver(spec, env)
    rows = _sql("SELECT run_id, cause, sum(duration_ns)::BIGINT, count(*)::BIGINT FROM explain_parts GROUP BY ALL "
                "ORDER BY ALL", spec, env)
    assert rows == [[explained, "irq 24 eth0", 1_003, 2], [explained, "task stress/7 SCHED_FIFO 90", 2_997, 2]]
    out = write_to.parent / "report.json"
    report = _cli("report", spec, "--format", "json", "--out", str(out), env=env)
    assert report.returncode == 0, report.stderr
    (configuration,) = json.loads(out.read_text())["configurations"]
    assert [(c["cause"], c["total_ns"], c["share"]) for c in configuration["causes"]] == [
        ("task stress/7 SCHED_FIFO 90", 2_997, round(2_997 / 4_000, 6)),
        ("irq 24 eth0", 1_003, round(1_003 / 4_000, 6))]
    shown = _cli("explain", explained, "--results", spec, "--json", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["explained"] == 2, shown.stderr
    if "://" in spec:  # a delivered run stays as delivered: a trace is joined where the run was written
        refused = _cli("explain", explained, "--results", spec, "--trace", str(out), env=env)
        assert refused.returncode == 2 and "shared store" in refused.stderr and PASSWORD not in refused.stderr


@pytest.mark.slow
def test_each_run_reaches_the_store_before_the_next_ends_and_kill_9_loses_no_finished_run(
        server: PgServer, tmp_path: Path) -> None:
    import psycopg

    url = server.url(data=tmp_path / "shared")
    spool = tmp_path / "spool"
    env = {**server.env(), "RTVIRT_SPOOL": str(spool)}
    scenario = tmp_path / "kill.toml"
    scenario.write_text(SCENARIO.format(tag="kill", repetitions=4).replace('duration = "600ms"', 'duration = "2s"'))
    proc = subprocess.Popen([*RTVIRT, "run", str(scenario), "--results", url, "--no-progress", "--no-report"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ended: dict[str, float] = {}  # run id -> when its manifest appeared in the spool (the run ended)
    stored: dict[str, float] = {}  # run id -> when its row appeared in the store
    with psycopg.connect(url.split("?")[0], password=PASSWORD, autocommit=True) as connection:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            now = time.monotonic()
            for manifest in spool.glob("runs/*/manifest.json"):
                ended.setdefault(manifest.parent.name, now)
            if connection.execute("SELECT to_regclass('rtvirt_runs')").fetchone()[0]:
                for (run_id,) in connection.execute("SELECT run_id FROM rtvirt_runs").fetchall():
                    stored.setdefault(run_id, now)
            running = [d for d in spool.glob("runs/*") if not (d / "manifest.json").exists()
                       and (d / "samples.rtvs").exists() and (d / "samples.rtvs").stat().st_size > 4096]
            if len(ended) == 2 and running:  # the third run measures: kill -9 now
                proc.kill()
                break
            time.sleep(0.05)
        proc.communicate(timeout=60)
        assert proc.returncode == -9, "the campaign ended before it could be killed mid-run"
        rows = {run_id for (run_id,) in connection.execute("SELECT run_id FROM rtvirt_runs").fetchall()}
    first, second = sorted(ended, key=lambda r: ended[r])
    assert stored[first] <= ended[second]  # in the store before the next run ended
    assert rows == set(ended)  # every finished run, none lost with the machine
    # the spool keeps the delivered runs' copies (marked) and the killed run's samples; push adds nothing twice
    pushed = _cli("push", "--results", url, "--json", env=env)
    assert pushed.returncode == 0 and json.loads(pushed.stdout)["delivered"] == [], pushed.stdout
    assert sorted(json.loads(pushed.stdout)["already_there"]) == sorted(ended)
    assert {p.name for p in (spool / "runs").iterdir()} == {d.name for d in running}


def test_the_live_view_of_a_store_shows_every_machine_side_by_side_with_hostile_names_as_text(
        server: PgServer, tmp_path: Path) -> None:
    """A campaign published and delivered by this machine, and another machine's (its name, configuration and a
    guest task among its causes hostile): `rtvirt serve URL` shows both, their runs' statistics from the catalog,
    and Chromium renders every hostile string as text."""
    from live_page import LivePage, start_serve, stop

    from rtvirt.live.progress import campaign_record
    from rtvirt.stores.postgres import SharedStore

    url = server.url(data=tmp_path / "shared", spool=str(tmp_path / "spool"))
    env = server.env()
    done = _cli("run", str(_scenario(tmp_path, "side", 1)), "--results", url, "--no-progress", "--no-report",
                "--json", env={**env, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    ours = next(iter(json.loads(done.stdout)["runs"].values()))
    hostile = "<img src=x onerror=\"window.__pwned=1\">"
    other = synthetic_run(tmp_path / "spool", "lab", np.arange(1_000, 3_000), config=f"kvm/{hostile}",
                          system={"hostname": hostile},
                          explain={"threshold_ns": 2_500, "outliers": 2, "explained": 2,
                                   "top_causes": [{"layer": "guest", "cause": f"guest task {hostile}", "share": 1}]})
    assert _cli("push", "--results", url, env=env).returncode == 0
    state = json.loads(next((tmp_path / "spool" / "campaigns").glob("*/state.json")).read_text())
    record = campaign_record({**state, "campaign_id": "board-campaign", "finished": True,
                              "runs": {"host/solo/-/r1": {"status": "complete", "run_id": other["run_id"]}}}, hostile)
    record["runs"][0]["config"] = f"kvm/{hostile}"
    store = SharedStore(url)
    os.environ["PGPASSWORD"] = PASSWORD
    try:
        store.publish_campaign(record)
    finally:
        store.close()
        del os.environ["PGPASSWORD"]
    proc, page_url = start_serve(url, env=env)
    try:
        with urllib.request.urlopen(f"{page_url}api/state", timeout=30) as answer:
            document = json.loads(answer.read())
        machines = {m["machine"]: m["campaigns"] for m in document["machines"]}
        assert set(machines) == {socket.gethostname(), hostile}
        (mine,) = machines[socket.gethostname()]
        assert mine["runs_done"] == 1 and mine["runs"][0]["result"]["stats"]["samples"] == ours["summary"]["samples"]
        (theirs,) = machines[hostile]
        assert theirs["runs"][0]["result"]["stats"]["samples"] == 2_000
        assert theirs["runs"][0]["result"]["explain"]["top_causes"][0]["cause"] == f"guest task {hostile}"
        query = urllib.parse.urlencode({"config": f"kvm/{hostile}"})
        with urllib.request.urlopen(f"{page_url}api/trend?{query}", timeout=30) as answer:
            assert [p["run_id"] for p in json.loads(answer.read())["machines"][hostile]] == [other["run_id"]]
        with LivePage(page_url) as page:
            names = page.wait_for("[...document.querySelectorAll('[data-machine] > h2')].map(e => e.textContent)"
                                  ".filter(Boolean).length == 2 && [...document.querySelectorAll("
                                  "'[data-machine] > h2')].map(e => e.textContent)")
            assert sorted(names) == sorted([socket.gethostname(), hostile])
            assert page.evaluate("document.body.innerText").count(f"guest task {hostile}") == 1
            assert page.evaluate("document.querySelectorAll('#machines img').length") == 0
            assert page.evaluate("document.scripts.length") == 1
            time.sleep(1.0)
            assert page.evaluate("window.__pwned === undefined")
    finally:
        stop(proc)
