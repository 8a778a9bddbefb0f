"""The suite's own clean-up: a pytest stopped with SIGTERM (`timeout`, a cancelled CI job) stops the rtvirt its test
started, as Ctrl-C does (tests/conftest.py). A pytest killed by `timeout` once left a docs example's campaign
running with two KVM labs for minutes. And a session fails when something it started outlives it, but not for
its own command line (`pytest tests/test_experiment_dask.py` names a kind the check looks for)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import live_processes

TESTS = Path(__file__).parent


def _processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (the rtvirt run_cli started, and its agent)."""
    found = []
    for pid, _ in live_processes():
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_suite_stopped_with_sigterm_stops_the_rtvirt_its_test_started(tmp_path: Path) -> None:
    marker = f"--duration=3{os.getpid() % 1000:03d}s"  # a long run, and a command line to find it by
    (tmp_path / "test_long.py").write_text(
        "from conftest import run_cli\n\n\n"
        f"def test_long():\n    run_cli('stress', 'cpu', '--workers=1', '{marker}', timeout=3600)\n")
    suite = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "--rootdir", str(tmp_path), str(tmp_path / "test_long.py")],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not _processes_with(marker):
        assert suite.poll() is None and time.monotonic() < deadline, suite.communicate()[0][-2000:]
        time.sleep(0.1)
    suite.send_signal(signal.SIGTERM)
    out, _ = suite.communicate(timeout=60)
    assert suite.returncode != 0 and "KeyboardInterrupt" in out, out[-2000:]
    deadline = time.monotonic() + 30
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == [], out[-2000:]


def _inner_suite(tmp_path: Path, name: str, body: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of one test file ``name`` with this suite's conftest.py as its plugin, as make test runs."""
    (tmp_path / name).write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "conftest", "--rootdir", str(tmp_path), str(tmp_path / name)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)}, capture_output=True,
                          text=True, timeout=300)


def test_a_session_whose_own_command_line_names_a_kind_passes(tmp_path: Path) -> None:
    done = _inner_suite(tmp_path, "test_dask_over_sshd.py", "def test_nothing_left():\n    assert True\n")
    assert done.returncode == 0 and "outlive" not in done.stdout, done.stdout[-2000:]


def test_a_process_a_test_leaves_running_fails_the_session(tmp_path: Path) -> None:
    marker = f"rtvirt-stress-left-{os.getpid()}"
    try:
        done = _inner_suite(tmp_path, "test_leaves_one.py", "import subprocess, sys\n\n\ndef test_leaves_one():\n"
                            "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
                            f"'{marker}'])\n")
        assert done.returncode != 0 and "outlive it" in done.stdout and marker in done.stdout, done.stdout[-2000:]
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)
