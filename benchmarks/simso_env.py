"""SimSo 0.8.5 as a reference: its own virtual environment (it needs SimPy 2.3.1) and a runner around it."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "simso-venv"
RUNNER = Path(__file__).resolve().parent / "simso_runner.py"
PACKAGES = ["simso==0.8.5", "simpy==2.3.1"]


def ensure_simso() -> Path:
    """The venv's python, creating the venv on first use; raises RuntimeError with pip's output on failure."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import simso, SimPy"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    # the system python3, not rtvirt's venv: SimSo's environment must not see rtvirt's packages
    for command in (["python3", "-m", "venv", str(VENV)], [str(python), "-m", "pip", "install", "-q", *PACKAGES]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return python


def run_simso(spec: dict[str, Any]) -> dict[str, Any]:
    """Run simso_runner.py on ``spec`` (see its docstring) and return its output."""
    python = ensure_simso()
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.json", Path(tmp) / "out.json"
        source.write_text(json.dumps(spec))
        subprocess.run([str(python), str(RUNNER), str(source), str(target)], check=True, timeout=900,
                       capture_output=True)
        return json.loads(target.read_text())
