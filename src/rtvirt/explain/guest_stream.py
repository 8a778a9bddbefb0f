"""The guest layer's flight recorder, host side: a Linux guest's trace as it arrives while the run goes.

The guest relays its own trace while the run goes (explain.guest_channel, ``trace.stream``): the begin mark, the
trace lines of its traced vCPUs, at the end each vCPU's ring statistics and the end mark. They arrive in a file
of the run (``guest-trace.txt``: the host side of the guest's ``rtvirt.trace`` port that QEMU writes, the libvirt
channel rtvirt copies, or dom0's listener's output for a Xen domU). :class:`GuestChannel` reads that file as it
grows and hands each vCPU's lines to the flight recorder (explain.recorder) as the pipe of that vCPU
(:class:`GuestChannelAccess`), which keeps what can still explain an outlier within its bound; the samples are on
the guest's clock and vCPUs, the clock and CPUs of the guest's trace. What the channel has read is freed from the
file (its blocks are punched out: the file keeps its length, not its size), so a run of any length holds at most
one read of the trace on disk and the recorder's bound in memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Collection
from pathlib import Path

from ..fileio import free_range
from .guest_channel import BEGIN_MARK, END_MARK, STATS_MARK

__all__ = ["GuestChannel", "GuestChannelAccess", "READ_LIMIT"]

READ_LIMIT = 8 << 20  # bytes taken from the file per read: what the channel holds at once before the recorder
_CPU = re.compile(r"\s\[(\d{1,4})\]\s")  # a trace line's CPU field ("  comm-12  (  12) [000] d..2. 1.000: ...")
_PIPE_PATH = re.compile(r"/per_cpu/cpu(\d+)/trace_pipe$")


class GuestChannel:
    """The guest's trace file as it grows: event lines by vCPU (``take``), the marks and statistics remembered
    (``began``, ``complete``, ``dropped``), what was read freed from the file. The file need not exist yet (the
    hypervisor makes it when the guest starts). Untrusted text: lines are bounded by the read limit and a line
    without a CPU field is not an event (the parser skips it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.began = False
        self.complete = False
        self.dropped = 0  # events the guest's ring lost (its overrun and dropped counts)
        self.freed_bytes = 0  # what was punched out of the file
        self.problems: list[str] = []
        self._offset = 0
        self._partial = b""
        self._lines: dict[int, list[bytes]] = {}
        self._lock = threading.Lock()
        self._fd = -1

    def _open(self) -> bool:
        if self._fd < 0:
            try:
                self._fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return False
        return True

    def read(self) -> None:
        """Take what arrived since the last read."""
        with self._lock:
            if not self._open():
                return
            while True:
                data = os.pread(self._fd, READ_LIMIT, self._offset)
                if not data:
                    return
                self._offset += len(data)
                self._split(self._partial + data)
                self._free()
                if len(data) < READ_LIMIT:
                    return

    def _split(self, data: bytes) -> None:
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if len(self._partial) > READ_LIMIT:  # no line is that long: not a trace
            self._partial = b""
        for line in data[:cut].splitlines():
            if line.startswith(STATS_MARK.encode()):
                key, _, value = line.decode(errors="replace").removeprefix(STATS_MARK).split(" ", 2)[-1].partition(":")
                if key.strip() in ("overrun", "dropped events") and value.strip().isdigit():
                    self.dropped += int(value)
            elif line == BEGIN_MARK.encode():
                self.began = True
            elif line == END_MARK.encode():
                self.complete = True
            elif (match := _CPU.search(line.decode(errors="replace")[:80])) is not None:
                self._lines.setdefault(int(match[1]), []).append(line)

    def _free(self) -> None:
        """Punch out the blocks of the file already read (whole blocks; nothing when the file system cannot)."""
        block = 1 << 16
        end = (self._offset - len(self._partial)) // block * block
        why = free_range(self._fd, self.freed_bytes, end)
        if why is None:
            self.freed_bytes = max(self.freed_bytes, end)
        elif not self.problems:
            self.problems.append(f"the guest's trace file could not be freed as it was read ({why}): it keeps the "
                                 "whole trace on disk")

    def take(self, cpu: int) -> bytes:
        """The lines of ``cpu`` read since the last take."""
        with self._lock:
            lines = self._lines.pop(cpu, [])
        return b"".join(line + b"\n" for line in lines)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1


class _CpuPipe:
    """One guest vCPU's lines, as the flight recorder reads a trace_pipe (explain.tracefs.TracePipe)."""

    concern = ""  # the guest's relay runs in the guest: its cost is in the guest's own trace, named there

    def __init__(self, channel: GuestChannel, cpu: int) -> None:
        self.channel, self.cpu = channel, cpu

    def read(self, final: bool = False) -> bytes:
        self.channel.read()
        return self.channel.take(self.cpu)

    def close(self) -> None:
        """The channel is closed by its owner (the guest layer), once every vCPU's lines were taken."""


class GuestChannelAccess:
    """Where the flight recorder finds a guest's per-vCPU pipes: in the channel (``open_pipe`` takes the vCPU from
    the pipe's path, ``<instance>/per_cpu/cpuN/trace_pipe``). The guest's trace clock is not this process's: the
    recorder's present is the newest trace time read."""

    where = " in the guest"
    here = False

    def __init__(self, channel: GuestChannel) -> None:
        self.channel = channel

    def open_pipe(self, path: str, away_from: Collection[int]) -> _CpuPipe:
        match = _PIPE_PATH.search(path)
        if match is None:
            raise OSError(f"not a per-CPU trace pipe: {path}")
        return _CpuPipe(self.channel, int(match[1]))
