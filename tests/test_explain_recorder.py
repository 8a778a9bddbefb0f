"""The flight recorder's own bounds (explain.recorder): what it holds while the samples cannot be placed in the
trace yet (a guest's before its clock exchange, or all run long when that exchange failed)."""

from __future__ import annotations

import subprocess
from collections.abc import Collection
from pathlib import Path

import numpy as np

from rtvirt.agents import agent_path
from rtvirt.explain.recorder import UNPLACED_MAX, FlightRecorder, KeepRule
from rtvirt.explain.tracefs import line_stamp
from rtvirt.stream import read_stream


class _NoPipe:
    concern = ""

    def read(self, final: bool = False) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to let go of."""


class _NoTrace:
    """A trace source with nothing in it (only the samples matter here)."""

    where, here = "", True

    def open_pipe(self, path: str, away_from: Collection[int]) -> _NoPipe:
        return _NoPipe()


class _NeverPlaced:
    """A guest whose clock exchange never came: no sample can be placed in the trace."""

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        return (0,)

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        return None


def test_samples_that_cannot_be_placed_are_held_within_a_bound(tmp_path: Path) -> None:
    """400,000 samples that never could be placed: the recorder holds those above the rule's floor, at most
    UNPLACED_MAX of the largest, each CPU's newest among them (before, it held every one: a long run whose guest
    clock exchange failed grew without end)."""
    samples = tmp_path / "s.rtvs"
    subprocess.run([str(agent_path("rtvirt-probe")), "selftest", f"--out={samples}", "--duration=2000000000",
                    "--rate=200000", "--mlock=0", "--dma-latency=0"], check=True, timeout=120)
    records = read_stream(samples).records
    assert records.size > 2 * UNPLACED_MAX
    # the floor: the 10th percentile, or lower where more than UNPLACED_MAX samples would not be above it (a
    # starved selftest catches up with pushes whose gaps repeat a few values: a CI run had 97,061 above it)
    values = records["value"].astype(np.int64)
    distinct = np.unique(values)
    above = values.size - np.searchsorted(np.sort(values), distinct, side="right")
    floor = min(int(np.percentile(values, 10)), int(distinct[above > UNPLACED_MAX].max()))
    recorder = FlightRecorder(tmp_path / "instance", (0,), samples, KeepRule(floor, 10), bound_bytes=1 << 20,
                              margin_ns=1_000_000, access=_NoTrace(), placement=_NeverPlaced())
    recorder.start()
    recorder.finish()
    held = np.concatenate(recorder._unplaced)
    assert held.size == UNPLACED_MAX and (held["value"].astype(np.int64) > floor).all()
    assert held["value"].astype(np.int64).min() >= np.sort(values)[-UNPLACED_MAX]  # the largest were kept


class _BothCpus:
    """Samples on the trace's clock, explained from the trace of both CPUs (a vCPU is woken from either)."""

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        return (0, 1)

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        return sample_ns, 0


def _wakeup(cpu: int, ts_ns: int) -> str:
    seconds, micros = ts_ns // 1_000_000_000, ts_ns % 1_000_000_000 // 1000
    return (f"  qemu-system-x86-4242    [{cpu:03d}] d..3. {seconds}.{micros:06d}: sched_wakeup: comm=CPU 0/KVM "
            f"pid=4245 prio=120 target_cpu=001")


def test_a_trace_without_switches_keeps_its_windows_on_every_cpu_and_lets_go_of_the_rest(tmp_path: Path) -> None:
    """The VM layer's wake-up trace (a vCPU's wake-ups, on whichever CPU woke it) has no sched_switch to walk
    back to: with walk_back off, 120 s of it at 2 kHz per CPU keeps each outlier window's stretch on both CPUs
    and lets go of the rest as the run goes. (Before, every window walked back to the first line: the recorder
    held all of it, its bound then dropped the oldest, and every window was lost; and it kept only the vCPU's
    pCPU, so a wake-up from QEMU's main loop on another CPU was never read: the vCPU read as asleep.)"""
    from rtvirt.stream import RECORD

    bound = 256 << 10
    recorder = FlightRecorder(tmp_path, (0, 1), tmp_path / "none", KeepRule(1_000_000, 10), bound_bytes=bound,
                              margin_ns=5_000_000, access=_NoTrace(), placement=_BothCpus(), walk_back=False)
    base, peak = 1_000_000_000_000, 0
    outliers = [base + second * 1_000_000_000 + 300_000_000 for second in range(5, 120, 12)]
    for second in range(120):
        for cpu in (0, 1):
            recorder.take(cpu, [_wakeup(cpu, base + second * 1_000_000_000 + k * 500_000 + cpu * 1000)
                                for k in range(2000)])
        due = [start for start in outliers if base + second * 1_000_000_000 <= start < base + (second + 1) * 10**9]
        if due:
            sample = np.zeros(len(due), dtype=RECORD)
            sample["t_ns"], sample["value"], sample["cpu"] = due, 3_000_000, 1
            recorder.consider(sample)
        recorder.settle(base + (second + 1) * 1_000_000_000 - 2_000_000_000)  # two seconds of slack
        peak = max(peak, *(state.bytes for state in recorder._cpus.values()))
    texts = recorder.finish()
    assert not recorder.lost and recorder.dropped_lines == 0 and peak < bound, (recorder.lost, peak)
    for cpu in (0, 1):
        kept = [stamp for line in texts[cpu].splitlines() if (stamp := line_stamp(line)) is not None
                and "sched_wakeup" in line]
        # each window (3 ms, 5 ms of margin either side) whole, in its 10 ms chunks; nothing far from one
        for start in outliers:
            wanted = {base + round((t - base) / 500_000) * 500_000 + cpu * 1000
                      for t in range(start - 5_000_000, start + 8_000_000, 500_000)}
            assert wanted <= set(kept), (cpu, start)
        assert all(min(abs(stamp - start) for start in outliers) < 30_000_000 for stamp in kept)
