"""What a run costs in the KVM lab against a local TCG guest: the same short Linux-guest scenario (the timer
probe, RUNS runs of a few seconds, each in a fresh guest) through `rtvirt run` as a user types it, once with the
guest under QEMU's TCG on this machine (`kind = "qemu"`, `accel = "tcg"`) and once under the KVM lab's real KVM
(`kind = "qemu"`, `host = "lab"`: the lab booted in QEMU here, its KVM nested under TCG; rtvirt's own QEMU
command line run in the lab over SSH). `--libvirt` adds the same runs as libvirt domains in the lab
(`kind = "libvirt"`, `host = "lab"`), for the record.

Prints the wall time of each campaign (guest boots included; the lab's own boot too, and apart), the per-run
cost of each (the lab's once it is booted: the campaign's wall time less the lab's boot, over the runs; and the
steady cost, the time between the ends of consecutive runs, which leaves out the first run's upload of the
guest's kernel into the lab) and their ratio. The goal: the lab's per-run cost, once booted, no worse than
TCG's. Timings here are TCG and nested TCG on a shared 2-core machine: not representative of KVM.

    .venv/bin/python benchmarks/bench_kvm_lab.py [--runs 3] [--seconds 3] [--libvirt]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
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
                "lab": 'kind = "qemu"\nname = "lab"\nhost = "lab"\nboot_timeout = "10m"',
                "libvirt": 'kind = "libvirt"\nname = "lab"\nhost = "lab"\nboot_timeout = "10m"'}
TITLES = {"tcg": "local TCG guests (qemu, accel tcg)", "lab": "KVM lab guests (qemu, host = lab)",
          "libvirt": "KVM lab domains (libvirt, host = lab)"}


def _campaign(label: str, runs: int, seconds: float, work: Path) -> tuple[float, list[dict[str, Any]]]:
    """Wall time of `rtvirt run` of the scenario in ``label``'s environment, and its runs' manifests in order."""
    scenario = work / f"{label}.toml"
    scenario.write_text(SCENARIO.format(label=label, seconds=seconds, runs=runs, environment=ENVIRONMENTS[label]))
    results = work / f"results-{label}"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rtvirt", "run", "--no-report", str(scenario), "--out",
                           str(results), "--no-progress", "--json"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=7200)
    wall = time.monotonic() - started
    # exit 1 with every run complete or short: a TCG guest's timer overruns periods on a loaded host, which
    # costs samples, not time; what is measured here is time
    summary = json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else None
    if done.returncode not in (0, 1) or summary is None:
        raise SystemExit(f"{label}: rtvirt run exited {done.returncode}: {done.stderr[-2000:]}")
    failed = [key for key, run in summary["runs"].items() if run["status"] not in ("complete", "short")]
    if failed:
        raise SystemExit(f"{label}: runs that did not run to their end: {failed}: {done.stderr[-2000:]}")
    manifests = [json.loads((results / "runs" / run["run_id"] / "manifest.json").read_text())
                 for run in summary["runs"].values()]
    return wall, sorted(manifests, key=lambda m: m["created"])


def _steady(manifests: list[dict[str, Any]]) -> float | None:
    """Seconds between the ends of consecutive runs (a run's whole cost once the first has set everything up)."""
    ends = [datetime.fromisoformat(m["created"]).timestamp() for m in manifests]
    gaps = [later - earlier for earlier, later in itertools.pairwise(ends)]
    return sum(gaps) / len(gaps) if gaps else None


def _row(label: str, runs: int, wall: float, manifests: list[dict[str, Any]]) -> float:
    """Print one campaign's line; its per-run cost (the lab's once booted)."""
    detail = manifests[0]["environment_detail"]
    boot = float(detail["kvm_lab"]["boot_seconds"]) if "kvm_lab" in detail else 0.0
    per_run = (wall - boot) / runs
    steady = _steady(manifests)
    guest_boots = [m["environment_detail"].get("boot_seconds") for m in manifests]
    lab = f", lab boot {boot:.1f} s" if boot else ""
    print(f"  {TITLES[label]:40} {wall:7.1f} s wall{lab}, {per_run:6.1f} s a run"
          + (" once booted" if boot else "") + (f" (steady {steady:.1f} s)" if steady is not None else "")
          + f"; guest boots {', '.join(f'{b:.1f}' for b in guest_boots if b is not None)} s")
    return steady if steady is not None else per_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each campaign (fresh guests)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement time of each run")
    parser.add_argument("--libvirt", action="store_true", help="also the runs as libvirt domains in the lab")
    args = parser.parse_args()
    labels = ["tcg", "lab", *(["libvirt"] if args.libvirt else [])]
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-kvm-lab-") as directory:
        load = os.getloadavg()[0]
        measured = {label: _campaign(label, args.runs, args.seconds, Path(directory)) for label in labels}
    print(f"{args.runs} runs of {args.seconds:g} s, a Linux guest each (load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end; TCG and nested TCG: not representative of KVM)")
    cost = {label: _row(label, args.runs, *measured[label]) for label in labels}
    for label in labels[1:]:
        print(f"  ratio, a run of {TITLES[label]} / a local TCG run: {cost[label] / cost['tcg']:.2f}")
    ratio = cost["lab"] / cost["tcg"]
    print(f"goal: the lab's per-run cost no worse than TCG's (ratio <= 1.00): {'MET' if ratio <= 1.0 else 'NOT MET'}")


if __name__ == "__main__":
    main()
