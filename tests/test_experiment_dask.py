"""rtvirt experiment --cluster on a real Dask cluster: a scheduler and two workers started as separate processes
on 127.0.0.1 (as a lab would start them); one worker is killed mid-run and nothing is lost: the records equal
the local run's for the same seed. `rtvirt design --cluster` then designs on the surviving worker, and
`rtvirt sim --sweep --cluster` simulates there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run_cli

from rtvirt.experiment import read_records

DASK = [str(Path(sys.executable).with_name("dask"))]
EXPERIMENT = """
name = "on-dask"
seed = 3
[grid]
utilization = [0.3, 0.6, 0.9]
vms = 3
tasks_per_vm = 3
[samples]
count = 80
chunk = 4
[questions]
schedulers = ["fifo-deferrable", "deadline"]
"""


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    # Dask's scratch directory (lock files it leaves) goes beside the log rather than in /tmp
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "DASK_TEMPORARY_DIRECTORY": str(log.parent)})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def cluster(tmp_path: Path):
    scheduler_file = tmp_path / "scheduler.json"
    procs = [_start([*DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                     "--scheduler-file", str(scheduler_file), "--no-show"], tmp_path / "scheduler.log")]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scheduler_file.exists(), (tmp_path / "scheduler.log").read_text()
        for n in range(2):
            procs.append(_start([*DASK, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                                 "--nworkers", "1", "--host", "127.0.0.1", "--dashboard-address", ":0",
                                 "--no-nanny", "--name", f"w{n}"], tmp_path / f"worker{n}.log"))
        from distributed import Client

        with Client(scheduler_file=str(scheduler_file), timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield scheduler_file, procs
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_cluster_run_equals_local_run_and_survives_a_killed_worker(tmp_path: Path, cluster) -> None:
    scheduler_file, procs = cluster
    path = tmp_path / "exp.toml"
    path.write_text(EXPERIMENT)
    results = tmp_path / "on-cluster"
    run = subprocess.Popen([sys.executable, "-m", "rtvirt", "experiment", str(path), "--results", str(results),
                            "--cluster", str(scheduler_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(results.glob("runs/*/records/*.parquet"))) < 4:
        time.sleep(0.05)
    written_before_kill = len(list(results.glob("runs/*/records/*.parquet")))
    os.killpg(procs[1].pid, signal.SIGKILL)  # a worker dies with chunks in hand
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err
    assert 4 <= written_before_kill < 60  # the kill landed mid-run (60 chunks in all)
    local = run_cli("experiment", str(path), "--results", str(tmp_path / "local"), "--workers", "2", timeout=600)
    assert local.returncode == 0, local.stderr
    on_cluster = read_records(next((results / "runs").iterdir()))
    assert on_cluster.num_rows == 3 * 80 * 2
    assert on_cluster.equals(read_records(next((tmp_path / "local" / "runs").iterdir())))
    # `rtvirt design` farms its schedulers out to the same cluster (its one surviving worker) and designs alike
    model = str(Path(__file__).parents[1] / "examples" / "models" / "rtxen-servers.toml")
    designs = []
    for where in (["--cluster", str(scheduler_file)], []):
        result = run_cli("design", model, "-s", "rtds", "-s", "fifo-periodic", "-s", "arinc653", "--json",
                         "--results", str(tmp_path / "designs"), *where, timeout=300)
        assert result.returncode == 0, result.stderr
        designs.append(json.loads(result.stdout)["designs"])
    assert designs[0] == designs[1] and [d["scheduler"] for d in designs[0]] == ["rtds", "fifo-periodic", "arinc653"]
    # `rtvirt sim --sweep --cluster`: the values simulated on the cluster, each run written here, equal the
    # values simulated one after the other in this process (every job kept: the stored jobs are compared)
    swept = []
    for where in (["--cluster", str(scheduler_file)], []):
        result = run_cli("sim", model, "-D", "0.2", "--sweep", "vm.low.load=0,0.3", "--json", "--results",
                         str(tmp_path / "swept"), *where, timeout=300)
        assert result.returncode == 0, result.stderr
        swept.append(json.loads(result.stdout)["runs"])
    assert [r["sweep"] for r in swept[0]] == [{"vm.low.load": 0}, {"vm.low.load": 0.3}]
    assert [{k: v for k, v in r.items() if k not in ("run_id", "path")} for r in swept[0]] == \
        [{k: v for k, v in r.items() if k not in ("run_id", "path")} for r in swept[1]]
    for on_cluster, here in zip(swept[0], swept[1], strict=True):
        jobs = [pq.read_table(Path(r["path"]) / "samples.parquet") for r in (on_cluster, here)]
        assert jobs[0].num_rows > 0 and jobs[0].equals(jobs[1])
