"""Every probe end to end: through the library (run_probe) and the CLI, bad input, interruption.

Runs are short (about a second each) and pinned to the second CPU where there is one; figures are
only checked for sense (positive, ordered, the right kinds), timing goals live in benchmarks/.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RTVIRT, run_cli

from rtvirt.errors import InputError
from rtvirt.probes import PROBES
from rtvirt.probes.runner import run_probe
from rtvirt.stream import read_stream

CPUS = sorted(os.sched_getaffinity(0))
CPU = CPUS[-1]
OTHER_CPU = CPUS[0]

# Library parameters (and the matching CLI options) for a short run of each probe. The probes that keep their CPU
# busy (gap, workload, selftest) run below SCHED_FIFO 99: another test's measuring thread at 99 on that CPU (in the
# parallel phase) is then not held off for their whole run.
SHORT_RUNS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "gap": ({"duration": "1s", "affinity": [CPU], "priority": 80},
            ["-D", "1s", "-a", str(CPU), "-p", "80"]),
    "kops": ({"affinity": [CPU], "iterations": 200}, ["-a", str(CPU), "--iterations", "200"]),
    "workload": ({"duration": "1s", "affinity": [CPU], "kernel": "bitcount", "priority": 80},
                 ["-D", "1s", "-a", str(CPU), "--kernel", "bitcount", "-p", "80"]),
    "threadmetric": ({"duration": "1s", "report_interval": "200ms", "affinity": [CPU]},
                     ["-D", "1s", "--report-interval", "200ms", "-a", str(CPU)]),
    "wakeup": ({"loops": 500, "interval": "1ms", "affinity": [CPU], "sender_cpu": OTHER_CPU},
               ["-l", "500", "-i", "1ms", "-a", str(CPU), "--sender-cpu", str(OTHER_CPU)]),
    "selftest": ({"duration": "500ms", "rate": 100_000, "affinity": [CPU], "priority": 80},
                 ["-D", "500ms", "--rate", "100000", "-a", str(CPU), "-p", "80"]),
}
KINDS = {
    "gap": {"gap"},
    "kops": {"yield_switch", "sem_switch", "sem_noswitch", "mutex_lock_unlock", "thread_create", "thread_first_run",
             "thread_join", "msgq_switch", "msgq_noswitch", "event_switch", "malloc_free"},
    "workload": {"bitcount"},
    "threadmetric": {"rounds"},
    "wakeup": {"wakeup"},
    "selftest": {"push"},
}

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="the probe tests need two CPUs (wakeup's sender and receiver)")


def test_all_probes_are_registered_in_both_registries() -> None:
    from rtvirt.agents import agent_path

    listed = subprocess.run([str(agent_path("rtvirt-probe")), "--list"], capture_output=True, text=True, check=True)
    assert set(listed.stdout.split()) == set(PROBES) == {"timer", *SHORT_RUNS}


# threadmetric must report 4-5 times in its short run: beside other workers' guests it once reported once
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.quiet) if name == "threadmetric" else name
                                  for name in sorted(SHORT_RUNS)])
def test_probe_runs_through_the_library(name: str, tmp_path: Path) -> None:
    spec = PROBES[name]
    stream = run_probe(spec, spec.params(**SHORT_RUNS[name][0]), tmp_path / "samples.rtvs")
    assert stream.end_reason == "complete" and stream.error is None
    assert stream.total_dropped == 0
    records = stream.records
    assert records.size > 0
    assert {stream.kind_name(int(k)) for k in np.unique(records["kind"])} == KINDS[name]
    assert (records["value"] >= 0).all()
    assert read_stream(tmp_path / "samples.rtvs").records.size == records.size  # the file holds them all
    checks = {
        "gap": lambda: (records["value"] >= 990).all() and 0 < stream.stats[(0, "cpu_share_ppm")] <= 1_000_000,
        "kops": lambda: all((records["kind"] == k).sum() == 200 for k in range(11) if k != 0)
        and (records["kind"] == 0).sum() == 200,
        "workload": lambda: (records["aux"] > 0).all() and (records["cpu"] == CPU).all(),
        "threadmetric": lambda: records.size in (4, 5) and (records["value"] > 0).all()
        and stream.stats[(0, "counter_spread")] == 0,
        "wakeup": lambda: records.size == 500 and (records["cpu"] == CPU).all()
        and stream.stats[(0, "sender_cpu")] == OTHER_CPU,
        "selftest": lambda: records.size <= 50_001 and abs(np.median(records["value"]) - 10_000) < 1_000,
    }
    assert checks[name](), f"{name}: {records[:5]} {stream.stats}"


@pytest.mark.parametrize("name", sorted(SHORT_RUNS))
def test_probe_runs_through_the_cli(name: str, results_dir: Path) -> None:
    result = run_cli("probe", name, *SHORT_RUNS[name][1], "--json", "--results", str(results_dir), check=True)
    document = json.loads(result.stdout)
    assert document["probe"] == name and document["status"] == "complete" and document["dropped"] == 0
    overall = document["summary"]["all"]
    assert overall["samples"] > 0 and overall["min_ns"] <= overall["median_ns"] <= overall["max_ns"]
    if name == "kops":  # one summary per operation
        assert set(document["summary"]) == KINDS["kops"] | {"all"}
    manifest = json.loads((Path(document["path"]) / "manifest.json").read_text())
    assert manifest["stream_header"]["probe"] == name


def test_gap_work_mode_times_every_unit(tmp_path: Path) -> None:
    spec = PROBES["gap"]
    stream = run_probe(spec, spec.params(work=True, work_unit=5000, loops=2000, duration=0, affinity=[CPU],
                                         priority=80), tmp_path / "s.rtvs")
    records = stream.records
    assert records.size == 2000 and {stream.kind_name(int(k)) for k in records["kind"]} == {"work"}
    assert np.median(records["value"]) > 0 and (records["aux"] > 0).all()


@pytest.mark.parametrize("kernel", ["qsort", "basicmath"])
def test_workload_kernels(kernel: str, tmp_path: Path) -> None:
    spec = PROBES["workload"]
    stream = run_probe(spec, spec.params(kernel=kernel, loops=5, duration=0, affinity=[CPU]), tmp_path / "s.rtvs")
    assert stream.end_reason == "complete" and stream.records.size == 5  # qsort checks its own output is sorted


def test_bigger_qsort_takes_longer(tmp_path: Path) -> None:
    spec = PROBES["workload"]
    small, big = (run_probe(spec, spec.params(kernel="qsort", size=size, loops=9, duration=0, affinity=[CPU]),
                            tmp_path / f"{size}.rtvs") for size in (150_000, 1_200_000))
    assert np.median(big.records["value"]) > 4 * np.median(small.records["value"])


def test_timer_cyclictest_engine_is_the_default(tmp_path: Path) -> None:
    spec = PROBES["timer"]
    stream = run_probe(spec, spec.params(duration="300ms", affinity=[CPU]), tmp_path / "s.rtvs")
    assert stream.header["params"]["engine"] == "cyclictest" and stream.header["aux_field"] is None
    # every 1 ms period of its 300 ms is a sample or a skipped period (counted), counted from when its thread
    # began: a thread a busy machine kept waiting still measures its whole duration
    assert stream.end_reason == "complete"
    assert stream.records.size + stream.stats[(0, "overruns")] == 300, (stream.records.size, stream.stats)
    assert stream.records.size > 0 and stream.stats[(0, "start_delay_ns")] >= 0
    periods = np.diff(stream.records["t_ns"].astype(np.int64))
    assert (periods % 1_000_000 == 0).all() and (periods > 0).all()  # planned wakes on the thread's own grid


def _timerlat_available() -> bool:
    try:
        return "timerlat" in Path("/sys/kernel/tracing/available_tracers").read_text().split()
    except OSError:
        return False


def test_timer_timerlat_engine(tmp_path: Path, results_dir: Path) -> None:
    """Where the kernel has timerlat it must measure (IRQ part <= thread part); elsewhere exit 2 naming --engine."""
    if _timerlat_available():
        spec = PROBES["timer"]
        stream = run_probe(spec, spec.params(duration="1s", engine="timerlat", affinity=[CPU]), tmp_path / "s.rtvs")
        assert stream.header["aux_field"] == "irq_latency_ns" and stream.records.size > 500
        assert (stream.records["aux"].astype(np.int64) <= stream.records["value"]).all()
        return
    result = run_cli("probe", "timer", "--engine", "timerlat", "-D", "1s", "--results", str(results_dir))
    assert result.returncode == 2, result.stderr
    assert "--engine timerlat" in result.stderr and "no timerlat tracer" in result.stderr
    assert "Traceback" not in result.stderr
    spec = PROBES["timer"]
    with pytest.raises(InputError, match="--engine"):
        run_probe(spec, spec.params(duration="1s", engine="timerlat"), tmp_path / "s.rtvs")


def test_threadmetric_fails_loudly_when_counters_diverge(results_dir: Path) -> None:
    # Spread over two CPUs a resume cannot preempt the resumer: the chain's counters must drift apart.
    result = run_cli("probe", "threadmetric", "-D", "3s", "--report-interval", "200ms", "-a",
                     f"{OTHER_CPU},{CPU}", "--json", "--results", str(results_dir))
    assert result.returncode == 1, result.stderr
    assert "counters diverged" in result.stderr and "Traceback" not in result.stderr
    manifest = json.loads(next(results_dir.glob("runs/*/manifest.json")).read_text())
    assert manifest["end_reason"] == "error" and manifest["status"] == "partial"
    assert "counters diverged" in manifest["error"]


@pytest.mark.parametrize(
    ("name", "args", "named"),
    [
        ("gap", ["--threshold", "0"], "--threshold"),
        ("gap", ["--threshold", "soon"], "--threshold"),
        ("gap", ["--work-unit", "0"], "--work-unit"),
        ("kops", ["--iterations", "0"], "--iterations"),
        ("kops", ["-t", "2"], "-t/--threads"),
        ("kops", ["-p", "1"], "--priority"),
        ("workload", ["--kernel", "fft"], "--kernel"),
        ("workload", ["--size", "10"], "--size"),
        ("threadmetric", ["--report-interval", "0"], "--report-interval"),
        ("threadmetric", ["--no-rt"], "--priority"),
        ("wakeup", ["-i", "1ns"], "-i/--interval"),
        ("wakeup", ["--sender-cpu", "-1"], "--sender-cpu"),
        ("wakeup", ["--sender-cpu", str(CPU), "-a", str(CPU)], "--sender-cpu"),
        ("wakeup", ["-a", f"{OTHER_CPU},{CPU}"], "-a/--affinity"),
        ("selftest", ["--rate", "-5"], "--rate"),
        ("timer", ["--engine", "ftrace"], "--engine"),
    ],
)
def test_bad_options_exit_2_naming_the_option(name: str, args: list[str], named: str, results_dir: Path) -> None:
    result = run_cli("probe", name, *args, "--results", str(results_dir))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", sorted(SHORT_RUNS))
def test_nonexistent_cpu_exits_2(name: str, results_dir: Path) -> None:
    missing = max(CPUS) + 1
    option = "--sender-cpu" if name == "wakeup" else "-a"
    result = run_cli("probe", name, option, str(missing), "--results", str(results_dir))
    assert result.returncode == 2, result.stderr
    assert f"CPU {missing} does not exist" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "args", "sig"),
    [
        ("timer", ["-i", "1ms"], signal.SIGINT),
        ("timer", ["-i", "1ms"], signal.SIGTERM),
        ("gap", ["-p", "80"], signal.SIGINT),
        ("wakeup", ["-l", "0"], signal.SIGTERM),
        ("threadmetric", ["--report-interval", "100ms"], signal.SIGINT),
        ("workload", ["--kernel", "basicmath"], signal.SIGTERM),
    ],
)
def test_interrupt_keeps_samples_and_prints_summary(name: str, args: list[str], sig: signal.Signals,
                                                    results_dir: Path) -> None:
    proc = subprocess.Popen([*RTVIRT, "probe", name, "-D", "60s", "-a", str(CPU), *args, "--json", "--results",
                             str(results_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # signalled once samples flow: on a loaded machine 2 s were once not enough for threadmetric's first reports
    deadline, taken = time.monotonic() + 60, 0
    while taken <= 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
        streams = list(results_dir.glob("runs/*/samples.rtvs"))
        with contextlib.suppress(InputError):  # not yet past its header
            taken = read_stream(streams[0]).records.size if streams else 0
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # interrupted, as run and experiment report it (README, exit codes)
    assert err.strip().splitlines()[-1].startswith("rtvirt: interrupted"), err
    document = json.loads(out)
    assert document["status"] == "partial" and document["end_reason"] == "signal" and document["dropped"] == 0
    assert document["summary"]["all"]["samples"] > 3
    stream = read_stream(Path(document["path"]) / "samples.rtvs")
    assert stream.records.size == document["summary"]["all"]["samples"]
    # no agent left behind: its argv names its output under this test's results directory
    assert subprocess.run(["pgrep", "-f", f"out={results_dir}"], capture_output=True).returncode == 1
