"""cyclictest -v output: one ``thread: loop: latency`` line per sample (µs, or ns with --nsecs: --unit ns).

Samples are dated t_ns = loop × interval, the thread's interval (µs) taken from its final ``T: N … I:x``
summary line (the ``Thread N Interval`` line printed at start is not the thread's own interval in
rt-tests 2.x, so it only serves when the summary is missing).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import InputError
from .base import Imported, ImporterSpec, ImportOptions, read_text, unit_scale

_SAMPLE = re.compile(r"^\s*(\d+):\s*(\d+):\s*(-?\d+)\s*$")
_INTERVAL = re.compile(r"^Thread (\d+) Interval: (\d+)\s*$")
_SUMMARY = re.compile(r"^T:\s*(\d+)\s.*\sI:\s*(\d+)\s")
_CPU = re.compile(r"^Thread (\d+) using cpu (\d+)\.?\s*$")
# Lines cyclictest prints around the samples (setup messages, the per-thread summary, comments).
_IGNORED = re.compile(r"^(#|T:\s|Max CPUs|Online CPUs|Using \d|Warning|WARN|$)")


def parse(path: Path, options: ImportOptions) -> Imported:
    scale = unit_scale(path, options, "us")
    threads: list[int] = []
    loops: list[int] = []
    latencies: list[int] = []
    interval_us: dict[int, int] = {}
    summary_interval_us: dict[int, int] = {}
    cpu_of: dict[int, int] = {}
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if match := _SAMPLE.match(line):
            threads.append(int(match.group(1)))
            loops.append(int(match.group(2)))
            latencies.append(int(match.group(3)))
        elif match := _INTERVAL.match(line):
            interval_us[int(match.group(1))] = int(match.group(2))
        elif match := _SUMMARY.match(line):
            summary_interval_us[int(match.group(1))] = int(match.group(2))
        elif match := _CPU.match(line):
            cpu_of[int(match.group(1))] = int(match.group(2))
        elif not _IGNORED.match(line.strip()):
            raise InputError(f"{path}: line {number}: not cyclictest -v output: {line[:80]!r}")
    if not latencies:
        raise InputError(f"{path}: no cyclictest -v samples (lines 'thread: loop: latency') found")
    interval_us |= summary_interval_us
    thread = np.array(threads, np.int64)
    if thread.max() > 32767:
        raise InputError(f"{path}: thread number {thread.max()} out of range")
    intervals = np.array([interval_us.get(t, 0) for t in range(int(thread.max()) + 1)], np.int64) * 1000
    table = pa.table({
        "t_ns": pa.array(np.array(loops, np.int64) * intervals[thread]),
        "latency_ns": pa.array(np.array(latencies, np.int64) * scale),
        "cpu": pa.array(np.array([cpu_of.get(t, t) for t in threads], np.int16)),
        "thread": pa.array(thread.astype(np.int16)),
        "kind": pa.array(["wakeup"] * len(latencies), pa.string()).dictionary_encode(),
    })
    warnings = [] if interval_us else ["no 'Thread N Interval' lines: sample times are unknown (t_ns = 0)"]
    return Imported(table=table, meta={"probe": "cyclictest"}, warnings=warnings)


SPEC = ImporterSpec("cyclictest", "cyclictest -v (verbose) output, one line per sample", parse)
