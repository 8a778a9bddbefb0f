"""The Xen layer's flight recorder: xentrace in segments, the segments that hold the largest samples kept.

xentrace's own bound (a circular memory buffer, ``-M``) keeps a run's end; the outliers of a long run may lie
anywhere in it. Xen's trace buffers have one consumer at a time, so instead xentrace runs in consecutive
segments of ``SEGMENT_S`` (its ``-T``), each written to a file in dom0, fetched to this host when it ends and
removed there. Meanwhile the run's samples reach this host; each segment is scored by how many of the largest
samples (the ``top`` to be explained) can lie in it, then by the largest; while the kept segments exceed the
bound, the lowest-scored one whose samples have all arrived is dropped (see ``SegmentRecorder._keep``).

The samples are on the domU's clock and Xen's records on its TSC, and their map is only found from the kept
trace afterwards (explain.xen.align). What this host knows while the run goes is when samples arrived: a sample
ended no later than it was read, so each read batch bounds host clock - sample clock by ``read time - its
newest sample's end``. The tightest such bound read within ``OFFSET_SPAN_NS`` of a sample (the batch whose
newest sample came quickest; near, so that the clocks' drift does not add up) places it at most one read
interval plus the quickest delivery late (the bare-metal guest's console relay delivers in bursts: a batch's
own bound was seconds late). A segment holds the samples so placed within its host time span ± ``SLACK_NS``.
Between two segments (one xentrace ends, the next starts) nothing is traced: those holes, like the dropped
segments, are named in the layer's notes, and nothing is inferred across them.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .recorder import KeepRule
from .xentrace import TraceError, parse_records

__all__ = ["Segment", "SegmentRecorder", "SEGMENT_S"]

SEGMENT_S = 20  # each xentrace segment's length (its -T), s
READ_S = 0.5  # how often the samples are read while a segment records
SLACK_NS = 2_000_000_000  # a segment holds the samples placed within its host time span, give or take this
OFFSET_SPAN_NS = 300_000_000_000  # a sample is placed with the tightest clock bound read within this of it
JOIN_S = 120.0  # for the thread to end the last segment and fetch it


@dataclass(slots=True)
class Segment:
    """One xentrace segment fetched to this host: its file, its host time span (CLOCK_MONOTONIC ns), its size."""

    index: int
    local: Path
    host_start_ns: int
    host_end_ns: int
    size: int


class _Samples:
    """The largest samples (``keep``) as they reach this host, placed on its clock (the module's docstring)."""

    def __init__(self, path: Path, keep: KeepRule) -> None:
        from ..stream import StreamReader

        self.keep = keep
        self._reader = StreamReader(path, keep=False)
        self._largest: list[tuple[int, int, int]] = []  # heap of (value, end on the sample clock, read at)
        self._read_at: list[int] = []  # when each batch was read (host clock, in order) ...
        self._bound: list[int] = []  # ... and its bound on host clock - sample clock, for the last 2 OFFSET_SPAN_NS
        self._placed: dict[tuple[int, int, int], int] = {}  # a largest sample's host end, once no read can change it
        self._newest_end = 0  # the latest sample end read (sample clock)
        self.failure: str | None = None

    def read(self) -> None:
        if self.failure is not None:
            return
        try:
            records = self._reader.poll()
        except Exception as exc:  # noqa: BLE001 - without samples the newest segments are kept
            self.failure = f"the Xen flight recorder could not follow the samples: {exc}"[:300]
            return
        header = self._reader.header or {}
        if not records.size or header.get("value_field") not in ("latency_ns", "duration_ns"):
            return
        now = time.monotonic_ns()
        ends = records["t_ns"].astype(np.int64) + records["value"].astype(np.int64)
        self._read_at.append(now)
        self._bound.append(now - int(ends.max()))  # the batch's newest sample ended no later than now
        self._newest_end = max(self._newest_end, int(ends.max()))
        values = records["value"].astype(np.int64)
        for index in np.flatnonzero(values > self.keep.above_ns):
            item = (int(values[index]), int(ends[index]), now)
            if len(self._largest) < self.keep.top:
                heapq.heappush(self._largest, item)
            elif item > self._largest[0]:
                self._placed.pop(heapq.heapreplace(self._largest, item), None)
        self._forget(now)

    def _forget(self, now: int) -> None:
        """Hold the reads' bounds for the last 2 OFFSET_SPAN_NS only (a long run's memory stays bounded): a largest
        sample read before that is placed for good first (no later read is near enough to change it)."""
        if self._read_at[0] >= now - 2 * OFFSET_SPAN_NS:
            return
        for item in self._largest:
            if item[2] < now - OFFSET_SPAN_NS and item not in self._placed:
                self._placed[item] = self._host_end(item[1], item[2])
        cut = bisect.bisect_left(self._read_at, now - 2 * OFFSET_SPAN_NS)
        del self._read_at[:cut], self._bound[:cut]

    def _host_end(self, end: int, read_at: int) -> int:
        """A sample's end on this host's clock: with the tightest bound read within OFFSET_SPAN_NS of it (the
        read whose newest sample came quickest; nearby, so that the clocks' drift does not add up)."""
        lo = bisect.bisect_left(self._read_at, read_at - OFFSET_SPAN_NS)
        hi = bisect.bisect_right(self._read_at, read_at + OFFSET_SPAN_NS)
        return end + min(self._bound[lo:hi])

    def seen(self, segment: Segment) -> bool:
        """Whether every sample that can lie in ``segment`` has been read (samples arrive in order)."""
        return bool(self._read_at) and \
            segment.host_end_ns + SLACK_NS <= self._host_end(self._newest_end, self._read_at[-1])

    def score(self, segment: Segment) -> tuple[int, int]:
        """How many of the largest samples (those to be explained) can lie in ``segment``, and the largest."""
        def host_end(item: tuple[int, int, int]) -> int:
            placed = self._placed.get(item)
            return placed if placed is not None else self._host_end(item[1], item[2])

        inside = [item[0] for item in self._largest
                  if segment.host_start_ns - SLACK_NS <= host_end(item) <= segment.host_end_ns + SLACK_NS]
        return len(inside), max(inside, default=0)


class SegmentRecorder:
    """Runs xentrace segment after segment in dom0 while the run goes (a thread of its own); ``stop`` ends the
    current one and returns the kept segments, oldest first.

    ``start_tracer(stem)`` starts one xentrace of ``SEGMENT_S`` in dom0 (writing ``stem.bin``, its pid in
    ``stem.pid``) and returns its process (``poll``, ``stop``); ``end_tracer(stem, process)`` ends it early
    (waiting for it); ``fetch(stem, local)`` copies ``stem.bin`` here and removes the segment's files in dom0."""

    def __init__(self, start_tracer: Callable[[str], Any], end_tracer: Callable[[str, Any], None],
                 fetch: Callable[[str, Path], None], remote_stem: str, workdir: Path, bound_bytes: int,
                 samples: Path, keep: KeepRule) -> None:
        self._start_tracer, self._end_tracer, self._fetch = start_tracer, end_tracer, fetch
        self.remote_stem, self.workdir, self.bound_bytes = remote_stem, workdir, bound_bytes
        self._samples = _Samples(samples, keep)
        self.kept: list[Segment] = []
        self.dropped: list[tuple[Segment, int]] = []  # (segment, its records) dropped to the bound
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        first = self._begin(0)  # in the caller: a tracer that cannot start is the layer's failure, at once
        self._thread = threading.Thread(target=self._run, args=(first,), name="rtvirt-xen-recorder", daemon=True)
        self._thread.start()

    def _begin(self, index: int) -> tuple[int, str, Any, int]:
        stem = f"{self.remote_stem}.{index}"
        return index, stem, self._start_tracer(stem), time.monotonic_ns()

    def _run(self, current: tuple[int, str, Any, int]) -> None:
        try:
            while True:
                index, stem, process, started = current
                while process.poll() is None and not self._stop.wait(READ_S):
                    self._samples.read()
                if self._stop.is_set() and process.poll() is None:
                    self._end_tracer(stem, process)
                ended = time.monotonic_ns()
                # the next segment starts before this one is fetched: the hole between them stays short
                following = None if self._stop.is_set() else self._begin(index + 1)
                self._keep(index, stem, started, ended, final=following is None)
                if following is None:
                    return
                current = following
        except Exception as exc:  # noqa: BLE001 - the recorder never fails the run; the notes say what it lost
            self.problems.append(f"the Xen flight recorder stopped: {type(exc).__name__}: {exc}"[:300])

    def _keep(self, index: int, stem: str, started: int, ended: int, final: bool) -> None:
        """Fetch a finished segment, then drop segments while the bound is exceeded: among those whose samples
        have all been read, the lowest-scored (at the end of the run, all are). Segments still waiting for their
        samples (a bare-metal guest's console delivers them in bursts seconds apart) are judged once those came,
        up to twice the bound; beyond that the lowest-scored one but the newest goes, samples or not."""
        local = self.workdir / f"segment-{index}.bin"
        self._fetch(stem, local)
        self._samples.read()
        self.kept.append(Segment(index, local, started, ended, local.stat().st_size))
        while True:
            total = sum(segment.size for segment in self.kept)
            judged = self.kept if final else [segment for segment in self.kept if self._samples.seen(segment)]
            if sum(segment.size for segment in judged) > self.bound_bytes and judged:
                candidates = judged
            elif total > 2 * self.bound_bytes and len(self.kept) > 1:
                candidates = self.kept[:-1]
            else:
                return
            lowest = min(candidates, key=lambda segment: (self._samples.score(segment), segment.index))
            self.kept.remove(lowest)
            self.dropped.append((lowest, _count_records(lowest.local)))
            lowest.local.unlink(missing_ok=True)

    def stop(self) -> list[Segment]:
        """End the current segment, fetch it, and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                self.problems.append("the Xen flight recorder's thread did not end")
        if self._samples.failure and self._samples.failure not in self.problems:
            self.problems.append(self._samples.failure)
        return list(self.kept)


def _count_records(path: Path) -> int:
    try:
        return sum(1 for _ in parse_records(path.read_bytes()))
    except (OSError, TraceError):
        return 0
