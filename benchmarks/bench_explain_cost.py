"""What explaining costs the measurement: the timer probe with host tracing on and off, in alternating runs.

"On" is what `rtvirt probe timer --explain` and a campaign's `[explain]` table do: a tracefs instance of
rtvirt's own on the measured CPU (scheduler, IRQ, softirq, IRQ vector and hrtimer events, 64 MiB buffer)
armed before the agent starts, stopped after it ended, then the trace parsed and the outliers explained.
Runs alternate (off, on, off, ...) so slow drifts of the shared machine hit both alike. Prints mean and p99
of each and the ratios on/off (goal: <= 1.10, tracing must not change what it explains; the median too, without
a goal: the typical wake-up, which the outer hypervisor's rare stalls barely move), each with a 95 %
interval from resampling the pairs (a machine whose runs differ more than the effect says so instead of a verdict
it cannot support), plus how long the explanation took after each run (parse + attribution; not part of the
measurement) and what the explanations said tracing cost. ``--before`` adds a third run to each round with the
events traced by default before issue 38 (also ``sched_wakeup`` and ``hrtimer_expire_exit``, both on every
wake-up's path): its ratios to "off" in the same run.

    .venv/bin/python benchmarks/bench_explain_cost.py [--pairs 5] [--duration 10s] [--cpu 1] [--before]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rtvirt.explain.config import ExplainConfig
from rtvirt.explain.host import HOST_EVENTS, HostSource
from rtvirt.explain.recorder import KeepRule
from rtvirt.explain.session import ExplainSession
from rtvirt.probes import PROBES
from rtvirt.probes.runner import run_probe
from rtvirt.units import parse_duration

GOAL = 1.10
# the default events before issue 38: also the wake-ups and the timer callbacks' ends, on every wake-up's path
BEFORE = (*HOST_EVENTS, "sched:sched_wakeup", "timer:hrtimer_expire_exit")
RESAMPLES = 2000  # bootstrap draws of the pairs for the ratios' intervals


def pooled_statistic(values: np.ndarray, statistic: str) -> float:
    if statistic == "mean":
        return float(values.mean())
    return float(np.percentile(values, 99 if statistic == "p99" else 50))


def ratio_interval(on: list[np.ndarray], off: list[np.ndarray], statistic: str,
                   rng: np.random.Generator) -> tuple[float, float]:
    """95 % interval of the pooled on/off ratio of ``statistic`` ("mean", "p99" or "median"), resampling whole
    pairs (a pair's two runs share the machine's state of the moment; samples within a run are not
    independent)."""
    def value(runs: list[np.ndarray]) -> float:
        return pooled_statistic(np.concatenate(runs), statistic)

    ratios = []
    for _ in range(RESAMPLES):
        chosen = rng.integers(0, len(on), len(on))
        ratios.append(value([on[i] for i in chosen]) / value([off[i] for i in chosen]))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def verdict(low: float, high: float, goal: float = GOAL) -> str:
    if high <= goal:
        return "met"
    if low > goal:
        return "NOT met"
    return "not resolved: the interval spans the goal (more pairs, or a quieter host)"


def run_once(cpu: int, priority: int, interval_ns: int, duration_ns: int, work: Path,
             events: Sequence[str] | None) -> tuple[np.ndarray, float, int, dict[str, float]]:
    """One probe run (``events``: traced, None: not traced): its values, the seconds the explanation took after it,
    the events dropped and what the run's explanation says tracing cost it (events per second, one event's cost
    measured before the run)."""
    spec = PROBES["timer"]
    params = spec.params(affinity=[cpu], priority=priority, interval=f"{interval_ns}ns", duration=f"{duration_ns}ns")
    config = ExplainConfig.model_validate({})
    session = None
    if events is not None:
        session = ExplainSession(config, [HostSource((cpu,), buffer_mb=config.buffer_mb, events=events,
                                                     keep=KeepRule(config.floor, config.top))])
    pids: list[int] = []
    samples = work / "timer.rtvs"
    samples.unlink(missing_ok=True)
    if session is not None:
        session.start(samples)  # as a campaign and `rtvirt probe --explain` do: the flight recorder follows it
    try:
        stream = run_probe(spec, params, samples, on_launch=pids.append)
    finally:
        if session is not None:
            session.stop()
    if stream.total_dropped:
        sys.exit(f"the timer probe dropped {stream.total_dropped} samples")
    took, dropped, cost = 0.0, 0, {}
    if session is not None:
        started = time.monotonic()
        explanation = session.explain(stream, pids)
        took = time.monotonic() - started
        host = explanation.layers[0]
        if not host.seen:
            sys.exit(f"host tracing is not available here: {host.why_not}")
        dropped, cost = host.dropped_events, host.cost
    return stream.records["value"].astype(np.int64), took, dropped, cost


def _ratios(label: str, runs: list[np.ndarray], off: list[np.ndarray], rng: np.random.Generator) -> None:
    """The pooled ratios of ``runs`` to the off runs, each with its interval and, for mean and p99, the verdict."""
    for name in ("mean", "p99", "median"):
        ratio = pooled_statistic(np.concatenate(runs), name) / pooled_statistic(np.concatenate(off), name)
        low, high = ratio_interval(runs, off, name, rng)
        goal = f"goal <= {GOAL:.2f}: {verdict(low, high)}" if name != "median" else "no goal: the typical wake-up"
        print(f"ratio {label}/off {name}: {ratio:.3f} (95 % interval {low:.3f}-{high:.3f}; {goal})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="alternating off/on pairs")
    parser.add_argument("--duration", default="10s", help="length of each run")
    parser.add_argument("--interval", default="1ms", help="wake-up period")
    parser.add_argument("--cpu", type=int, default=1, help="the measured (and traced) CPU")
    parser.add_argument("--priority", type=int, default=99, help="SCHED_FIFO priority of the probe")
    parser.add_argument("--before", action="store_true", help="a third run in each round with the events traced "
                        "by default before issue 38 (sched_wakeup, hrtimer_expire_exit as well)")
    args = parser.parse_args()
    duration_ns, interval_ns = parse_duration(args.duration, "s"), parse_duration(args.interval, "us")
    modes: dict[str, Sequence[str] | None] = {"off": None, "on": HOST_EVENTS, **({"before": BEFORE} if args.before
                                                                                 else {})}
    runs: dict[str, list[np.ndarray]] = {mode: [] for mode in modes}
    took, dropped = [], 0
    costs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-") as work:
        for pair in range(args.pairs):
            said = []
            for mode, events in modes.items():
                values, seconds, lost, cost = run_once(args.cpu, args.priority, interval_ns, duration_ns, Path(work),
                                                       events)
                runs[mode].append(values)
                if mode == "on":
                    costs.append(cost)
                    took.append(seconds)
                dropped += lost
                said.append(f"{mode} mean {values.mean():9.0f} ns p99 {np.percentile(values, 99):9.0f} ns")
            print(f"pair {pair + 1}: {' | '.join(said)} | explained in {took[-1]:.2f} s", flush=True)
    print(f"\nsettings: -p {args.priority} -i {interval_ns // 1000}us -a {args.cpu} -D {args.duration} "
          f"x {args.pairs} alternating rounds; trace events dropped: {dropped}")
    print(f"{'explain':8} {'samples':>9} {'mean ns':>10} {'p99 ns':>10} {'max ns':>10} {'median ns':>10}")
    for name, values in ((mode, np.concatenate(found)) for mode, found in runs.items()):
        print(f"{name:8} {values.size:9d} {values.mean():10.0f} {np.percentile(values, 99):10.0f} "
              f"{values.max():10d} {np.median(values):10.0f}")
    on, off = runs["on"], runs["off"]
    pair_means = [a.mean() / b.mean() for a, b in zip(on, off, strict=True)]
    pair_p99s = [np.percentile(a, 99) / np.percentile(b, 99) for a, b in zip(on, off, strict=True)]
    print(f"per-pair ratios on/off: mean median {np.median(pair_means):.3f} (range {min(pair_means):.3f}-"
          f"{max(pair_means):.3f}), p99 median {np.median(pair_p99s):.3f} (range {min(pair_p99s):.3f}-"
          f"{max(pair_p99s):.3f})")
    print(f"explanation after each run: median {np.median(took):.2f} s, max {max(took):.2f} s")
    rates = [c["events_per_s_per_cpu"] for c in costs if "events_per_s_per_cpu" in c]
    per_event = [c["event_ns"] for c in costs if "event_ns" in c]
    path = [c["wake_up_ns"] for c in costs if "wake_up_ns" in c]
    if rates:
        print(f"what the explanations say tracing cost: {np.median(rates):,.0f} events/s on the traced CPU"
              + (f", one event at least {np.median(per_event):.0f} ns (a warm loop before each run), at least "
                 f"{np.median(path):.0f} ns per wake-up" if per_event and path else ""))
    rng = np.random.default_rng(0)
    # the goal is on the mean and the p99; the median, which the outer hypervisor's rare stalls barely move, shows
    # the cost of the typical wake-up where those stalls leave the mean unresolved
    for label in runs:
        if label != "off":
            _ratios(label, runs[label], off, rng)


if __name__ == "__main__":
    main()
