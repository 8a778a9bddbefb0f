"""Simulator speed: jobs per second of rtvirt's compiled core against SimSo 0.8.5 on the same flat task set
(10 periodic tasks, EDF, one CPU, 10 s simulated; goal >= 1000x), and an 8-VM hierarchical model simulated for
1 h (goal <= 10 s). Both tools run here, side by side; SimSo lives in .cache/simso-venv (SimPy 2.3.1).

    .venv/bin/python benchmarks/bench_sim.py [--skip-simso]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rtvirt.model import load_model, model_from_dict  # noqa: E402
from rtvirt.sim import simulate  # noqa: E402

# 10 periodic tasks, utilisation 0.8, implicit deadlines; (period ms, wcet ms) exact in binary floats for SimSo
FLAT = [(5, 0.5), (6, 0.5), (8, 0.75), (10, 0.75), (12, 1.0), (15, 1.25), (20, 1.5), (25, 1.75), (40, 2.5),
        (50, 3.0)]


def flat_model(seconds: int) -> object:
    return model_from_dict({
        "simulation": {"duration": f"{seconds}s"},
        "hypervisor": {"scheduler": "partitioned"},
        "vm": [{"name": "flat", "scheduler": "edf", "vcpu": [{"affinity": [0]}],
                "task": [{"name": f"t{i}", "period": f"{p}ms", "execution": f"{c}ms"} for i, (p, c) in
                         enumerate(FLAT)]}],
    })


def ours(seconds: int, repeat: int) -> tuple[int, float]:
    model = flat_model(seconds)
    best = float("inf")
    jobs = 0
    for _ in range(repeat):
        started = time.perf_counter()
        result = simulate(model)
        best = min(best, time.perf_counter() - started)
        jobs = result.jobs.num_rows
    return jobs, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-simso", action="store_true", help="only measure rtvirt")
    args = parser.parse_args()
    print(f"flat set: {len(FLAT)} periodic tasks, EDF, one CPU, U = {sum(c / p for p, c in FLAT):.2f}")
    jobs10, t10 = ours(10, 20)
    print(f"  rtvirt  10 s simulated:   {jobs10:>9} jobs in {t10 * 1e3:8.2f} ms  -> {jobs10 / t10:>13,.0f} jobs/s"
          " (whole call: model in, Arrow tables out)")
    jobs1k, t1k = ours(1000, 3)
    ours_rate = jobs1k / t1k
    print(f"  rtvirt 1000 s simulated:  {jobs1k:>9} jobs in {t1k * 1e3:8.2f} ms  -> {ours_rate:>13,.0f} jobs/s")
    if not args.skip_simso:
        from simso_env import run_simso

        out = run_simso({"scheduler": "EDF", "duration_ms": 10_000, "tasks": [[p, c, 0] for p, c in FLAT]})
        simso_jobs = len(out["jobs"])
        simso_rate = simso_jobs / out["seconds"]
        print(f"  SimSo 0.8.5 10 s simulated: {simso_jobs:>7} jobs in {out['seconds'] * 1e3:8.2f} ms  -> "
              f"{simso_rate:>13,.0f} jobs/s")
        print(f"  speed-up: {jobs10 / t10 / simso_rate:,.0f}x (10 s runs), {ours_rate / simso_rate:,.0f}x "
              f"(rtvirt 1000 s run); goal >= 1000x")
    model = load_model(ROOT / "examples" / "models" / "eight-vms-rtds.toml")
    started = time.perf_counter()
    result = simulate(model, duration_ns=3_600 * 1_000_000_000)
    elapsed = time.perf_counter() - started
    print(f"8-VM hierarchical model (rtds, 4 pCPUs, {len(result.vcpu_names)} vCPUs): 1 h simulated in "
          f"{elapsed:.2f} s ({result.jobs.num_rows:,} recorded jobs, {result.counters['jobs']:,} jobs with "
          f"background load, {result.counters['steps']:,} decision points); goal <= 10 s")


if __name__ == "__main__":
    main()
