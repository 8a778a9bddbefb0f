"""Known-interference tests: a load we control must show up in the probes by the amount we put in.

The interferer is the `cpu` stressor in duty-cycle mode (busy for a slice at the start of every
period, SCHED_FIFO above the probe), so what the probes must see is known in advance. Margins are
generous: this 2-CPU VM is shared with other work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvirt.probes import PROBES
from rtvirt.probes.runner import run_probe
from rtvirt.procs import Supervisor
from rtvirt.stream import SampleStream
from rtvirt.stressors import start_stressor

CPUS = sorted(os.sched_getaffinity(0))
CPU, OTHER_CPU = CPUS[-1], CPUS[0]
PROBE_PRIORITY, INTERFERER_PRIORITY = 80, 90
MS = 1_000_000

# quiet: each test measures what a SCHED_FIFO interferer does to a probe on CPU; another test's real-time threads
# there would be a second interferer (make test runs these after the rest, one at a time)
pytestmark = [pytest.mark.skipif(len(CPUS) < 2, reason="same-CPU vs other-CPU interference needs two CPUs"),
              pytest.mark.quiet]


@contextmanager
def interferer(cpu: int, slice_: str | None = None, period: str | None = None) -> Iterator[None]:
    """The cpu stressor on `cpu` above the probes' priority: a duty cycle when slice/period are given."""
    params: dict[str, Any] = {"cpus": [cpu], "priority": INTERFERER_PRIORITY, "duration": 0}
    if slice_:
        params |= {"slice": slice_, "period": period}
    with Supervisor() as supervisor:
        running = start_stressor("cpu", params, supervisor)
        try:
            yield
        finally:
            running.stop()


def probe(name: str, tmp_path: Path, tag: str, **params: Any) -> SampleStream:
    spec = PROBES[name]
    stream = run_probe(spec, spec.params(affinity=[CPU], priority=PROBE_PRIORITY, **params),
                       tmp_path / f"{name}-{tag}.rtvs")
    assert stream.end_reason == "complete" and stream.total_dropped == 0
    return stream


def test_gap_sees_the_interferers_slices_and_period(tmp_path: Path) -> None:
    with interferer(CPU, "2ms", "10ms"):
        stream = probe("gap", tmp_path, "2ms-10ms", duration="2s", threshold="200us")
    gaps = stream.records[stream.records["value"] >= 1 * MS]
    assert gaps.size >= 150, f"expected ~200 holes of 2 ms in 2 s, saw {gaps.size}"
    lengths = gaps["value"]
    spacing = np.diff(gaps["t_ns"].astype(np.int64))
    assert abs(np.median(lengths) - 2 * MS) <= 0.1 * 2 * MS
    assert abs(np.median(spacing) - 10 * MS) <= 0.1 * 10 * MS
    assert np.mean(np.abs(lengths - 2 * MS) <= 0.2 * MS) >= 0.8  # most holes, not only the median
    assert np.mean(np.abs(spacing - 10 * MS) <= 1 * MS) >= 0.8
    assert stream.stats[(0, "cpu_share_ppm")] <= 850_000  # the thread lost at least the interferer's 20 %


def test_timer_latency_rises_with_the_interferer(tmp_path: Path) -> None:
    before = probe("timer", tmp_path, "solo", duration="1500ms", interval="1ms")
    with interferer(CPU, "2ms", "10ms"):
        disturbed = probe("timer", tmp_path, "disturbed", duration="1500ms", interval="1ms")
    after = probe("timer", tmp_path, "solo-after", duration="1500ms", interval="1ms")
    values = disturbed.records["value"]
    # A wake-up planned inside a 2 ms slice waits for its end: about one in ten waits up to 2 ms.
    # (Percentiles, not the maximum: the host itself may take this vCPU away for tens of ms now and then.)
    assert 0.04 <= np.mean(values > 200_000) <= 0.3
    assert 0.5 * MS <= np.percentile(values, 99) <= 2.2 * MS
    # the slow wake-ups are the interferer's: it adds waits above 0.5 ms (three in twenty wake-ups fall in a
    # slice's first 1.5 ms) to what the quieter of a solo run before and one after had, at least half its 15 %.
    # Added, not multiplied: the outer hypervisor's noise on this machine, itself a VM, is there with or without the
    # interferer. It put the solo p99 at 645 us once and at 248 us in a quiet phase another time; in a CI run 3.0 %
    # of the quieter solo run's wake-ups waited over 0.5 ms, with 13.8 % in the disturbed run
    solo_share = min(np.mean(solo.records["value"] > 0.5 * MS) for solo in (before, after))
    assert np.mean(values > 0.5 * MS) - solo_share >= 0.075, (np.mean(values > 0.5 * MS), solo_share)


def _slow_share(stream: SampleStream, limit: float) -> float:
    return float(np.mean(stream.records["value"] > limit))


def test_workload_and_kops_move_with_a_stressor_on_their_cpu(tmp_path: Path) -> None:
    """A 50 % load (2 ms every 4 ms) above the probe: on its CPU many samples grow by ~2 ms, elsewhere not.

    Judged by the share of slow samples rather than the mean, which one host hiccup could move.
    """
    runs: dict[str, dict[str, SampleStream]] = {}
    for where, cpu in (("solo", None), ("same", CPU), ("other", OTHER_CPU)):
        if cpu is None:
            workload = probe("workload", tmp_path, where, duration="1500ms", kernel="basicmath")
            kops = probe("kops", tmp_path, where, iterations=2000)
        else:
            with interferer(cpu, "2ms", "4ms"):
                workload = probe("workload", tmp_path, where, duration="1500ms", kernel="basicmath")
                kops = probe("kops", tmp_path, where, iterations=2000)
        runs[where] = {"workload": workload, "kops": kops}
    # workload: iterations (~1 ms) overlapping a slice take 1.5x the solo median or more.
    limit = 1.5 * float(np.median(runs["solo"]["workload"].records["value"]))
    same, other = (_slow_share(runs[where]["workload"], limit) for where in ("same", "other"))
    assert same >= 0.15, f"workload: a 50 % load on its CPU slowed only {same:.1%} of the iterations"
    assert other <= same / 3, f"workload: other CPU {other:.1%} vs same CPU {same:.1%} slow iterations"
    # kops: operations take microseconds; the ones a slice preempted take ~2 ms (every iteration is kept).
    same, other = (_slow_share(runs[where]["kops"], 0.5 * MS) for where in ("same", "other"))
    samples = runs["same"]["kops"].records.size
    assert same * samples >= 10, f"kops: only {same * samples:.0f} operations were preempted by the same-CPU load"
    assert other <= same / 3, f"kops: other CPU {other:.3%} vs same CPU {same:.3%} preempted operations"


def _probe_started_behind_a_spinner(name: str, tmp_path: Path, **params: Any) -> tuple[SampleStream, float]:
    """``name`` on CPU started while a higher-priority spinner holds it (as a starved vCPU is) for 0.6 s: its
    stream and how long the probe took, start to end."""
    result: dict[str, Any] = {}

    def measure() -> None:
        started = time.monotonic()
        result["stream"] = probe(name, tmp_path, "late", **params)
        result["elapsed"] = time.monotonic() - started

    with interferer(CPU):
        time.sleep(0.1)  # the interferer spins before the probe starts
        worker = threading.Thread(target=measure)
        worker.start()
        time.sleep(0.6)
    worker.join(timeout=60)
    return result["stream"], result["elapsed"]


def test_a_gap_thread_that_starts_late_still_spins_its_whole_duration(tmp_path: Path) -> None:
    # the spin must last its duration from its own start, not end at a deadline counted from the agent's start
    stream, elapsed = _probe_started_behind_a_spinner("gap", tmp_path, duration="1s", threshold="200us")
    delay_s = stream.stats[(0, "start_delay_ns")] / 1e9
    assert delay_s > 0.3, delay_s  # the thread could not run while the interferer held its CPU
    # the agent cannot end before the spin did: a deadline from the agent's start ended it after ~1 s
    assert elapsed >= delay_s + 1.0, (elapsed, delay_s)


def test_a_timer_thread_that_starts_late_still_measures_its_whole_duration(tmp_path: Path) -> None:
    # as the gap test above, for the periodic probe: the 250 ms its thread waited for the CPU are not wake-up
    # latencies, and its 500 periods all come afterwards (it once took 1 sample of 300 ms on a busy CI worker)
    stream, elapsed = _probe_started_behind_a_spinner("timer", tmp_path, duration="500ms", interval="1ms")
    delay_s = stream.stats[(0, "start_delay_ns")] / 1e9
    assert delay_s > 0.3, delay_s
    assert stream.records.size + stream.stats[(0, "overruns")] == 500, (stream.records.size, stream.stats)
    assert stream.records.size >= 400, stream.stats  # nothing held the CPU once it began
    assert np.percentile(stream.records["value"], 50) < 1 * MS  # the wait for the CPU is no sample
    assert elapsed >= delay_s + 0.5, (elapsed, delay_s)
