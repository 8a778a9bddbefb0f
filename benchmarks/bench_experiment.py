"""Experiment throughput: systems per second per core for the analysis questions of one random 4-VM, 20-task
system (goal: >= 2,000 systems/s per core, analysis only), against rtvirt's own one-system path measured in
the same run, and the scaling from 1 to 2 local workers.

  analysis    the ``shared`` question under each scheduler on already drawn systems (the goal's "analysis
              only"), CPU time of this process: the fast path (experiment/fastpath.py) and the whole-model
              path (configure_model + analyse_model) on the same systems
  experiment  run_chunk in this process: draw the system, then the analysis questions, as a worker does
  reference   rtvirt's one-system analyze path on the same systems written out as model files, per scheduler:
              in process (load_model + analyse_model, what `rtvirt analyze` does after start-up) and through
              the CLI (`rtvirt analyze MODEL.toml`: what a hand-written loop around our CLI costs)
  scaling     `rtvirt experiment` of the same systems with --workers 1 and --workers 2 (wall time, whole command)

Prints each figure and the ratios (reference / experiment: how much faster the harness is than the loop;
experiment / goal: < 1 misses the goal). N machines with c cores each give about N·c times the per-core rate
while chunks outnumber workers (each chunk is independent; the driver only writes Parquet files).

    .venv/bin/python benchmarks/bench_experiment.py [--systems 300] [--reference 6] [--scaling 400]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rtvirt.analysis.deploy import model_toml
from rtvirt.analysis.design import configure_model
from rtvirt.analysis.system import analyse_model
from rtvirt.experiment.fastpath import fast_shared, prepare
from rtvirt.experiment.questions import run_chunk, shared_interfaces
from rtvirt.experiment.spec import parse_experiment
from rtvirt.experiment.systems import draw_plain, system_model
from rtvirt.model import load_model

GOAL_PER_CORE = 2000.0
SCHEDULERS = ["fifo-deferrable", "fifo-periodic", "rtds"]


def _plan(systems: int) -> dict:
    return {"name": "bench", "seed": 1, "grid": {"utilization": 0.6, "vms": 4, "tasks_per_vm": 5},
            "samples": {"count": systems, "chunk": max(1, systems // 8)}, "questions": {"schedulers": SCHEDULERS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", type=int, default=300)
    parser.add_argument("--reference", type=int, default=6, help="systems analysed through the CLI")
    parser.add_argument("--scaling", type=int, default=400, help="systems of the 1 -> 2 worker runs")
    args = parser.parse_args()
    plan = parse_experiment(_plan(args.systems), "bench")
    document = json.dumps(plan.model_dump(mode="json"))
    run_chunk(document, 0, 0, 1)  # imports and caches out of the clock
    point = plan.points()[0]
    drawn = [draw_plain(plan.seed, point, index) for index in range(args.systems)]
    asked = [(system, shared_interfaces(system, point.server_period, point.spare)) for system in drawn]
    started = time.process_time()
    for system, interfaces in asked:
        prepared = prepare(system, 0)
        for label in SCHEDULERS:
            fast_shared(label, system, [i for i in interfaces if i is not None], "fp", 0, 0, prepared,
                        verdict_only=True)
    fast_cpu = (time.process_time() - started) / args.systems
    models = [system_model(system, point, index, plan.questions) for index, system in enumerate(drawn)]
    started = time.process_time()
    for model, (_, interfaces) in zip(models, asked, strict=True):
        shared = {(f"vm{vm}", 0): i for vm, i in enumerate(interfaces) if i is not None}
        for label in SCHEDULERS:
            configure_model(model, label, shared)
    whole_cpu = (time.process_time() - started) / args.systems
    started, cpu = time.perf_counter(), time.process_time()
    run_chunk(document, 0, 0, args.systems)
    per_system = (time.perf_counter() - started) / args.systems
    chunk_cpu = (time.process_time() - cpu) / args.systems
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for index in range(args.reference):
            shared = {(f"vm{vm}", 0): i for vm, i in enumerate(asked[index][1]) if i is not None}
            for label in SCHEDULERS:
                design = configure_model(models[index], label, shared)
                assert design.model is not None
                path = Path(tmp) / f"s{index}-{label}.toml"
                path.write_text(model_toml(design.model))
                files.append(path)
        started = time.perf_counter()
        for path in files:
            analyse_model(load_model(path))
        in_process = (time.perf_counter() - started) / args.reference
        started = time.perf_counter()
        for path in files:
            subprocess.run([sys.executable, "-m", "rtvirt", "analyze", str(path), "--results", str(Path(tmp) / "r"),
                            "--json"], check=True, capture_output=True)
        reference = (time.perf_counter() - started) / args.reference
        spec = Path(tmp) / "bench.toml"
        import tomli_w

        spec.write_text(tomli_w.dumps(_plan(args.scaling)))
        walls = {}
        for workers in (1, 2):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rtvirt", "experiment", str(spec), "--results",
                            str(Path(tmp) / f"w{workers}"), "--workers", str(workers), "--json"], check=True,
                           capture_output=True)
            walls[workers] = time.perf_counter() - started
    rate = 1 / per_system
    print(f"analysis  : {1 / fast_cpu:,.0f} systems/s per core by the fast path ({fast_cpu * 1e3:.3f} ms CPU per "
          f"system, {len(SCHEDULERS)} schedulers' shared question), {1 / whole_cpu:,.0f} by the whole-model path "
          f"({whole_cpu * 1e3:.2f} ms); fast/whole {whole_cpu / fast_cpu:.1f}x; "
          f"fast/goal {1 / fast_cpu / GOAL_PER_CORE:.2f} (goal {GOAL_PER_CORE:,.0f} systems/s per core)")
    print(f"experiment: {1 / chunk_cpu:,.0f} systems/s per core by CPU time ({chunk_cpu * 1e3:.2f} ms CPU per "
          f"system: draw, {len(SCHEDULERS)} schedulers' analyses, records), {rate:,.0f} by wall time "
          f"({per_system * 1e3:.2f} ms; the gap is other processes on this core)")
    print(f"reference : {1 / in_process:,.0f} systems/s by load_model + analyse_model per scheduler "
          f"({in_process * 1e3:.2f} ms per system); {1 / reference:,.2f} systems/s through `rtvirt analyze` "
          f"({reference * 1e3:.0f} ms per system)")
    print(f"ratio experiment/reference: {in_process / per_system:.2f}x the in-process path, "
          f"{reference / per_system:.0f}x the CLI loop")
    print(f"ratio experiment/goal: {rate / GOAL_PER_CORE:.3f} (draw + analysis + records, wall time)")
    print(f"scaling: {args.scaling} systems, 1 worker {walls[1]:.1f} s, 2 workers {walls[2]:.1f} s, "
          f"speed-up {walls[1] / walls[2]:.2f} (whole command, start-up included)")


if __name__ == "__main__":
    main()
