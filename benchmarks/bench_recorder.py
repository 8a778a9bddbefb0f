"""Recorder throughput: the highest sustained sample rate written with zero drops.

Runs the `selftest` probe (synthetic samples paced on the cycle counter) through the normal path
(agent rings -> writer thread -> file, followed live by the Python reader) at rising rates, and
reports for each the samples/s actually written and the drops; the ladder stops at the first rate
with a drop in any run. Goal: >= 1 M samples/s aggregate
with zero drops.

    .venv/bin/python benchmarks/bench_recorder.py --duration 5s --cpus 1
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rtvirt.params import parse_cpulist
from rtvirt.probes import PROBES
from rtvirt.probes.runner import run_probe
from rtvirt.units import parse_duration

RATES_PER_S = (250_000, 500_000, 1_000_000, 1_500_000, 2_000_000, 3_000_000, 4_000_000, 6_000_000, 8_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="5s", help="length of each run")
    parser.add_argument("--cpus", default="1", help="producer CPUs, one producer thread each")
    parser.add_argument("--priority", type=int, default=90, help="SCHED_FIFO priority of the producers")
    parser.add_argument("--repeat", type=int, default=2, help="runs per rate; every one must be drop-free")
    args = parser.parse_args()
    cpus = parse_cpulist(args.cpus)
    duration_ns = parse_duration(args.duration, "s")
    spec = PROBES["selftest"]
    sustained = 0.0
    print(f"{len(cpus)} producer thread(s) on CPU {args.cpus}, {args.duration} per run, {args.repeat} runs per rate")
    print(f"{'target/s':>10} {'written/s':>12} {'dropped':>10}  wall")
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-") as work:
        for rate in RATES_PER_S:
            clean = True
            for _ in range(args.repeat):
                params = spec.params(rate=rate // len(cpus), threads=len(cpus), affinity=cpus,
                                     priority=args.priority, duration=f"{duration_ns}ns")
                path = Path(work) / "selftest.rtvs"
                started = time.monotonic()
                stream = run_probe(spec, params, path)
                wall = time.monotonic() - started
                written = stream.records.size / (duration_ns / 1e9)
                print(f"{rate:10d} {written:12.0f} {stream.total_dropped:10d}  {wall:.1f}s")
                path.unlink()
                clean &= stream.total_dropped == 0
            if not clean:
                break
            sustained = rate
    verdict = "met" if sustained >= 1e6 else "NOT met"
    print(f"sustained with zero drops in every run (this rate and all below): {sustained:,.0f} samples/s "
          f"(goal >= 1,000,000: {verdict})")

if __name__ == "__main__":
    main()
