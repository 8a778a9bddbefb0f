"""Campaigns that several tests run with the same command line, run once per test session for every xdist worker:
a lock and a directory in the workers' common temporary directory hold the campaign's results directory, its
output and its exit status. tests/test_studies.py (the whole studies at a small scale) and
tests/test_docs_examples.py (the same command lines as README.md and docs/studies.md show them) share them."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class SharedRun:
    results: Path  # the campaign's results directory (read it, or copy it before writing next to it)
    output: str  # stdout and stderr together, in order
    status: int


class Memo:
    """Work done once for the session, whichever worker asks first; the others wait for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, make: Callable[[Path], None]) -> Path:
        place = self.root / hashlib.sha256(key.encode()).hexdigest()[:16]
        with (self.root / f"{place.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (place / "done").exists():
                subprocess.run(["rm", "-rf", str(place)], check=True)
                place.mkdir()
                make(place)
                (place / "done").write_text(key)
        return place


def session_memo(tmp_path_factory: pytest.TempPathFactory) -> Memo:
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's basetemp is one level below the session's
        shared = shared.parent
    return Memo(shared / "shared-runs")


def campaign_argv(names: list[str], scale: float | str | None, repetitions: int | str | None) -> list[str]:
    """The one spelling of a campaign's command line, whoever asks for it (results in ./results)."""
    argv = ["rtvirt", "run", *names, "--out", "results"]
    if scale is not None:
        argv += ["--scale", f"{float(scale):.6g}"]
    if repetitions is not None:
        argv += ["--repetitions", str(repetitions)]
    return argv


def shared_campaign(memo: Memo, argv: list[str], timeout: float = 1200) -> SharedRun:
    """``argv`` (from campaign_argv) run once for the session in a directory of its own, as a user would type it."""
    def make(place: Path) -> None:
        work = place / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("RTVIRT_RESULTS", "COLUMNS", "LINES", "FORCE_COLOR")}
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.Popen(["bash", "-c", shlex.join(argv)], cwd=work, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except BaseException:  # a timeout, or the test session stopped: the campaign stops with it (its clean-up)
            os.killpg(proc.pid, 15)
            proc.communicate(timeout=120)
            raise
        (place / "output").write_text(out)
        (place / "status").write_text(str(proc.returncode))

    place = memo.get(shlex.join(argv), make)
    return SharedRun(place / "work" / "results", (place / "output").read_text(), int((place / "status").read_text()))
