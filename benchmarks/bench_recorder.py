"""Recorder throughput: the highest sustained sample rate written with zero drops.

Runs the `selftest` probe (synthetic samples paced on the cycle counter) through the normal path
(agent rings -> writer thread -> file, followed live by the Python reader) at rising rates, and
reports for each the samples/s actually written and the drops. Goal: >= 1 M samples/s aggregate
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

RATES_PER_S = (250_000, 500_000, 1_000_000, 1_500_000, 2_000_000, 3_000_000, 4_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="5s", help="length of each run")
    parser.add_argument("--cpus", default="1", help="producer CPUs, one producer thread each")
    parser.add_argument("--priority", type=int, default=90, help="SCHED_FIFO priority of the producers")
    args = parser.parse_args()
    cpus = parse_cpulist(args.cpus)
    duration_ns = parse_duration(args.duration, "s")
    spec = PROBES["selftest"]
    best = 0.0
    print(f"{len(cpus)} producer thread(s) on CPU {args.cpus}, {args.duration} per rate")
    print(f"{'target/s':>10} {'written/s':>12} {'dropped':>10}  wall")
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-") as work:
        for rate in RATES_PER_S:
            per_thread = rate // len(cpus)
            params = spec.params(rate=per_thread, threads=len(cpus), affinity=cpus, priority=args.priority,
                                 duration=f"{duration_ns}ns")
            started = time.monotonic()
            stream = run_probe(spec, params, Path(work) / f"{rate}.rtvs")
            wall = time.monotonic() - started
            written = stream.records.size / (duration_ns / 1e9)
            print(f"{rate:10d} {written:12.0f} {stream.total_dropped:10d}  {wall:.1f}s")
            (Path(work) / f"{rate}.rtvs").unlink()
            if stream.total_dropped == 0:
                best = max(best, written)
    verdict = "met" if best >= 1e6 else "NOT met"
    print(f"highest sustained rate with zero drops: {best:,.0f} samples/s (goal >= 1,000,000: {verdict})")


if __name__ == "__main__":
    main()
