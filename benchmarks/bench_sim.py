"""Simulator speed against SimSo 0.8.5 on the same flat task set (10 periodic tasks, EDF, one CPU), both run
here side by side (SimSo lives in .cache/simso-venv, SimPy 2.3.1):

- end to end: `rtvirt sim MODEL.toml` as a user runs it (a new process: imports, model, simulation, every job
  written to the results store, summary printed), jobs/s against SimSo's jobs/s; goal >= 1000x;
- the compiled core alone (model in, the core's chunks of job columns out, in this process), for reference;
- the 8-VM hierarchical model (examples/models/eight-vms-rtds.toml) for 1 h, end to end; goal <= 2 s.

    .venv/bin/python benchmarks/bench_sim.py [--skip-simso] [--durations 1000,10000]
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

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
RTVIRT = Path(sys.executable).with_name("rtvirt")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rtvirt.model import model_from_dict  # noqa: E402
from rtvirt.sim import simulate  # noqa: E402

# 10 periodic tasks, utilisation 0.8, implicit deadlines; (period ms, wcet ms) exact in binary floats for SimSo
FLAT = [(5, 0.5), (6, 0.5), (8, 0.75), (10, 0.75), (12, 1.0), (15, 1.25), (20, 1.5), (25, 1.75), (40, 2.5),
        (50, 3.0)]


def flat_document(seconds: int) -> dict:
    return {
        "name": "flat",
        "simulation": {"duration": f"{seconds}s"},
        "hypervisor": {"scheduler": "partitioned"},
        "vm": [{"name": "flat", "scheduler": "edf", "vcpu": [{"affinity": [0]}],
                "task": [{"name": f"t{i}", "period": f"{p}ms", "execution": f"{c}ms"} for i, (p, c) in
                         enumerate(FLAT)]}],
    }


def core_only(seconds: int) -> tuple[int, float]:
    import pyarrow  # noqa: F401  (with numpy) before the clock starts: this figure is the core, not imports

    model = model_from_dict(flat_document(seconds))
    started = time.perf_counter()
    result = simulate(model)
    return sum(chunk["task"].size for chunk in result.job_chunks), time.perf_counter() - started


def end_to_end(model: Path, results: Path, *extra: str) -> tuple[dict, float]:
    """Wall time of `rtvirt sim` in a new process (summary table printed to a pipe) and its run's manifest."""
    started = time.perf_counter()
    output = subprocess.run([str(RTVIRT), "sim", str(model), "--results", str(results), *extra], check=True,
                            capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - started
    run_dir = output.rsplit(" written to ", 1)[1].split()[0]
    return json.loads((Path(run_dir) / "manifest.json").read_text()), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-simso", action="store_true", help="only measure rtvirt")
    parser.add_argument("--durations", default="1000,10000", help="simulated seconds of the end-to-end runs")
    args = parser.parse_args()
    simso_rate = None
    print(f"flat set: {len(FLAT)} periodic tasks, EDF, one CPU, U = {sum(c / p for p, c in FLAT):.2f}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (other work makes every figure below slower)")
    if not args.skip_simso:
        from simso_env import run_simso

        out = run_simso({"scheduler": "EDF", "duration_ms": 10_000, "tasks": [[p, c, 0] for p, c in FLAT]})
        simso_rate = len(out["jobs"]) / out["seconds"]
        print(f"  SimSo 0.8.5, 10 s simulated:  {len(out['jobs']):>10,} jobs in {out['seconds']:7.3f} s -> "
              f"{simso_rate:>12,.0f} jobs/s (its simulation call only)")

    def ratio(rate: float) -> str:
        return f"  = {rate / simso_rate:,.0f}x SimSo" if simso_rate else ""

    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        for seconds in (int(s) for s in args.durations.split(",")):
            model = Path(tmp) / f"flat-{seconds}.toml"
            model.write_text(tomli_w.dumps(flat_document(seconds)))
            manifest, elapsed = end_to_end(model, Path(tmp) / "results")
            jobs = manifest["simulation"]["jobs"]
            print(f"  rtvirt sim end to end, {seconds:>6} s simulated: {jobs:>10,} jobs in {elapsed:7.3f} s -> "
                  f"{jobs / elapsed:>12,.0f} jobs/s{ratio(jobs / elapsed)} (goal >= 1000x)")
        jobs, elapsed = core_only(1000)
        print(f"  core alone (in process),  1000 s simulated: {jobs:>10,} jobs in {elapsed:7.3f} s -> "
              f"{jobs / elapsed:>12,.0f} jobs/s{ratio(jobs / elapsed)}")
        manifest, elapsed = end_to_end(ROOT / "examples" / "models" / "eight-vms-rtds.toml", Path(tmp) / "results",
                                       "--duration", "1h")
        counters = manifest["simulation"]
        print(f"8-VM hierarchical model (rtds, 4 pCPUs), 1 h simulated end to end: {elapsed:.2f} s "
              f"({manifest['summary']['all']['samples']:,} stored records, {counters['jobs']:,} jobs with "
              f"background load, {counters['steps']:,} decision points); / 2 s goal: {elapsed / 2:.2f} "
              f"(goal <= 1.00: {'met' if elapsed <= 2 else 'NOT met'}); {counters['jobs'] / elapsed:,.0f} jobs/s"
              f"{ratio(counters['jobs'] / elapsed)}")


if __name__ == "__main__":
    main()
