"""The Xen layer's flight recorder: xentrace's stream, cut into segments, the segments that hold the largest
samples kept.

xentrace's own bound (a circular memory buffer, ``-M``) keeps a run's end; the outliers of a long run may lie
anywhere in it. Instead one xentrace in dom0 writes to its standard output for the whole run, and that stream
comes here as it goes (the lab's SSH channel, or a local dom0's pipe) into a file of the run, read as it grows and
freed behind (explain.guest_stream does the same for a guest's trace). Every ``SEGMENT_S`` what arrived is cut,
at whole per-pCPU blocks, into a segment; each segment is scored by how many of the largest samples (the ``top``
to be explained) can lie in it, then by the largest; while the kept segments exceed the bound, the
lowest-scored one whose samples have all arrived is dropped (see ``SegmentRecorder._keep``). Kept segments that
follow each other are read as one trace; a dropped segment leaves a hole, named in the layer's notes, and
nothing is inferred across it. (Before, xentrace ran in consecutive segments of its own, and each switch left
0.1-0.4 s untraced.)

The samples are on the domU's clock and Xen's records on its TSC, and their map is only found from the kept
trace afterwards (explain.xenalign). What this host knows while the run goes is when samples arrived: a sample
ended no later than it was read, so each read batch bounds host clock - sample clock by ``read time - its
newest sample's end``. The tightest such bound read within ``OFFSET_SPAN_NS`` of a sample (the batch whose
newest sample came quickest; near, so that the clocks' drift does not add up) places it at most one read
interval plus the quickest delivery late (the bare-metal guest's console relay delivers in bursts: a batch's
own bound was seconds late). A segment holds the samples so placed within its host time span ± ``SLACK_NS``;
those placed in it or up to ``SLACK_NS`` after it (placed late) count first.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..fileio import free_range
from .recorder import KeepRule
from .xentrace import TRC_TRACE_CPU_CHANGE, TraceError, parse_records

__all__ = ["Segment", "SegmentRecorder", "SEGMENT_S"]

SEGMENT_S = 20  # each xentrace segment's length (its -T), s
READ_S = 0.5  # how often the samples are read while a segment records
SLACK_NS = 2_000_000_000  # a segment holds the samples placed within its host time span, give or take this
OFFSET_SPAN_NS = 300_000_000_000  # a sample is placed with the tightest clock bound read within this of it
JOIN_S = 120.0  # for the thread to end the stream and cut its rest
BLOCK_HEAD = 12  # a CPU_CHANGE record: its header, the pCPU, the length of the block that follows
MAX_TAKE = 64 << 20  # bytes taken from the stream file at once (a segment of 20 s here: 0.2-2 MB)
FREE_BLOCK = 1 << 16


@dataclass(slots=True)
class Segment:
    """One segment of the xentrace stream: its file, the host time span it arrived in (CLOCK_MONOTONIC ns), its
    size, and whether it continues the kept segment before it (the same stream, nothing dropped between)."""

    index: int
    local: Path
    host_start_ns: int
    host_end_ns: int
    size: int
    follows: bool = False


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

    def score(self, segment: Segment) -> tuple[int, int, int]:
        """How many of the largest samples (those to be explained) lie in ``segment`` if placed late (in it, or up
        to SLACK_NS after it: a placement is a bound the sample ended before), how many can lie in it at all
        (placed within SLACK_NS of it either way: the segment's own placement is late too), and the largest of
        those. A stretch of large samples near a segment boundary is within the slack of the segments on both
        sides; the late placement of the console's samples (seconds, in bursts) made the later one win."""
        def host_end(item: tuple[int, int, int]) -> int:
            placed = self._placed.get(item)
            return placed if placed is not None else self._host_end(item[1], item[2])

        ends = [(item[0], host_end(item)) for item in self._largest]
        placed = sum(1 for _, end in ends if segment.host_start_ns <= end <= segment.host_end_ns + SLACK_NS)
        near = [value for value, end in ends
                if segment.host_start_ns - SLACK_NS <= end <= segment.host_end_ns + SLACK_NS]
        return placed, len(near), max(near, default=0)


class SegmentRecorder:
    """One xentrace in dom0 streams the run's scheduler records here while the run goes (a thread of its own);
    what arrived is cut into segments of ``segment_s`` at whole per-pCPU blocks, and the segments that hold the
    largest samples are kept within the bound. ``stop`` ends the stream and returns the kept segments, oldest first.

    ``start_stream(local)`` starts xentrace in dom0 with its output going into the local file ``local`` and returns
    its process (``poll``, ``stop``); ``end_stream(process)`` ends it and waits until all its output is here. A
    stream that ends by itself (xentrace's own time limit, a safety for a killed rtvirt in a Xen host's dom0) is
    followed by a new one: a hole only there."""

    def __init__(self, start_stream: Callable[[Path], Any], end_stream: Callable[[Any], None], workdir: Path,
                 bound_bytes: int, samples: Path, keep: KeepRule, segment_s: float = SEGMENT_S,
                 ns_per_tick: float | None = None) -> None:
        self._start_stream, self._end_stream = start_stream, end_stream
        self.workdir, self.bound_bytes, self.segment_s = workdir, bound_bytes, segment_s
        self._samples = _Samples(samples, keep)
        self._clock = _TraceClock(ns_per_tick)
        self._pending: list[bytes] = []  # whole blocks taken since the last cut
        self.kept: list[Segment] = []
        self.dropped: list[tuple[Segment, int]] = []  # (segment, its records) dropped to the bound
        self.problems: list[str] = []
        self.streams = 0  # xentrace streams started (one unless one ended by itself)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: _Stream | None = None
        self._index = 0
        self._cut_ns = 0

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._begin()  # in the caller: a tracer that cannot start is the layer's failure, at once
        self._thread = threading.Thread(target=self._run, name="rtvirt-xen-recorder", daemon=True)
        self._thread.start()

    def _begin(self) -> None:
        local = self.workdir / f"stream-{self.streams}.bin"
        self._stream = _Stream(local, self._start_stream(local), follows=False)
        self.streams += 1
        self._cut_ns = time.monotonic_ns()

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stop.wait(READ_S)
                self._samples.read()
                assert self._stream is not None
                self._take()
                if stopping:
                    self._end_stream(self._stream.process)
                    self._cut(final=True)
                    return
                if self._stream.process.poll() is not None:  # ended by itself: all of it is here
                    self._cut(final=False)
                    self._stream.close()
                    self._begin()
                elif time.monotonic_ns() - self._cut_ns >= self.segment_s * 1e9:
                    self._cut(final=False)
        except Exception as exc:  # noqa: BLE001 - the recorder never fails the run; the notes say what it lost
            self.problems.append(f"the Xen flight recorder stopped: {type(exc).__name__}: {exc}"[:300])
            if self._stream is not None:
                with contextlib.suppress(Exception):  # no xentrace of ours runs on in dom0
                    self._end_stream(self._stream.process)
        finally:
            if self._stream is not None:
                self._stream.close()

    def _take(self) -> None:
        """The whole pCPU blocks that arrived since the last read (the rest waits), timed as they arrive."""
        assert self._stream is not None
        data, problem = self._stream.take()
        if problem and problem not in self.problems:
            self.problems.append(problem)
        if data:
            self._pending.append(data)
            self._clock.arrived(data, time.monotonic_ns())

    def _cut(self, final: bool) -> None:
        """What arrived since the last cut, as a segment placed on this host's clock by its records' own times (else
        by when they arrived), then the bound held."""
        assert self._stream is not None
        self._take()
        data, self._pending = b"".join(self._pending), []
        now = time.monotonic_ns()
        if data:
            start, end = self._clock.span(data) or (self._cut_ns, now)
            local = self.workdir / f"segment-{self._index}.bin"
            local.write_bytes(data)
            self.kept.append(Segment(self._index, local, start, end, len(data), self._stream.follows))
            self._stream.follows = True
            self._index += 1
        self._cut_ns = now
        self._samples.read()
        self._keep(final)

    def _keep(self, final: bool) -> None:
        """Drop segments while the bound is exceeded: among those whose samples have all been read, the
        lowest-scored (at the end of the run, all are). Segments still waiting for their samples (a bare-metal
        guest's console delivers them in bursts seconds apart) are judged once those came, up to twice the bound;
        beyond that the lowest-scored one but the newest goes, samples or not."""
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
            at = self.kept.index(lowest)
            self.kept.remove(lowest)
            if at < len(self.kept):
                self.kept[at].follows = False  # what follows a dropped segment no longer continues a kept one
            self.dropped.append((lowest, _count_records(lowest.local)))
            lowest.local.unlink(missing_ok=True)

    def traces(self) -> list[bytes]:
        """The kept trace, oldest first: segments that followed each other in one stream as one (a stretch across
        a cut is read whole), separate where a segment was dropped or a stream ended."""
        blobs: list[bytes] = []
        for segment in self.kept:
            data = segment.local.read_bytes()
            if segment.follows and blobs:
                blobs[-1] += data
            else:
                blobs.append(data)
        return blobs

    def stop(self) -> list[Segment]:
        """End the stream, cut its rest, and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                self.problems.append("the Xen flight recorder's thread did not end")
        if self._samples.failure and self._samples.failure not in self.problems:
            self.problems.append(self._samples.failure)
        return list(self.kept)


class _TraceClock:
    """Where Xen's records lie on this host's clock while the run goes (the alignment with the samples comes only
    afterwards): a record cannot have been written after it arrived here, so each read bounds host clock - the
    record's time by its arrival - the newest record's TSC time; the tightest bound read within OFFSET_SPAN_NS (the
    quickest delivery: dom0's pipe and the lab's SSH channel may hold records back for seconds) places them, as the
    samples are placed (_Samples). Without Xen's TSC rate (``ns_per_tick``) nothing is placed."""

    def __init__(self, ns_per_tick: float | None) -> None:
        self.ns_per_tick = ns_per_tick
        self._bounds: list[tuple[int, int]] = []  # (arrived at, host clock - record time)

    @staticmethod
    def _tscs(data: bytes) -> tuple[int, int] | None:
        try:
            tscs = [record.tsc for record in parse_records(data) if record.tsc]
        except TraceError:
            return None
        return (min(tscs), max(tscs)) if tscs else None

    def arrived(self, data: bytes, now: int) -> None:
        if self.ns_per_tick is None or (tscs := self._tscs(data)) is None:
            return
        self._bounds.append((now, now - int(tscs[1] * self.ns_per_tick)))
        while self._bounds and self._bounds[0][0] < now - OFFSET_SPAN_NS:
            self._bounds.pop(0)

    def span(self, data: bytes) -> tuple[int, int] | None:
        """The host time span of ``data``'s records (None: not known)."""
        if self.ns_per_tick is None or not self._bounds or (tscs := self._tscs(data)) is None:
            return None
        offset = min(bound for _, bound in self._bounds)
        return int(tscs[0] * self.ns_per_tick) + offset, int(tscs[1] * self.ns_per_tick) + offset


class _Stream:
    """One xentrace's output as it arrives in a local file: taken in whole pCPU blocks (xentrace writes each pCPU's
    buffer window after a CPU_CHANGE record that gives its pCPU and length), what was taken freed from the file."""

    def __init__(self, local: Path, process: Any, follows: bool) -> None:
        self.local, self.process, self.follows = local, process, follows
        self._offset = 0  # the next block's first byte
        self._freed = 0
        self._fd = -1
        self.broken = False

    def take(self) -> tuple[bytes, str | None]:
        """The whole blocks that arrived since the last take, and a problem to note (or None)."""
        if self.broken:
            return b"", None
        if self._fd < 0:
            try:
                self._fd = os.open(self.local, os.O_RDWR)
            except FileNotFoundError:
                return b"", None
        data = os.pread(self._fd, MAX_TAKE, self._offset)
        position = 0
        while position + BLOCK_HEAD <= len(data):
            header, _cpu, length = struct.unpack_from("<III", data, position)
            if header & 0x0FFFFFFF != TRC_TRACE_CPU_CHANGE or (header >> 28) & 7 != 2:
                self.broken = True  # not xentrace's block structure: nothing after this is trusted
                said = data[position:position + 32].decode("ascii", errors="replace")
                return data[:position], (f"xentrace's stream broke at byte {self._offset + position} "
                                         f"({re.sub(r'[^ -~]', '?', said)!r}...): its rest is not read")
            if position + BLOCK_HEAD + length > len(data):
                break
            position += BLOCK_HEAD + length
        self._offset += position
        end = self._offset // FREE_BLOCK * FREE_BLOCK
        why = free_range(self._fd, self._freed, end)
        self._freed = max(self._freed, end) if why is None else self._freed
        return data[:position], (f"xentrace's stream file could not be freed as it was read ({why})" if why else None)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self.local.unlink(missing_ok=True)


def _count_records(path: Path) -> int:
    try:
        return sum(1 for _ in parse_records(path.read_bytes()))
    except (OSError, TraceError):
        return 0
