"""What tuning buys: the timer probe's tail on the measured CPU as found, tuned (realtime-host) and tuned and
shielded — the built-in scenario host-tuning, one campaign per repetition, so that the three alternate (as found,
tuned, shielded, as found, ...) and slow drifts of the machine hit all alike.

Prints per configuration the pooled p99, p99.9, p99.99 and max of the wake-up latency, and the ratios tuned /
as found (below 1.00: tuning shortened the tail). Needs root (partitions, tuning); every setting is put back after
each run.

    .venv/bin/python benchmarks/bench_host_tuning.py [--repetitions 3] [--duration 20s]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console

from rtvirt.campaign import CampaignState, run_campaign
from rtvirt.scenario import builtin_scenarios, parse_scenario
from rtvirt.stream import read_stream
from rtvirt.units import parse_duration

ENVIRONMENTS = ("as-found", "tuned", "tuned-shielded")
PERCENTILES = (99.0, 99.9, 99.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--duration", default="20s", help="length of each run")
    args = parser.parse_args()
    text = builtin_scenarios()["host-tuning"]
    scenario = parse_scenario(text, "built-in scenario host-tuning")
    scale = parse_duration(args.duration, "s") / scenario.duration
    samples: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-") as work:
        results = Path(work)
        for _ in range(args.repetitions):
            state = CampaignState.create(results, scenario.name, text, "benchmark", scale)
            outcome = run_campaign(scenario, state, results, console=Console(stderr=True), show_progress=False,
                                   write_report=False)
            failed = {k: o.reason for k, o in outcome.outcomes.items() if o.status != "complete"}
            if failed:
                raise SystemExit(f"runs did not complete: {failed}")
        for manifest_path in sorted(results.glob("runs/*/manifest.json")):
            manifest = json.loads(manifest_path.read_text())
            stream = read_stream(manifest_path.parent / "samples.rtvs")
            key = (manifest["environment"], manifest["campaign"]["disturbance"])
            samples[key].append(stream.records["value"].astype(np.int64))
    print(f"timer probe, 1 ms interval, SCHED_FIFO 99, measured CPU as the scenario places it; "
          f"{args.repetitions} x {args.duration} per configuration")
    header = f"{'configuration':32} {'samples':>8}" + "".join(f" {f'p{p:g} us':>10}" for p in PERCENTILES) + \
        f" {'max us':>9}"
    print(header)
    figures: dict[tuple[str, str], list[float]] = {}
    for (environment, disturbance), runs in sorted(samples.items(), key=lambda kv: (kv[0][1], ENVIRONMENTS.index(
            kv[0][0]))):
        values = np.concatenate(runs)
        figures[(environment, disturbance)] = [float(np.percentile(values, p)) for p in PERCENTILES] + \
            [float(values.max())]
        print(f"{environment + ' / ' + disturbance:32} {values.size:8d}" +
              "".join(f" {v / 1000:10.1f}" for v in figures[(environment, disturbance)]))
    for disturbance in sorted({d for _, d in figures}):
        base = figures.get(("as-found", disturbance))
        for environment in ENVIRONMENTS[1:]:
            tuned = figures.get((environment, disturbance))
            if base and tuned:
                ratios = " ".join(f"{name} {t / b:.2f}" for name, t, b in zip(
                    [f"p{p:g}" for p in PERCENTILES] + ["max"], tuned, base, strict=True))
                print(f"ratio {environment}/as-found, {disturbance}: {ratios}")


if __name__ == "__main__":
    main()
