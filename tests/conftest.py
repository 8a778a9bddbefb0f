"""Shared fixtures: the rtvirt command as users run it (installed entry point, real agents)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RTVIRT = [sys.executable, "-m", "rtvirt"]


def run_cli(
    *args: str, timeout: float = 120, check: bool = False, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run `rtvirt ARGS...` in a subprocess, as a user would."""
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run([*RTVIRT, *args], capture_output=True, text=True, timeout=timeout, env=env,
                            **kwargs)  # type: ignore[call-overload]
    if check and result.returncode != 0:
        raise AssertionError(f"rtvirt {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"
