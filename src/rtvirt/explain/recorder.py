"""The flight recorder: drains a tracefs instance while the run goes and keeps only the trace that can still
explain an outlier, within a byte bound per CPU.

A thread reads each traced CPU's ``per_cpu/cpuN/trace_pipe`` (consuming, non-blocking; on an SSH target, what
a reader of that pipe there sent over the connection: explain.remote) every ``DRAIN_S`` and cuts what it read
into chunks of ``CHUNK_NS`` of trace time. It follows the run's sample file as the agent
writes it (:class:`~rtvirt.stream.StreamReader`) and holds the samples that can still be explained: above the
floor of the outlier threshold (the set ``threshold``, else the rule's ``floor``: the final threshold, the
larger of p99.9 and the floor, is never below it) and not below the running ``top``-th largest value (the
``top`` largest of all samples can only grow, so a sample below it now is never among the explained). A
chunk is kept while such a sample's window, with the attribution's margin around it, needs it, including
the chunks back to a ``sched_switch`` before the window (``TracefsInstance.events_around`` starts there:
what was running when the window began); the others are discarded once no later sample can need them
(older than ``SLACK_NS`` plus the margin, and behind a switch; and, for up to ``OPEN_NS`` more, older than
each sampling CPU's newest sample: a window still open while its thread is held off starts there). When the
kept chunks of a CPU exceed the bound, the chunks of the smallest candidate go first, then the oldest unneeded
ones; every window that lost events that way is remembered and named in the layer's notes. Nothing is guessed:
a window whose trace is whole is read exactly as the whole trace would have been read.

Samples and trace need not share a clock or CPU numbers: a :class:`SampleMap` places a sample's window in the
trace (the host's and a target's samples are stamped on their trace clock, on the CPU they ran on:
:class:`SameClock`; a guest's are on the guest's clock and vCPUs, placed by the VM layer through the clock
exchange, with the uncertainty of that placement added around the window).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from ..stream import StreamReader
from .config import ExplainConfig
from .model import CollectContext
from .tracefs import LocalTracefs, PipeAccess, TracefsInstance, TracePipe, gap_line, line_stamp, mark_losses

__all__ = ["FlightRecorder", "KeepRule", "keep_rule", "LostWindow", "SampleMap", "SameClock", "bound_notes", "listed",
           "run_start_ns", "start_recording", "window_label", "CHUNK_NS",
           "DRAIN_S", "OPEN_NS", "SLACK_NS", "RING_KB"]

CHUNK_NS = 10_000_000  # trace time per chunk: what is kept around a window is rounded out to this
DRAIN_S = 0.05  # how often the per-CPU pipes are drained and the sample file is read
SLACK_NS = 1_000_000_000  # how late a sample may reach the file after its window (the agent writes 4x a second)
OPEN_NS = 10_000_000_000  # how long a window may stay open (its thread held off) beyond SLACK_NS and be kept whole
RING_KB = 4096  # the kernel's ring per CPU while the recorder drains it (never above the kept bound)
MAX_NAMED = 20  # outlier windows named one by one in a note
UNPLACED_MAX = 100_000  # samples held while they cannot be placed in the trace (about 4 MB)
SWITCH = "sched_switch:"


class KeepRule(NamedTuple):
    """Which samples can become explained outliers: value above ``above_ns``, among the ``top`` largest."""

    above_ns: int
    top: int


def keep_rule(config: ExplainConfig) -> KeepRule | None:
    """The samples a flight recorder keeps the trace for: the final threshold is never below the set one or the
    rule's floor, and at most ``top`` are explained; None when the scenario turns the recorder off."""
    if not config.flight_recorder:
        return None
    return KeepRule(config.threshold if config.threshold is not None else config.floor, config.top)


class LostWindow(NamedTuple):
    """A candidate outlier window (sample clock) whose trace the recorder could not keep whole, and why."""

    cpu: int
    start_ns: int
    latency_ns: int
    why: str  # "bound": the byte bound dropped part of it; "late": its sample came after the trace went


class SampleMap(Protocol):
    """Where a sample's window lies in the trace."""

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        """The traced CPUs whose trace can explain a sample taken on ``sample_cpu``."""
        ...

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        """A sample time on the trace clock and how far off that may be (ns); None while it cannot be placed."""
        ...


class SameClock:
    """Samples stamped on the trace clock of the CPU they ran on (this host, a target)."""

    def trace_cpus(self, sample_cpu: int) -> tuple[int, ...]:
        return (sample_cpu,)

    def to_trace(self, sample_ns: int) -> tuple[int, int] | None:
        return sample_ns, 0


@dataclass(slots=True)
class _Chunk:
    seq: int
    first_ns: int
    last_ns: int
    data: bytes  # the chunk's trace text, zlib-compressed (the bound holds several times more than the text)
    # where a window's walk-back may stop in it: its first sched_switch (None if it has none); in a trace read
    # without context (walk_back off), its first line
    anchor_ns: int | None
    lines: int
    next_first_ns: int | None = None  # where the next chunk begins (None: not read yet)


class _Cpu:
    """One traced CPU's pipe and chunks (present ones by seq; dropped seq ranges remembered)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.pipe: TracePipe | None = None
        self.chunks: list[_Chunk] = []  # seq order
        self.newest: _Chunk | None = None  # the last chunk read (held or not)
        self.partial = ""  # a line cut by a read
        self.next_seq = 0
        self.bytes = 0
        self.peak_bytes = 0
        self.dropped: list[tuple[int, int, int]] = []  # seq ranges the bound dropped: first, last, first's start
        self.dropped_lines = 0
        self.read_lines = self.read_bytes = 0  # all it read (what tracing cost the run: explain.cost)
        self.first_ns: int | None = None


def _anchored(chunk: _Chunk, before_ns: int) -> bool:
    """The chunk holds its anchor (a sched_switch) before ``before_ns``."""
    return chunk.anchor_ns is not None and chunk.anchor_ns < before_ns


def _first_switch(text: str) -> int | None:
    at = text.find(SWITCH)
    if at < 0:
        return None
    begin, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
    return line_stamp(text[begin:end if end >= 0 else len(text)])


class FlightRecorder:
    """Drains ``instance_path``'s per-CPU pipes for ``cpus`` beside the run writing ``samples``; keeps at most
    ``bound_bytes`` of compressed trace per CPU around the windows ``rule`` says can become explained outliers.
    ``margin_ns``: how far around a window the attribution reads (host.MARGIN_NS). ``access``: whose tracefs
    (default: this machine's); on another machine the trace clock's present is the newest trace time read.
    ``placement``: how samples map onto the trace (default: the same clock and CPUs). ``walk_back``: a window's
    trace reaches back to a sched_switch before it (what was running when it began); off for a trace read
    without such context (the VM layer's wake-ups, which has no switches: it would hold everything from the
    first line for every window)."""

    def __init__(self, instance_path: Path, cpus: Sequence[int], samples: Path, rule: KeepRule, *,
                 bound_bytes: int, margin_ns: int, access: PipeAccess | None = None,
                 placement: SampleMap | None = None, walk_back: bool = True) -> None:
        self.path, self.samples, self.rule = instance_path, samples, rule
        self.walk_back = walk_back
        self.placement: SampleMap = placement or SameClock()
        self.bound_bytes, self.margin_ns = bound_bytes, margin_ns
        self.cpus = tuple(cpus)
        self._access = access or LocalTracefs()
        self._now: Callable[[], int] | None = time.monotonic_ns if self._access.here else None
        self._newest_ns = 0  # the latest trace time read, on any CPU
        self._cpus = {cpu: _Cpu(cpu) for cpu in self.cpus}  # their pipes are opened by start()
        # candidates: (cpu, start, latency) -> end; the running top values of samples above the rule's floor
        self._candidates: dict[tuple[int, int, int], int] = {}
        self._top: list[int] = []
        # (traced CPU, candidate) -> that CPU's chunks it needs, read whole
        self._settled: dict[tuple[int, tuple[int, int, int]], tuple[int, int]] = {}
        self._unplaced: list[np.ndarray] = []  # samples read before the placement knew the sample clock
        # once finished: per CPU, where its kept trace resumes after a stretch that was not kept (a reader of the
        # whole text must not take what it saw before such a point as still true after it)
        self.resumes: dict[int, list[int]] = {}
        self.max_lag_ns = 0
        self._newest_start: dict[int, int] = {}  # sample CPU -> its newest sample's start (sample clock)
        self._widening_ns = 0  # the largest placement uncertainty so far (0 on the same clock)
        self.lost: dict[tuple[int, int, int], LostWindow] = {}
        self.problems: list[str] = []
        self._following = True
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._reader: StreamReader | None = None

    def start(self) -> None:
        try:
            for cpu, state in self._cpus.items():
                state.pipe = self._access.open_pipe(str(self.path / "per_cpu" / f"cpu{cpu}" / "trace_pipe"),
                                                    away_from=self.cpus)
                if state.pipe.concern and state.pipe.concern not in self.problems:
                    self.problems.append(state.pipe.concern)
        except OSError:
            self.close()
            raise
        self._reader = StreamReader(self.samples, keep=False)
        self._thread = threading.Thread(target=self._run, name="rtvirt-flight-recorder", daemon=True)
        self._thread.start()

    # ---- the thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        # the recorder is the instrument's own noise: off the traced CPUs when others are usable (as the agent's
        # writer); a thread's affinity is its own
        with contextlib.suppress(OSError):
            if others := os.sched_getaffinity(0) - set(self.cpus):
                os.sched_setaffinity(0, others)
        while not self._stop.wait(DRAIN_S):
            try:
                with self._lock:
                    self._step(final=False)
            except Exception as exc:  # noqa: BLE001 - a recorder never fails the measurement
                self.problems.append(f"the flight recorder stopped: {type(exc).__name__}: {exc}"[:300])
                return

    def _present(self) -> int:
        """Now on the trace clock."""
        return self._now() if self._now is not None else self._newest_ns

    def _step(self, final: bool) -> None:
        for state in self._cpus.values():
            self._drain(state, final)
        if self._following and self._reader is not None:
            self._follow(final)
        # a window starting before the horizon is not expected any more: its sample would be later than twice
        # the latest seen so far (and a placed window reaches back by its placement's uncertainty)
        slack = max(SLACK_NS, 2 * self.max_lag_ns) + self._widening_ns
        self.settle(None if final else self._present() - slack)

    def _drain(self, state: _Cpu, final: bool) -> None:
        if state.pipe is None:
            return
        text = state.partial + state.pipe.read(final).decode(errors="replace")
        cut = text.rfind("\n") + 1
        state.partial = text[cut:]
        # the pipe's own "CPU:1 [LOST 12 EVENTS]" becomes a gap marker where it happened (the stats count them)
        lines = mark_losses(text[:cut].splitlines())
        if lines:
            self.take(state.cpu, lines)

    def take(self, cpu: int, lines: list[str]) -> None:
        """Trace lines of ``cpu`` read since the last call (time-ordered), cut at every CHUNK_NS of trace time."""
        state = self._cpus[cpu]
        start = 0
        while start < len(lines):
            first = line_stamp(lines[start])
            if first is None:  # not an event line: no time to file it under
                start += 1
                continue
            boundary = (first // CHUNK_NS + 1) * CHUNK_NS
            end = bisect.bisect_left(lines, boundary, lo=start + 1, key=lambda line: line_stamp(line) or 0)
            text = "\n".join(lines[start:end])
            last = line_stamp(lines[end - 1]) or first
            data = zlib.compress(text.encode(), 1)
            state.read_lines, state.read_bytes = state.read_lines + end - start, state.read_bytes + len(text) + 1
            state.first_ns = first if state.first_ns is None else state.first_ns
            self._newest_ns = max(self._newest_ns, last)
            if state.newest is not None:
                state.newest.next_first_ns = first
            anchor = _first_switch(text) if self.walk_back else first
            state.newest = _Chunk(state.next_seq, first, last, data, anchor, end - start)
            state.chunks.append(state.newest)
            state.next_seq += 1
            state.bytes += len(data)
            start = end

    def _follow(self, final: bool) -> None:
        assert self._reader is not None
        try:
            records = self._reader.poll(final=final)
        except Exception as exc:  # noqa: BLE001 - a corrupt or missing file: from now on, keep the newest trace
            self._following = False
            self.problems.append(f"the flight recorder could not follow the samples: {exc}"[:300])
            return
        if self._reader.header is not None and self._reader.header.get("value_field") not in (
                "latency_ns", "duration_ns"):
            return  # values that are not windows are never explained
        if records.size:
            held = self._holdable(records)  # (first: it may start the list anew)
            self._unplaced.append(held)
        if not self._unplaced:
            return
        records = np.concatenate(self._unplaced)
        ends = records["t_ns"].astype(np.int64) + records["value"].astype(np.int64)
        placed = self.placement.to_trace(int(ends.min()))
        if placed is None:
            return  # a guest's samples wait for the clock exchange that places them
        self._unplaced = []
        # how late samples reach the recorder after their window ended (docs, the slack)
        self.max_lag_ns = max(self.max_lag_ns, self._present() - placed[0])
        latest = self.placement.to_trace(int(ends.max()))
        self._widening_ns = max(self._widening_ns, placed[1], latest[1] if latest else 0)
        self.consider(records)

    def _holdable(self, records: np.ndarray) -> np.ndarray:
        """What of samples that cannot be placed yet (a guest's before its clock exchange, or ever, when the
        exchange failed) must wait: those above the rule's floor, and each CPU's newest (where its open window
        starts); at most UNPLACED_MAX of the largest, so a run that is never placed holds a bounded amount."""
        values = records["value"].astype(np.int64)
        keep = values > self.rule.above_ns
        for cpu in np.unique(records["cpu"]).tolist():
            on_cpu = np.flatnonzero(records["cpu"] == cpu)
            keep[on_cpu[np.argmax(records["t_ns"][on_cpu])]] = True
        held = records[keep]
        waiting = sum(part.size for part in self._unplaced)
        if waiting + held.size > UNPLACED_MAX:  # the smallest go: they can no longer be among the top largest
            merged = np.concatenate([*self._unplaced, held])
            self._unplaced = []
            return merged[np.sort(np.argsort(-merged["value"].astype(np.int64), kind="stable")[:UNPLACED_MAX])]
        return held

    def consider(self, records: np.ndarray) -> None:
        """New samples (stream records, in the file's order): hold those that can become explained outliers."""
        if not records.size:
            return
        for cpu in np.unique(records["cpu"]).tolist():
            if self.traced(cpu):
                newest = int(records["t_ns"][records["cpu"] == cpu].max())
                self._newest_start[cpu] = max(self._newest_start.get(cpu, newest), newest)
        values = records["value"].astype(np.int64)
        floor = max(self.rule.above_ns, self._top[0] if len(self._top) >= self.rule.top else self.rule.above_ns)
        chosen = np.flatnonzero(values > floor)
        for index in chosen[np.argsort(-values[chosen], kind="stable")].tolist():
            value = int(values[index])
            if len(self._top) < self.rule.top:
                heapq.heappush(self._top, value)
            elif value > self._top[0]:
                heapq.heapreplace(self._top, value)
            else:
                continue
            cpu, start = int(records["cpu"][index]), int(records["t_ns"][index])
            if self.traced(cpu):
                self._candidates[(cpu, start, value)] = start + value
        if len(self._top) >= self.rule.top:  # fell below the running top-th largest: can never be explained
            least = self._top[0]
            for key in [key for key in self._candidates if key[2] < least]:
                del self._candidates[key]
                self.lost.pop(key, None)  # (what it lost no longer matters: the notes name explained windows)
                for cpu in self.placement.trace_cpus(key[0]):
                    self._settled.pop((cpu, key), None)

    def settle(self, horizon: int | None) -> None:
        """Keep what the candidates need, discard what no sample starting after ``horizon`` can need (None: the
        run is over, keep only what they need), hold the bound. A CPU's next window starts after its newest
        sample but stays open for as long as its thread is held off (a stalled guest's or a starved thread's
        largest window comes late), so the horizon waits at the oldest of the CPUs' newest samples, for at most
        OPEN_NS (a CPU whose probe reports only gaps may rightly stay silent)."""
        if horizon is not None and self._newest_start:
            open_from = self.placement.to_trace(min(self._newest_start.values()))
            if open_from is not None:
                horizon = max(min(horizon, open_from[0] - open_from[1]), horizon - OPEN_NS)
        for state in self._cpus.values():
            self._maintain(state, horizon)

    def _maintain(self, state: _Cpu, horizon: int | None) -> None:
        """Mark what the candidates need, discard what no sample can need any more, hold the bound."""
        needers: dict[int, list[tuple[int, int, int]]] = {}  # seq -> the candidates needing that chunk
        chunks = state.chunks
        firsts = [chunk.first_ns for chunk in chunks]
        for key, end in self._candidates.items():
            if state.cpu not in self.placement.trace_cpus(key[0]) or key in self.lost:
                continue
            settled = self._settled.get((state.cpu, key))
            if settled is not None:  # its trace was read whole: only the bound can take it now (and says so)
                for seq in range(settled[0], settled[1] + 1):
                    needers.setdefault(seq, []).append(key)
                continue
            first, last = self.placement.to_trace(key[1]), self.placement.to_trace(end)
            if first is None or last is None:
                continue
            low, high = first[0] - first[1] - self.margin_ns, last[0] + last[1] + self.margin_ns
            # from the last chunk starting at or before low back to one with a switch before low: events_around
            # reads from the last switch before the window's margin (what was running when it began)
            index = max(bisect.bisect_right(firsts, low) - 1, 0)
            while index < len(chunks) and not _anchored(chunks[index], low) and index > 0 and \
                    chunks[index - 1].seq == chunks[index].seq - 1:
                index -= 1
            after = bisect.bisect_right(firsts, high)
            span = chunks[index:after]
            following = chunks[after].seq if after < len(chunks) else state.next_seq
            why = self._gap(state, span, following, low, high)
            if why is not None:  # part of its trace is gone: dropped by the bound, or gone before its sample came
                self.lost[key] = LostWindow(key[0], key[1], key[2], why)
                continue
            if not span:  # it lies before anything this CPU traced: nothing to keep for it
                continue
            for chunk in span:
                needers.setdefault(chunk.seq, []).append(key)
            if span[-1].next_first_ns is not None and span[-1].next_first_ns > high:
                self._settled[(state.cpu, key)] = (span[0].seq, span[-1].seq)
        # (without the samples the candidates are not known: nothing is discarded, the bound keeps the newest)
        if self._following and horizon is None:  # the run is over: only what a candidate needs stays
            self._keep_only(state, lambda chunk: chunk.seq in needers)
        elif self._following and horizon is not None:
            # the newest chunk holding a switch before any later window's margin: no later sample needs what
            # lies before it
            anchor = next((chunk.seq for chunk in reversed(chunks)
                           if _anchored(chunk, horizon - self.margin_ns)), None)
            if anchor is not None:
                self._keep_only(state, lambda chunk: chunk.seq >= anchor or chunk.seq in needers)
        if state.bytes > self.bound_bytes:
            # the smallest candidates' chunks go first, then the oldest no candidate needs yet: what was read
            # last may still become the largest outlier's window (its sample is on its way)
            def worth(chunk: _Chunk) -> tuple[int, int, int]:
                keys = needers.get(chunk.seq)
                return (0, max(key[2] for key in keys), chunk.seq) if keys else (1, 0, chunk.seq)

            dropped = set()
            for victim in sorted(state.chunks, key=worth):
                if state.bytes <= self.bound_bytes:
                    break
                self._drop(state, victim)
                dropped.add(victim.seq)
                for key in needers.get(victim.seq, ()):
                    self.lost.setdefault(key, LostWindow(key[0], key[1], key[2], "bound"))
            state.chunks = [chunk for chunk in state.chunks if chunk.seq not in dropped]
        state.peak_bytes = max(state.peak_bytes, state.bytes)

    def _keep_only(self, state: _Cpu, keep: Callable[[_Chunk], bool]) -> None:
        kept = []
        for chunk in state.chunks:
            if keep(chunk):
                kept.append(chunk)
            else:
                state.bytes -= len(chunk.data)
        state.chunks = kept

    @staticmethod
    def _gap(state: _Cpu, span: list[_Chunk], following: int, low: int, high: int) -> str | None:
        """Why the trace a window [low, high] needs is not whole (None: it is): "bound" when the bound dropped
        part of it, "late" when it was discarded before the window's sample came. ``span``: the chunks held
        from its walk-back anchor to its end; ``following``: the seq of the next chunk held (or to come)."""
        def missing(first: int, last: int, before_high: bool = False) -> str | None:  # seqs first..last not held
            if first > last:
                return None
            covered = 0
            for begin, end, start_ns in state.dropped:
                overlap = min(end, last) - max(begin, first) + 1
                if overlap > 0:
                    if not before_high or start_ns <= high:
                        return "bound"
                    covered += overlap
            # discarded chunks (their times are not kept) may have held lines of the window
            return "late" if covered < last - first + 1 else None

        if not span:  # every chunk held begins after the window
            return missing(0, following - 1, True)
        if not _anchored(span[0], low) and span[0].seq > 0:  # the walk-back reaches a chunk no longer held
            return missing(span[0].seq - 1, span[0].seq - 1) or "late"
        for earlier, later in zip(span, span[1:], strict=False):
            if later.seq != earlier.seq + 1:
                return missing(earlier.seq + 1, later.seq - 1) or "late"
        ahead = span[-1].next_first_ns  # the chunk after the span, held or not, holds lines up to high?
        if ahead is not None and ahead <= high and following != span[-1].seq + 1:
            return missing(span[-1].seq + 1, following - 1) or "late"
        return None

    def _drop(self, state: _Cpu, victim: _Chunk) -> None:
        """Account for a chunk the bound drops (the caller takes it out of ``state.chunks``)."""
        state.bytes -= len(victim.data)
        state.dropped_lines += victim.lines
        # its seq and start, merged with the last drop's when they are neighbours (a long drop is one entry)
        if state.dropped and state.dropped[-1][1] == victim.seq - 1:
            state.dropped[-1] = (state.dropped[-1][0], victim.seq, state.dropped[-1][2])
        elif state.dropped and state.dropped[-1][0] == victim.seq + 1:
            state.dropped[-1] = (victim.seq, state.dropped[-1][1], victim.first_ns)
        else:
            state.dropped.append((victim.seq, victim.seq, victim.first_ns))

    # ---- the owner's side ------------------------------------------------------------------------------------

    def finish(self) -> dict[int, str]:
        """After tracing stopped: the last drain and samples, the thread gone, the pipes closed; each CPU's
        kept trace text (chunks in time order)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                self.problems.append("the flight recorder's thread did not end")
        texts: dict[int, str] = {}
        try:
            with self._lock:
                self._step(final=True)
        except Exception as exc:  # noqa: BLE001
            self.problems.append(f"the flight recorder's last drain failed: {type(exc).__name__}: {exc}"[:300])
        for cpu, state in self._cpus.items():
            self.resumes[cpu] = [chunk.first_ns for before, chunk in zip(state.chunks, state.chunks[1:], strict=False)
                                 if chunk.seq != before.seq + 1]
            # a gap marker where the kept trace resumes after a stretch not kept (readers forget the CPU there)
            texts[cpu] = "\n".join((gap_line(cpu, chunk.first_ns, "resume") + "\n" if index and chunk.seq !=
                                    state.chunks[index - 1].seq + 1 else "") + zlib.decompress(chunk.data).decode()
                                   for index, chunk in enumerate(state.chunks))
        self.close()
        return texts

    def close(self) -> None:
        """Close the pipes (the instance cannot be removed while they are open); idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)  # (a second Ctrl-C may have cut finish's join short)
            if self._thread.is_alive():  # it may still read them: leave them open, the instance to reclaim
                return
        for state in self._cpus.values():
            if state.pipe is not None:
                state.pipe.close()
                state.pipe = None
        if self._reader is not None:
            with contextlib.suppress(Exception):
                self._reader.close()

    @property
    def dropped_lines(self) -> int:
        """Trace lines the bound dropped (the kernel's own losses are the instance's stats)."""
        return sum(state.dropped_lines for state in self._cpus.values())

    def read(self) -> tuple[int, int, int]:
        """Trace lines and bytes read over all CPUs, and the trace time they span (ns)."""
        firsts = [state.first_ns for state in self._cpus.values() if state.first_ns is not None]
        span = self._newest_ns - min(firsts) if firsts else 0
        return (sum(state.read_lines for state in self._cpus.values()),
                sum(state.read_bytes for state in self._cpus.values()), span)

    def peak_bytes(self) -> dict[int, int]:
        """The most trace text each CPU held at once (never above the bound once a step ended)."""
        return {cpu: state.peak_bytes for cpu, state in self._cpus.items()}

    def traced(self, sample_cpu: int) -> bool:
        """Whether the trace of a sample taken on ``sample_cpu`` is recorded here."""
        return any(cpu in self._cpus for cpu in self.placement.trace_cpus(sample_cpu))

    def held(self, cpu: int, start_ns: int, latency_ns: int) -> bool:
        """Whether that sample's window was a candidate when the run ended (its trace kept unless lost)."""
        return (cpu, start_ns, latency_ns) in self._candidates


def start_recording(instance: TracefsInstance, recorder: FlightRecorder) -> FlightRecorder | None:
    """Start ``recorder`` draining the started ``instance``, whose trace then comes from it; None when it cannot
    start (the instance says so, and its buffer is read at the end instead)."""
    try:
        recorder.start()
    except OSError as exc:
        instance.problems.append(f"the flight recorder could not start ({exc.strerror or exc}): the "
                                 f"{instance.buffer_kb} KiB buffer is read at the end instead")
        return None
    instance.drain = recorder
    return recorder


def bound_notes(recorder: FlightRecorder | None, ring_dropped: int, context: CollectContext, keep_kb: int,
                cpu_word: str = "CPU") -> tuple[list[str], int]:
    """What a layer's bound cost (its notes, and the events dropped): the kernel's ring, and with a flight
    recorder its own bound, window by window (each named with its sample's ``cpu_word``: a guest's are vCPUs)."""
    if recorder is None:
        return ([f"the trace buffer bound dropped {ring_dropped} events"] if ring_dropped else []), ring_dropped
    notes = [f"the kernel's trace ring overflowed before the flight recorder read it: {ring_dropped} events lost"
             ] if ring_dropped else []
    notes += _recorder_notes(recorder, context.windows, context.header, keep_kb, cpu_word)
    return notes, ring_dropped + recorder.dropped_lines


def _recorder_notes(recorder: FlightRecorder, windows: np.ndarray, header: dict[str, object],
                    keep_kb: int, cpu_word: str) -> list[str]:
    """What the flight recorder's bound cost, named window by window (rank, time from the run's start, CPU)."""
    peak = max(recorder.peak_bytes().values(), default=0)
    notes = [f"the flight recorder held at most {peak / 1024:.0f} KiB of compressed trace per traced CPU at once "
             f"(its bound: {keep_kb} KiB per traced CPU)"]
    if recorder.dropped_lines:
        notes.append(f"the flight recorder's bound ({keep_kb} KiB per CPU) dropped {recorder.dropped_lines} events")
    start = run_start_ns(header)
    lost: dict[str, list[str]] = {"bound": [], "late": [], "missed": []}
    for rank, (begin, _, cpu, latency) in enumerate(windows[["start_ns", "end_ns", "cpu", "latency_ns"]].tolist(), 1):
        key = (int(cpu), int(begin), int(latency))
        if not recorder.traced(key[0]):  # a CPU this layer does not trace: nothing of it was to keep
            continue
        why = recorder.lost[key].why if key in recorder.lost else None if recorder.held(*key) else "missed"
        if why is not None:
            lost[why].append(window_label(rank, begin, cpu, latency, start, cpu_word))
    said = {"bound": "lost trace events to the flight recorder's bound",
            "late": f"lost trace events: their samples reached the recorder after that trace was discarded (the "
                    f"latest sample came {recorder.max_lag_ns / 1e9:.2f} s after its window ended)",
            "missed": "were not held by the flight recorder (their samples never reached it)"}
    for why, named in lost.items():
        if named:
            notes.append(f"{len(named)} outlier windows {said[why]} (their parts may be unexplained or "
                         f"incomplete): {listed(named)}")
    return notes


def run_start_ns(header: dict[str, object]) -> int:
    """When the run's agent started measuring (its stream header; 0 when not said)."""
    return int(header.get("start_monotonic_ns") or 0)  # type: ignore[call-overload]


def window_label(rank: int, begin: int, cpu: int, latency: int, run_start: int, cpu_word: str = "CPU") -> str:
    """An outlier window as notes name it: its rank, time from the run's start (when known), CPU and length."""
    where = f" at +{(begin - run_start) / 1e9:.3f} s" if run_start else ""
    return f"#{rank}{where} on {cpu_word} {cpu} ({latency / 1e3:.1f} us)"


def listed(labels: list[str]) -> str:
    """The first MAX_NAMED labels, and how many more."""
    return ", ".join(labels[:MAX_NAMED]) + (f" and {len(labels) - MAX_NAMED} more" if len(labels) > MAX_NAMED
                                            else "")
