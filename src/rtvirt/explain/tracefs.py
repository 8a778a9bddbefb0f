"""A tracefs instance of rtvirt's own: only the CPUs and events asked for, a bounded buffer, read back as events.

Every tracer of rtvirt (the host layer, the VM layer's pCPUs) uses :class:`TracefsInstance`: it makes
``instances/rtvirt-<pid>-<start>-<n>`` (the pid and start time of the process that owns it), sets its
``tracing_cpumask``, ``trace_clock`` (``mono``: the CLOCK_MONOTONIC the host agent stamps its samples
with), buffer size and events, and removes it again: removing an instance disables its events and frees
its buffer, so the top-level tracing settings (which other tools may be using) are never touched. An
instance whose owner died (kill -9) is removed by :func:`reclaim_instances` (every campaign start,
``--resume`` and ``--explain`` call it); instances of live processes are never touched.

The trace is read as text (``per_cpu/cpuN/trace``) and parsed by :func:`parse_trace`, which also reads the
trace text a guest's tracefs produces (same format). Text timestamps have microsecond resolution: that is
the alignment uncertainty a layer states.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import heapq
import io
import itertools
import os
import re
import subprocess
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from ..procs import owned_prefix, process_start_time

__all__ = ["TracefsInstance", "TracefsAccess", "PipeAccess", "LocalTracefs", "TraceEvent", "TracingUnavailable",
           "parse_trace", "body_fields", "line_stamp", "events_around", "untraced_switch_in", "tracefs_root",
           "TraceDrain", "TracePipe", "LocalPipe", "reclaim_instances", "TEXT_RESOLUTION_NS", "INSTANCE_PREFIX",
           "MOUNT_POINTS", "POLICY_NAMES", "GAP_EVENT", "gap_line", "mark_losses", "bounded"]

MOUNT_POINTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
INSTANCE_PREFIX = "rtvirt-"
# rtvirt-<pid>-<start time>-<n>; other rtvirt tracers' "rtvirt-<pid>-<tag>" are recognised by their pid alone
_INSTANCE_NAME = re.compile(r"^rtvirt-(\d+)-(?:(\d+)-(\d+)|[A-Za-z0-9_.]+)$")
TEXT_RESOLUTION_NS = 1000  # the text trace prints microseconds
DEFAULT_BUFFER_KB = 64 * 1024  # per traced CPU
PIPE_READ = 1 << 20  # bytes per read of a trace_pipe
_counter = itertools.count(1)

# "<comm>-<pid> (<tgid>) [<cpu>] <flags> <sec>.<usec>: <event>: <body>" (the flags are 4-6 characters, 7 on a
# PREEMPT_RT kernel: "d...2.."); a comm is at most 15 characters of
# anything (even "-1 [000]"): the shortest comm after which the whole line matches is the one the kernel wrote
_LINE = re.compile(r"^\s*(?P<comm>.{0,16}?)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>[-\d]+)\)\s+)?\[(?P<cpu>\d+)\]\s+"
                   r"(?:\S{4,8}\s+)?(?P<sec>\d+)\.(?P<usec>\d{6}):\s+(?P<event>\w+):\s?(?P<body>.*)$")
_FIELD = re.compile(r"(\w+)=(\S*)")
# the kernel's own line where a CPU's ring lost events before the next one it printed
# (trace-cmd report says "CPU:1 [12 EVENTS DROPPED]")
_LOST = re.compile(r"^\s*CPU:\s*(?P<cpu>\d+) \[(?:LOST (?P<lost>\d+) EVENTS|(?P<dropped>\d+) EVENTS DROPPED)\]")
# a line rtvirt puts in a trace text where it has a gap (events lost, or trace not kept): the readers forget what
# they knew of the CPU there (explain.cpuevents), and the walk back to a window's first switch stops there
GAP_EVENT = "rtvirt_gap"


class TracingUnavailable(Exception):
    """Tracing cannot be used here (no root, no tracefs, no such event); the message says why."""


class TraceEvent(NamedTuple):
    """One line of a text trace; ``ts_ns`` on the instance's trace clock."""

    ts_ns: int
    cpu: int
    pid: int
    tgid: int | None  # None: the trace did not record it (or the kernel did not know it)
    comm: str
    event: str
    body: str


def bounded(text: str, limit: int = 64) -> str:
    """An untrusted name from a traced system made printable and short."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def body_fields(body: str) -> dict[str, str]:
    """The ``key=value`` fields of an event's body (values without spaces: comms need the event's own regex)."""
    return dict(_FIELD.findall(body))


def line_stamp(line: str) -> int | None:
    """The time stamp of one trace line (None: not an event line)."""
    match = _LINE.match(line)
    return int(match["sec"]) * 1_000_000_000 + int(match["usec"]) * 1000 if match else None


def gap_line(cpu: int, ts_ns: int, what: str) -> str:
    """A trace line marking a gap of ``cpu``'s trace that ends at ``ts_ns`` (``what``: "lost=12", "resume")."""
    seconds, micros = ts_ns // 1_000_000_000, ts_ns % 1_000_000_000 // 1000
    return f"           <gap>-0       (-------) [{cpu:03d}] ..... {seconds}.{micros:06d}: {GAP_EVENT}: {what}"


def mark_losses(lines: list[str]) -> list[str]:
    """``lines`` with each ``CPU:N [LOST k EVENTS]`` line turned into a gap marker at the time of the event after
    it (the kernel prints it before the first event it could still record), so that the loss is read where it
    happened instead of being bridged."""
    if not any("CPU:" in line[:12] for line in lines):
        return lines
    return list(marked_losses(lines))


def marked_losses(lines: Iterable[str]) -> Iterator[str]:
    """:func:`mark_losses` one line at a time (for a trace read as it is parsed, never held whole)."""
    pending: tuple[int, str] | None = None
    for line in lines:
        lost = _LOST.match(line) if "CPU:" in line[:12] else None
        if lost is not None:
            pending = (int(lost["cpu"]), lost["lost"] or lost["dropped"])
            continue
        stamp = line_stamp(line) if pending is not None else None
        if pending is not None and stamp is not None:
            yield gap_line(pending[0], stamp, f"lost={pending[1]}")
            pending = None
        yield line


def untraced_switch_in(since: int, woken_at: int | None, previous: int, until: int) -> tuple[int, str]:
    """Where a task switched out at ``until`` without a traced switch-in began to run (seen on this development VM:
    one CPU never records a switch from the idle task): at its wake-up onto that CPU when one was traced after
    ``since`` (the CPU's previous switch), else at the CPU's ``previous`` traced event (what demonstrably
    happened before it); and how it was counted, as the layers' ``detail.switch_in`` says it."""
    if woken_at is not None and since < woken_at <= until:
        return woken_at, "not traced: counted from its wake-up"
    return previous, "not traced: counted from the CPU's previous event"


def parse_trace(lines: Iterable[str]) -> Iterator[TraceEvent]:
    """The events of a text trace (``trace``/``trace_pipe`` format, with or without the tgid column);
    comment and unparsable lines are skipped."""
    match_line = _LINE.match
    for line in lines:
        if not line or line[0] == "#":
            continue
        match = match_line(line)
        if match is None:
            continue
        comm, pid, tgid, cpu, sec, usec, event, body = match.groups()
        yield TraceEvent(int(sec) * 1_000_000_000 + int(usec) * 1000, int(cpu), int(pid),
                         int(tgid) if tgid and tgid[0] != "-" else None, comm.strip(), event, body)


def events_around(lines: Sequence[str], start_ns: int, end_ns: int, back_to: str = "sched_switch:"
                  ) -> list[TraceEvent]:
    """The events of one CPU's trace ``lines`` (event lines in time order) in [start_ns, end_ns], from the last
    line holding ``back_to`` before ``start_ns`` (what was running when it began) on: only these lines are
    parsed, found by bisection, so a long trace costs little when a few windows of it matter. A flight
    recorder's kept trace has holes; it keeps each window's lines whole back to such a line."""
    def stamp(line: str) -> int:
        return line_stamp(line) or 0

    first = bisect.bisect_left(lines, start_ns, key=stamp)
    last = bisect.bisect_right(lines, end_ns, lo=first, key=stamp)
    # (a window after the trace; not back across a gap: what was before it says nothing of what came after)
    while first > 0 and (first == len(lines) or (back_to not in lines[first] and GAP_EVENT not in lines[first])):
        first -= 1
    return list(parse_trace(lines[first:last]))


def _mounted_tracefs() -> Path | None:
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "tracefs" and Path(fields[1]) in MOUNT_POINTS:
            return Path(fields[1])
    return None


def tracefs_root(mount: bool = True) -> Path:
    """Where tracefs is mounted; mounts it at /sys/kernel/tracing when it is not (and ``mount``)."""
    root = _mounted_tracefs()
    if root is not None:
        return root
    if os.geteuid() != 0:
        raise TracingUnavailable("tracing needs root (tracefs is not mounted and only root may mount it)")
    if not mount:
        raise TracingUnavailable("tracefs is not mounted")
    try:
        result = subprocess.run(["mount", "-t", "tracefs", "nodev", str(MOUNT_POINTS[0])], capture_output=True,
                                timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TracingUnavailable(f"cannot mount tracefs: {exc}") from None
    if result.returncode != 0:
        raise TracingUnavailable(f"cannot mount tracefs: {result.stderr.strip()[:200] or result.returncode}")
    return MOUNT_POINTS[0]


def reclaim_instances(root: Path | None = None) -> list[str]:
    """Remove the rtvirt instances whose owning process is gone (kill -9); say which went."""
    try:
        root = root or tracefs_root(mount=False)
    except TracingUnavailable:
        return []
    removed = []
    with contextlib.suppress(OSError):
        for entry in sorted((root / "instances").iterdir()):
            match = _INSTANCE_NAME.match(entry.name)
            started = process_start_time(int(match[1])) if match else None
            if match is None or (started is not None and match[2] in (started, None)):
                continue  # not ours, or its owner is alive
            with contextlib.suppress(OSError):
                entry.rmdir()  # disables its events and frees its buffer
                removed.append(f"tracefs instance {entry.name} of a dead rtvirt (pid {match[1]})")
    return removed


class TracePipe(Protocol):
    """One CPU's ``trace_pipe``, read as it fills: ``read`` returns what arrived since the last call (b"" when
    nothing; ``final``: tracing is off, return everything still to come); ``close`` lets go of it (idempotent).
    ``concern``: why its reader may disturb what is traced ("" when it runs off the traced CPUs)."""

    concern: str

    def read(self, final: bool = False) -> bytes: ...

    def close(self) -> None: ...


class LocalPipe:
    """A ``trace_pipe`` of this machine, read non-blocking by the flight recorder's thread, which keeps off the
    traced CPUs itself (and, never blocked in the pipe, is not woken by the events it reads)."""

    concern = ""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self, final: bool = False) -> bytes:
        parts = []
        while self._fd >= 0:
            try:
                data = os.read(self._fd, PIPE_READ)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


class PipeAccess(Protocol):
    """What the flight recorder (explain.recorder) needs of a trace's source: its per-CPU pipes, and whether its
    trace clock is this process's. A tracefs (:class:`TracefsAccess`), or a guest's relayed trace
    (explain.guest_stream)."""

    where: str  # for messages: "" here, " on target NAME" there
    here: bool  # this machine's: its trace clock "mono" is this process's CLOCK_MONOTONIC

    def open_pipe(self, path: str, away_from: Collection[int]) -> TracePipe:
        """A per-CPU ``trace_pipe``, to be read while the run goes (explain.recorder) by a reader that runs off
        the CPUs ``away_from`` (the traced ones) where it can."""
        ...


class TracefsAccess(PipeAccess, Protocol):
    """Where a tracefs is and how its files are reached: this machine's (:class:`LocalTracefs`) or an SSH
    target's (``explain.remote.RemoteTracefs``). Paths are absolute; failures raise OSError."""

    def root(self) -> str:
        """The mounted tracefs (mounted now when it is not and that is allowed); TracingUnavailable if none."""
        ...

    def read(self, path: str) -> str: ...

    def write(self, path: str, value: str) -> None: ...

    def mkdir(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def instance_name(self, serial: int) -> str:
        """A new instance's name: rtvirt's prefix and its owner, so that reclaim knows a dead owner's."""
        ...

    def policies(self, pids: Collection[int]) -> dict[int, tuple[str, str]]:
        """The scheduling policies of those tasks that still live, with their comms (a trace has only their
        priorities; the comm tells a reused pid from the traced task)."""
        ...

    def reclaim(self, root: str) -> list[str]:
        """Remove the instances of owners that died (kill -9); say which went."""
        ...


# the kernel's policy numbers (sched_getscheduler, field 41 of /proc/PID/stat) as users read them
POLICY_NAMES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE",
                6: "SCHED_DEADLINE"}


class LocalTracefs:
    """This machine's tracefs, owned by this process (its pid and start time name the instances)."""

    where = ""
    here = True

    def __init__(self, root: Path | None = None) -> None:
        self._root = root

    def root(self) -> str:
        return str(self._root or tracefs_root())

    def read(self, path: str) -> str:
        return Path(path).read_text(errors="replace")

    def write(self, path: str, value: str) -> None:
        Path(path).write_text(value)

    def mkdir(self, path: str) -> None:
        Path(path).mkdir()

    def rmdir(self, path: str) -> None:
        Path(path).rmdir()

    def open_pipe(self, path: str, away_from: Collection[int]) -> TracePipe:
        return LocalPipe(path)  # read by the recorder's own thread, which keeps off away_from

    def instance_name(self, serial: int) -> str:
        return f"{owned_prefix(INSTANCE_PREFIX)}{serial}"

    def policies(self, pids: Collection[int]) -> dict[int, tuple[str, str]]:
        found = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{pid}/comm").read_text(errors="replace").rstrip("\n")
                if (name := POLICY_NAMES.get(os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK)) is not None:
                    found[pid] = (name, bounded(comm, 16))
        return found

    def reclaim(self, root: str) -> list[str]:
        return reclaim_instances(Path(root))


class TraceDrain(Protocol):
    """What reads an instance while it records (``explain.recorder.FlightRecorder``): after tracing stopped,
    ``finish`` gives each CPU's kept trace text; ``close`` (idempotent) lets go of the instance's files."""

    problems: list[str]

    def finish(self) -> dict[int, str]: ...

    def close(self) -> None: ...


def _stats(text: str) -> dict[str, int]:
    """``per_cpu/cpuN/stats`` ("overrun: 12", "dropped events: 0", ...) as counts."""
    counts = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            counts[key.strip()] = int(value)
    return counts


def cpu_mask(cpus: Iterable[int]) -> str:
    """``tracing_cpumask`` text: comma-separated 32-bit hex words, most significant first."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    words = []
    while True:
        words.append(f"{mask & 0xFFFFFFFF:08x}")
        mask >>= 32
        if not mask:
            break
    return ",".join(reversed(words))


class TracefsInstance:
    """A tracefs instance of this process, tracing ``events`` ("group:event") on ``cpus`` only.

    ``start()`` makes and arms it (raises :class:`TracingUnavailable` saying why it cannot, leaving nothing
    behind); ``stop()`` (idempotent, safe in ``finally``) turns it off, reads the trace and the per-CPU drop
    counts and removes the instance; ``events()`` then yields what was recorded, per CPU in time order.
    ``overwrite``: when the buffer fills, keep the newest events (a flight recorder) rather than the oldest;
    ``filters``: kernel-side event filters (fewer events recorded: less cost on the traced CPUs);
    ``access``: whose tracefs (default: this machine's, at ``root``).
    """

    def __init__(self, cpus: Sequence[int], events: Sequence[str], *, buffer_kb: int = DEFAULT_BUFFER_KB,
                 overwrite: bool = True, clock: str = "mono", root: Path | None = None,
                 filters: Mapping[str, str] | None = None, access: TracefsAccess | None = None) -> None:
        if not cpus:
            raise ValueError("a tracefs instance needs at least one CPU")
        self.cpus = tuple(sorted(set(cpus)))
        self.wanted = tuple(events)
        self.buffer_kb = buffer_kb
        self.overwrite = overwrite
        self.clock = clock
        self.access: TracefsAccess = access or LocalTracefs(root)
        self.filters = dict(filters or {})  # "group:event" -> the kernel's filter expression ("prio < 100")
        self.path: Path | None = None  # the instance's directory (on the target, for a remote access)
        self.texts: dict[int, str] = {}
        self._events: list[TraceEvent] | None = None
        self._split: dict[int, list[str]] = {}
        self.dropped_events = 0  # lost to the bound (overrun) or never written (dropped)
        self.missing_events: list[str] = []  # asked for but absent on this kernel
        self.problems: list[str] = []  # what went wrong while stopping (the trace may be incomplete)
        # set once started: reads the trace while the run goes (then stop() takes its text, not the buffer's)
        self.drain: TraceDrain | None = None

    def _write(self, name: str, value: str) -> None:
        assert self.path is not None
        try:
            self.access.write(str(self.path / name), value)
        except OSError as exc:
            raise TracingUnavailable(f"tracefs{self.access.where} {name}: {exc.strerror or exc}") from None

    def start(self) -> None:
        root = Path(self.access.root())
        self.access.reclaim(str(root))
        available = set()
        with contextlib.suppress(OSError):
            available = set(self.access.read(str(root / "available_events")).split())
        events = [event for event in self.wanted if event in available]
        self.missing_events = [event for event in self.wanted if event not in available]
        if not events:
            raise TracingUnavailable(f"none of the events {', '.join(self.wanted)} exist on this kernel"
                                     f"{self.access.where}")
        path = root / "instances" / self.access.instance_name(next(_counter))
        try:
            self.access.mkdir(str(path))
        except OSError as exc:
            reason = "tracing needs root" if exc.errno in (errno.EACCES, errno.EPERM) else exc.strerror or exc
            raise TracingUnavailable(f"cannot make a tracefs instance{self.access.where}: {reason}") from None
        self.path = path
        try:
            self._write("tracing_on", "0")
            self._write("trace_clock", self.clock)
            self._write("buffer_size_kb", str(self.buffer_kb))
            self._write("tracing_cpumask", cpu_mask(self.cpus))
            self._write("options/overwrite", "1" if self.overwrite else "0")
            self._write("options/record-tgid", "1")
            for event, expression in self.filters.items():
                if event in events:
                    self._write(f"events/{event.replace(':', '/')}/filter", expression)
            self._write("set_event", "\n".join(events) + "\n")
            self._write("tracing_on", "1")
        except TracingUnavailable:
            self._remove()
            raise

    def set_filter(self, event: str, expression: str) -> None:
        """A kernel-side filter for one of the instance's events while it traces (a filter it cannot take is
        left off, and the layer's problems say so: tracing goes on with the event unfiltered)."""
        if self.path is None or event not in self.wanted or event in self.missing_events:
            return
        try:
            self.access.write(str(self.path / "events" / event.replace(":", "/") / "filter"), expression)
            self.filters[event] = expression
        except OSError as exc:
            self.problems.append(f"the filter of {event} was not taken: {exc.strerror or exc}")

    def stop(self) -> None:
        if self.path is None:
            return
        try:
            with contextlib.suppress(OSError):
                self.access.write(str(self.path / "tracing_on"), "0")
            if self.drain is not None:
                self.texts = self.drain.finish()
                self.problems += self.drain.problems
            for cpu in self.cpus:
                per_cpu = self.path / "per_cpu" / f"cpu{cpu}"
                try:
                    if self.drain is None:
                        self.texts[cpu] = self.access.read(str(per_cpu / "trace"))
                    stats = _stats(self.access.read(str(per_cpu / "stats")))
                except OSError as exc:
                    self.problems.append(f"cpu{cpu}: trace not read: {exc.strerror or exc}")
                    continue
                self.dropped_events += stats.get("overrun", 0) + stats.get("dropped events", 0)
        finally:
            self._remove()

    def _remove(self) -> None:
        path, self.path = self.path, None
        if path is None:
            return
        if self.drain is not None:
            self.drain.close()  # its open pipes would keep the instance busy
        try:
            self.access.rmdir(str(path))
        except OSError as exc:  # busy (someone holds a file of it open): reclaimed once we are gone
            self.problems.append(f"tracefs instance {path.name} not removed: {exc.strerror or exc}")

    def events_in_order(self) -> Iterator[TraceEvent]:
        """Everything that was recorded, merged across CPUs in time order, parsed as it is taken and each CPU's text
        let go of: a reader that keeps what it needs of every event (the VM layer) holds that, not the text, its
        lines and every event at once besides (a long run's kept trace is tens of MB of text)."""
        per_cpu = []
        for cpu in self.cpus:
            if cpu in self._split:  # (its losses marked already)
                per_cpu.append(parse_trace(self._split.pop(cpu)))
            else:  # (a loss is read where it happened, as in lines())
                per_cpu.append(parse_trace(marked_losses(io.StringIO(self.texts.pop(cpu, "")))))
        return heapq.merge(*per_cpu, key=lambda event: event.ts_ns)

    def events(self) -> list[TraceEvent]:
        """Everything that was recorded (parsed once), each CPU's events in time order."""
        if self._events is None:
            self._events = [event for cpu in self.cpus for event in parse_trace(self.lines(cpu))]
        return self._events

    def lines(self, cpu: int) -> list[str]:
        """A CPU's event lines in time order (the header's comment lines dropped), split once."""
        if cpu not in self._split:
            lines = mark_losses(self.texts.pop(cpu, "").splitlines())  # (a loss is read where it happened)
            first = next((i for i, line in enumerate(lines) if line and line[0] != "#"), len(lines))
            self._split[cpu] = lines[first:]
        return self._split[cpu]

    def last_stamp(self, cpu: int) -> int | None:
        """The time of a CPU's last traced line (None: it has none)."""
        lines = self.lines(cpu)
        return next((stamp for line in reversed(lines) if (stamp := line_stamp(line)) is not None), None)

    def events_around(self, cpu: int, start_ns: int, end_ns: int, back_to: str = "sched_switch:") -> list[TraceEvent]:
        """The events of ``cpu`` in [start_ns, end_ns] (:func:`events_around`)."""
        return events_around(self.lines(cpu), start_ns, end_ns, back_to)

    def __enter__(self) -> TracefsInstance:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
