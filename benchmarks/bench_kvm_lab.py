"""What a run costs in the KVM lab against a local TCG guest: the same short Linux-guest scenario (the timer
probe, RUNS runs of a few seconds, each in a fresh guest) through `rtvirt run` as a user types it, once with the
guests under QEMU's TCG on this machine (`kind = "qemu"`, `accel = "tcg"`) and once as libvirt domains under the
KVM lab's real KVM (`kind = "libvirt"`, `host = "lab"`: the lab booted in QEMU here, its KVM nested under TCG).

Prints the wall time of each campaign (guest boots included; the lab's own boot too, and apart), the per-run
cost of each (the lab's once it is booted) and their ratio. The goal: the lab's per-run cost, once booted, no
worse than TCG's. Timings here are TCG and nested TCG on a shared 2-core machine: not representative of KVM.

    .venv/bin/python benchmarks/bench_kvm_lab.py [--runs 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCENARIO = """name = "bench-kvm-lab-{label}"
duration = "{seconds}s"
repetitions = {runs}
run_timeout = "15m"
[workload]
probe = "timer"
params = {{ interval = "1ms" }}
[[environments]]
{environment}
"""
ENVIRONMENTS = {"tcg": 'kind = "qemu"\nname = "tcg"\naccel = "tcg"',
                "lab": 'kind = "libvirt"\nname = "lab"\nhost = "lab"\nboot_timeout = "10m"'}


def _campaign(label: str, runs: int, seconds: float, work: Path) -> tuple[float, dict[str, Any]]:
    """Wall time of `rtvirt run` of the scenario in ``label``'s environment, and its JSON summary."""
    scenario = work / f"{label}.toml"
    scenario.write_text(SCENARIO.format(label=label, seconds=seconds, runs=runs, environment=ENVIRONMENTS[label]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rtvirt", "run", "--no-report", str(scenario), "--out",
                           str(work / "results"), "--no-progress", "--json"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{label}: rtvirt run exited {done.returncode}: {done.stderr[-2000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{"):])
    failed = [key for key, run in summary["runs"].items() if run["status"] != "complete"]
    if failed:
        raise SystemExit(f"{label}: runs not complete: {failed}")
    return wall, summary


def _lab_boot_seconds(summary: dict[str, Any], results: Path) -> float:
    run_id = next(iter(summary["runs"].values()))["run_id"]
    manifest = json.loads((results / "runs" / run_id / "manifest.json").read_text())
    return float(manifest["environment_detail"]["kvm_lab"]["boot_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each campaign (fresh guests)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time of each run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-kvm-lab-") as directory:
        work = Path(directory)
        load = os.getloadavg()[0]
        tcg_wall, _ = _campaign("tcg", args.runs, args.seconds, work)
        lab_wall, lab = _campaign("lab", args.runs, args.seconds, work)
        boot = _lab_boot_seconds(lab, work / "results")
    tcg_run, lab_run = tcg_wall / args.runs, (lab_wall - boot) / args.runs
    print(f"{args.runs} runs of {args.seconds:g} s, a Linux guest each (load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end; TCG and nested TCG: not representative of KVM)")
    print(f"  local TCG guests (qemu, accel tcg):   {tcg_wall:7.1f} s wall, {tcg_run:6.1f} s a run")
    print(f"  KVM lab guests (libvirt, host = lab): {lab_wall:7.1f} s wall, lab boot {boot:.1f} s, "
          f"{lab_run:6.1f} s a run once booted")
    ratio = lab_run / tcg_run
    print(f"  ratio, a run in the lab / a local TCG run: {ratio:.2f}")
    print(f"goal: the lab's per-run cost no worse than TCG's (ratio <= 1.00): {'MET' if ratio <= 1.0 else 'NOT MET'}")


if __name__ == "__main__":
    main()
