"""CLI start-up: `rtvirt --help` and `rtvirt --version` against `python -c "import click"` (goal: within 1.5x),
each started as a new process, alternating, median of N runs; also what `import rtvirt.cli` pulls in.

    .venv/bin/python benchmarks/bench_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

RTVIRT = Path(sys.executable).with_name("rtvirt")
HEAVY = ("rich", "pydantic", "numpy", "pyarrow", "duckdb", "matplotlib", "asyncssh", "libvirt")


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    commands = {
        "python -c 'import click'": [sys.executable, "-c", "import click"],
        "rtvirt --help": [str(RTVIRT), "--help"],
        "rtvirt --version": [str(RTVIRT), "--version"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for command in commands.values():  # warm the page cache once
        wall(command)
    for _ in range(args.runs):
        for name, command in commands.items():
            times[name].append(wall(command))
    reference = statistics.median(times["python -c 'import click'"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:26} median {median * 1e3:6.1f} ms  min {min(values) * 1e3:6.1f} ms  "
              f"ratio {median / reference:4.2f}" + ("  (goal <= 1.50)" if name.startswith("rtvirt") else ""))
    probe = ("import sys, rtvirt.cli; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules) or 'none')")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    print(f"heavy modules imported by `import rtvirt.cli`: {loaded.strip()}")


if __name__ == "__main__":
    main()
