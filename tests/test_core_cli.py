"""The command line as users meet it: exit codes and messages for bad input, JSON output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-i", "5us"], "-i/--interval"),
        (["-i", "fast"], "-i/--interval"),
        (["-D", "-3"], "-D/--duration"),
        (["-p", "120"], "-p/--priority"),
        (["-t", "0"], "-t/--threads"),
        (["-a", "1-0"], "-a/--affinity"),
        (["-a", "4095"], "-a/--affinity"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], named: str, results_dir: Path) -> None:
    result = run_cli("probe", "timer", *args, "--results", str(results_dir))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "Traceback" not in result.stderr


def test_cpu_that_does_not_exist(results_dir: Path) -> None:
    cpu = max(os.sched_getaffinity(0)) + 1
    result = run_cli("probe", "timer", "-a", str(cpu), "-D", "1s", "--results", str(results_dir))
    assert result.returncode == 2
    assert f"CPU {cpu} does not exist" in result.stderr and "Traceback" not in result.stderr


def test_unknown_probe(results_dir: Path) -> None:
    result = run_cli("probe", "nosuchprobe")
    assert result.returncode == 2 and "nosuchprobe" in result.stderr


def test_json_summary_fields(results_dir: Path) -> None:
    result = run_cli("probe", "timer", "-D", "500ms", "-i", "1ms", "-t", "2", "--json", "--results",
                     str(results_dir), check=True)
    document = json.loads(result.stdout)
    assert document["status"] == "complete" and document["dropped"] == 0
    fields = {"samples", "dropped", "min_ns", "q1_ns", "median_ns", "mean_ns", "q3_ns", "p99_ns", "p999_ns",
              "p9999_ns", "max_ns", "stdev_ns", "lower_whisker_ns", "upper_whisker_ns", "max_jitter_ns"}
    assert set(document["summary"]) == {"thread 0", "thread 1", "all"}
    for summary in document["summary"].values():
        assert fields <= set(summary)
        assert summary["min_ns"] <= summary["median_ns"] <= summary["max_ns"]
    total = document["summary"]["all"]["samples"]
    assert total == document["summary"]["thread 0"]["samples"] + document["summary"]["thread 1"]["samples"]
    run_dir = Path(document["path"])
    assert {"manifest.json", "samples.rtvs", "samples.parquet"} <= {p.name for p in run_dir.iterdir()}


def test_help_everywhere() -> None:
    for args in (["--help"], ["probe", "--help"], ["probe", "timer", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "Usage" in result.stdout


def test_no_rt_runs_without_privilege() -> None:
    # Drop to an unprivileged user where we are root; --no-rt must still measure.
    if os.geteuid() != 0:
        pytest.fail("this test needs root to prepare an unprivileged user")
    results_dir = Path(tempfile.mkdtemp(prefix="rtvirt-nobody-"))
    os.chmod(results_dir, 0o777)
    env = {**os.environ, "HOME": "/tmp"}
    base = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "rtvirt"]
    refused = subprocess.run([*base, "probe", "timer", "-D", "200ms", "--results", str(results_dir)],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "--no-rt" in refused.stderr
    allowed = subprocess.run([*base, "probe", "timer", "-D", "300ms", "--no-rt", "--json", "--results",
                              str(results_dir)], capture_output=True, text=True, env=env, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["summary"]["all"]["samples"] > 100
    shutil.rmtree(results_dir)


def test_setup_takes_parts_and_refuses_an_unknown_one_naming_it() -> None:
    """`make run` installs the main job's part only, `make test` all of them; an unknown part is bad input."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([str(root / "scripts" / "setup.sh"), "libvirt", "hypervisors"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "unknown part 'hypervisors'" in done.stderr
    makefile = (root / "Makefile").read_text()
    assert "scripts/setup.sh main" in makefile and "scripts/setup.sh all" in makefile
