"""Tracing on an SSH target: its tracefs reached through the target's connection, argument vectors only.

The target's kernel records what ran on its measured CPUs exactly as this host's would (the host layer's
events, its ``mono`` clock = the CLOCK_MONOTONIC the agent on the target stamps its samples with); only the
way to the files differs. Each file operation is one command over the connection: a value is written by a
constant script that takes the value and the path as arguments, so nothing from us or the target reaches a
shell as code. Instances are named after this controller (its pid, start time and machine) so that a later
rtvirt on this machine removes what a killed one left on the target, and never another controller's.

The flight recorder (explain.recorder) drains the target's per-CPU ``trace_pipe`` files while the run goes:
one ``cat`` of each there, its output handed over as it arrives, run by a constant script that ends it when
the channel's stdin ends (a reader blocked in an idle pipe notices nothing else): at the end of the run, and
when the connection is lost with this process (kill -9), so that no reader keeps the instance busy. The reader
runs off the traced CPUs (``taskset``): each event wakes a blocked reader, and one on a traced CPU made every
wake-up new events there (seen on a 6.18 kernel: 170,000 switches in 3 s on a CPU that had 3,000 without it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import threading
import time
from collections.abc import Collection
from pathlib import Path

from ..errors import RtvirtError
from ..params import parse_cpulist
from ..procs import process_start_time
from ..remote.connection import RemoteProcess, SshConnection
from ..remote.transport import controller_id
from .tracefs import INSTANCE_PREFIX, MOUNT_POINTS, POLICY_NAMES, TracingUnavailable, bounded

__all__ = ["RemoteTracefs"]

# printf writes the value as given; the redirection is the script's own text, the path its argument
_WRITE = 'printf "%s" "$1" > "$2"'
# the pipe's reader: the pipe's text on stdout until the channel's stdin ends; on the CPUs $2 when given, and so
# is the sshd process that relays it (this session's own: every event it forwards woke it on a traced CPU too)
_CAT_PIPE = ('if [ -n "$2" ]; then taskset -p -c "$2" "$PPID" > /dev/null 2>&1; taskset -c "$2" cat -- "$1" & '
             'else cat -- "$1" & fi; reader=$!; cat > /dev/null; kill "$reader" 2>/dev/null; wait')
PIPE_QUIET_S = 0.3  # after tracing stopped: the pipe's text has all arrived once none came for this long
PIPE_SETTLE_S = 10.0  # ... or after this long at most
_ERRNOS = (("Permission denied", errno.EACCES), ("Operation not permitted", errno.EPERM),
           ("No such file", errno.ENOENT), ("busy", errno.EBUSY), ("Invalid argument", errno.EINVAL))
TRACE_READ_TIMEOUT_S = 300.0


class RemotePipe:
    """A target's ``trace_pipe`` read by a ``cat`` there (``explain.tracefs.TracePipe``)."""

    def __init__(self, connection: SshConnection, path: str, reader_cpus: str, concern: str) -> None:
        self.concern = concern
        self._lock = threading.Lock()
        self._received = bytearray()
        self._last_arrival = time.monotonic()
        self._process: RemoteProcess | None = connection.spawn(["sh", "-c", _CAT_PIPE, "rtvirt-pipe", path,
                                                                reader_cpus], None, on_data=self._arrived)

    def _arrived(self, data: bytes) -> None:
        with self._lock:
            self._received += data
            self._last_arrival = time.monotonic()

    def read(self, final: bool = False) -> bytes:
        if final:
            self._finish()
        with self._lock:
            data, self._received = bytes(self._received), bytearray()
        return data

    def _finish(self) -> None:
        """Tracing is off: let what the reader took from the pipe arrive, then stop the reader."""
        deadline = time.monotonic() + PIPE_SETTLE_S
        while time.monotonic() < deadline:
            with self._lock:
                quiet = time.monotonic() - self._last_arrival
            if quiet >= PIPE_QUIET_S:
                break
            time.sleep(PIPE_QUIET_S - quiet)
        self.close()

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop(grace=10.0)  # the end of its stdin ends the reader, then the script


POLICY_BATCH = 500  # /proc/PID/stat files per command: a bounded argument vector


class RemoteTracefs:
    """An SSH target's tracefs (``explain.tracefs.TracefsAccess``)."""

    here = False

    def __init__(self, connection: SshConnection, label: str) -> None:
        self.connection = connection
        self.where = f" on target {label}"
        self._owner = f"{os.getpid()}-{process_start_time(os.getpid())}"
        self._name = re.compile(rf"^{INSTANCE_PREFIX}(\d+)-(\d+)-\d+-{controller_id()}$")
        self._cpus_and_taskset: tuple[tuple[int, ...], bool] | None = None  # the target's online CPUs, taskset

    def _run(self, argv: list[str], what: str) -> str:
        try:
            result = self.connection.run(argv, timeout=60)
        except RtvirtError as exc:  # the connection failed or timed out: the operation did not happen
            raise OSError(errno.EIO, f"{what}: {str(exc)[:200]}") from None
        if result.returncode != 0:
            said = " ".join(result.stderr.split())[:200] or f"status {result.returncode}"
            code = next((number for text, number in _ERRNOS if text in said), errno.EIO)
            raise OSError(code, f"{what}: {said}")
        return result.stdout

    def root(self) -> str:
        mounts = self._run(["cat", "/proc/mounts"], "reading /proc/mounts")
        for line in mounts.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "tracefs" and Path(fields[1]) in MOUNT_POINTS:
                return fields[1]
        try:
            self._run(["mount", "-t", "tracefs", "nodev", str(MOUNT_POINTS[0])], "mounting tracefs")
        except OSError as exc:
            raise TracingUnavailable(f"tracefs is not mounted{self.where} and cannot be: {exc.strerror}") from None
        return str(MOUNT_POINTS[0])

    def read(self, path: str) -> str:
        if not path.endswith("/trace"):
            return self._run(["cat", "--", path], f"reading {path}")
        # a trace is up to the buffer's size: copied to a file here rather than held in a command's output
        with tempfile.TemporaryDirectory(prefix="rtvirt-trace-") as directory:
            local = Path(directory) / "trace"
            try:
                self.connection.get(path, local, timeout=TRACE_READ_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a RunError or a lost connection: the trace is not read
                raise OSError(errno.EIO, f"copying {path}: {str(exc)[:200]}") from None
            return local.read_text(errors="replace")

    def write(self, path: str, value: str) -> None:
        self._run(["sh", "-c", _WRITE, "rtvirt-write", value, path], f"writing {path}")

    def mkdir(self, path: str) -> None:
        self._run(["mkdir", "--", path], f"making {path}")

    def rmdir(self, path: str) -> None:
        self._run(["rmdir", "--", path], f"removing {path}")

    def instance_name(self, serial: int) -> str:
        return f"{INSTANCE_PREFIX}{self._owner}-{serial}-{controller_id()}"

    def reclaim(self, root: str) -> list[str]:
        try:
            names = self._run(["ls", "-1", "--", f"{root}/instances"], "listing instances").split()
        except OSError:
            return []
        removed = []
        for name in names:
            match = self._name.match(name)
            if match is None or process_start_time(int(match[1])) == match[2]:
                continue  # another controller's, or its owner (here) is alive
            with contextlib.suppress(OSError):
                self.rmdir(f"{root}/instances/{name}")
                removed.append(f"tracefs instance {name}{self.where} of a dead rtvirt (pid {match[1]})")
        return removed

    def open_pipe(self, path: str, away_from: Collection[int]) -> RemotePipe:
        """A per-CPU ``trace_pipe`` of the target, drained while the run goes (explain.recorder) by a reader on
        the target's other CPUs."""
        reader_cpus, concern = self._reader_cpus(away_from)
        try:
            return RemotePipe(self.connection, path, reader_cpus, concern)
        except RtvirtError as exc:
            raise OSError(errno.EIO, f"reading {path}: {str(exc)[:200]}") from None

    def _reader_cpus(self, away_from: Collection[int]) -> tuple[str, str]:
        """The target's online CPUs but ``away_from`` as taskset takes them ("" when the reader cannot be kept
        off them), and why not, if so."""
        if self._cpus_and_taskset is None:  # asked of the target once, for all its pipes
            try:
                online = parse_cpulist(self._run(["cat", "/sys/devices/system/cpu/online"],
                                                 "reading its CPUs").strip())
            except ValueError:  # the target's kernel says something else: read as "no other CPU known"
                online = ()
            taskset = self.connection.run(["sh", "-c", "command -v taskset"], timeout=60).returncode == 0
            self._cpus_and_taskset = online, taskset
        online, taskset = self._cpus_and_taskset
        others = sorted(set(online) - set(away_from))
        if not others:
            return "", (f"the trace_pipe readers{self.where} share the traced CPUs (no other CPU is known online): "
                        "each event there wakes one, which adds events")
        if not taskset:
            return "", (f"taskset is missing{self.where}: its trace_pipe readers may run on the traced CPUs, where "
                        "each event wakes one, which adds events")
        return ",".join(map(str, others)), ""

    def policies(self, pids: Collection[int]) -> dict[int, tuple[str, str]]:
        """Field 41 of each task's /proc/PID/stat on the target with its comm (field 2), a bounded batch of them
        per command (a task that ended meanwhile is left out; cat goes on past it)."""
        found: dict[int, tuple[str, str]] = {}
        ordered = sorted(pids)
        for first in range(0, len(ordered), POLICY_BATCH):
            paths = [f"/proc/{pid}/stat" for pid in ordered[first:first + POLICY_BATCH]]
            try:
                stats = self.connection.run(["cat", "--", *paths], timeout=60).stdout
            except RtvirtError:  # the connection failed: the policies stay unknown (priorities still name them)
                return found
            for line in stats.splitlines():
                head, _, tail = line.rpartition(")")  # the comm in parentheses may hold anything, ")" too
                pid, _, comm = head.partition(" (")
                fields = tail.split()
                name = POLICY_NAMES.get(int(fields[38])) if len(fields) > 38 and fields[38].isdigit() else None
                if pid.isdigit() and name is not None:
                    found[int(pid)] = (name, bounded(comm, 16))
        return found

    def read_system(self, path: str) -> str:
        """A system file of the target (/proc/stat, /proc/cpuinfo), for what the explanation notes."""
        return self._run(["cat", "--", path], f"reading {path}")
