"""The flight recorder's own bounds (explain.recorder): what it holds while the samples cannot be placed in the
trace yet (a guest's before its clock exchange, or all run long when that exchange failed)."""

from __future__ import annotations

import subprocess
from collections.abc import Collection
from pathlib import Path

import numpy as np

from rtvirt.agents import agent_path
from rtvirt.explain.recorder import UNPLACED_MAX, FlightRecorder, KeepRule
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
    floor = int(np.percentile(records["value"].astype(np.int64), 10))  # most samples are above it
    recorder = FlightRecorder(tmp_path / "instance", (0,), samples, KeepRule(floor, 10), bound_bytes=1 << 20,
                              margin_ns=1_000_000, access=_NoTrace(), placement=_NeverPlaced())
    recorder.start()
    recorder.finish()
    held = np.concatenate(recorder._unplaced)
    values = records["value"].astype(np.int64)
    assert held.size == UNPLACED_MAX and (held["value"].astype(np.int64) > floor).all()
    assert held["value"].astype(np.int64).min() >= np.sort(values)[-UNPLACED_MAX]  # the largest were kept
