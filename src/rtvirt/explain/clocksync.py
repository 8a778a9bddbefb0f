"""The guest's CLOCK_MONOTONIC (a guest run's sample clock) mapped onto the host's, with a measured uncertainty.

Under TCG there is no kvmclock to read the guest's time base from, and the guest calibrates its TSC against
emulated timers, so its clock may also run at a slightly different rate. rtvirt measures both: the guest's
/init takes part in an exchange over a virtio-serial port of its own (``rtvirt.clock``) once before its jobs
start and once after its main job ended (so no exchange disturbs a measurement). In each, the host sends
``P <seq>``, the guest answers ``R <seq> now at <ns> nsecs`` with its CLOCK_MONOTONIC (``ktime_get``, the
"now at" line of /proc/timer_list, read by shell builtins only) and the host notes its CLOCK_MONOTONIC before
sending and after receiving. The guest read its clock somewhere inside that round trip, so the exchange with
the shortest round trip bounds the offset to +-half of it (as NTP does). With a start and an end exchange the
map is linear (offset and rate); the uncertainty stated is the larger half round trip of the two.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..remote.transport import HostProcess, HostTransport

__all__ = ["CLOCK_PORT", "ClockExchange", "ClockMap", "GUEST_CLOCK_SYNC", "HOST_CLOCK_SYNC", "ScriptedClockExchange",
           "clock_map"]

CLOCK_PORT = "rtvirt.clock"
PINGS = 32  # round trips per exchange: the shortest one counts
LINE_LIMIT = 200  # bytes of one guest line we read (it is untrusted)
REPLY_TIMEOUT_S = 5.0
RATE_TOLERANCE_PPM = 10_000  # a guest kernel refines its TSC's rate to well within 1 % of the truth
REPLY = re.compile(rb"R (\d{1,6}) now at (\d{1,20}) nsecs")

# The guest's half, a function of /init (guest_image.INIT_SCRIPT): builtins only, so that no fork sits between
# the clock read and the reply; "read -t" bounds the wait for a host that stopped answering.
GUEST_CLOCK_SYNC = r"""clock_sync() {
  [ -e /dev/virtio-ports/rtvirt.clock ] || return 0
  exec 3<>/dev/virtio-ports/rtvirt.clock
  echo "RTVIRT-CLOCK $1" >&3
  while read -r -t 10 word seq <&3 && [ "$word" = P ]; do
    { read -r line; read -r line; read -r now; } < /proc/timer_list
    echo "R $seq $now" >&3
  done
  exec 3<&-
}
"""


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """The best round trip of one exchange: guest time ``guest_ns`` was read at host time ``host_ns`` +-
    ``half_rtt_ns``."""

    phase: str
    host_ns: int
    guest_ns: int
    half_rtt_ns: int


@dataclass(frozen=True, slots=True)
class ClockMap:
    """host CLOCK_MONOTONIC -> guest CLOCK_MONOTONIC: guest = guest_0 + (host - host_0) * rate."""

    host_0: int
    guest_0: int
    rate: float
    uncertainty_ns: int
    notes: tuple[str, ...] = ()
    start_only: bool = False  # no end exchange: the rate is taken as 1, the drift since the start is not known

    def to_guest(self, host_ns: int) -> int:
        return self.guest_0 + round((host_ns - self.host_0) * self.rate)

    def to_host(self, guest_ns: int) -> int:
        return self.host_0 + round((guest_ns - self.guest_0) / self.rate)


@dataclass
class ClockExchange:
    """The host's side of the exchange: a thread that answers the guest's ``RTVIRT-CLOCK <phase>`` lines on a
    connected stream socket (QEMU's chardev, or libvirt's channel socket) until ``close``."""

    connect: Callable[[], socket.socket]
    points: list[SyncPoint] = field(default_factory=list)
    problem: str | None = None
    _socket: socket.socket | None = None
    _thread: threading.Thread | None = None
    _closed: bool = False

    def start(self) -> None:
        """Connect now (the guest's first line blocks until the host side is connected) and serve in a thread."""
        self._socket = self.connect()
        self._thread = threading.Thread(target=self._serve, name="rtvirt-clock", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        assert self._socket is not None
        try:
            while not self._closed:
                line = self._readline(timeout=None)
                if not line:
                    return
                if line.startswith(b"RTVIRT-CLOCK "):
                    phase = line.split()[1][:16].decode("ascii", errors="replace")
                    self._exchange(phase)
        except (OSError, ValueError) as exc:
            if not self._closed:
                self.problem = f"the clock exchange failed: {exc}"[:200]

    def _readline(self, timeout: float | None) -> bytes:
        """One line, read a byte at a time (nothing after it is consumed); empty when the guest closed the port."""
        assert self._socket is not None
        self._socket.settimeout(timeout)
        line = bytearray()
        while len(line) < LINE_LIMIT:
            byte = self._socket.recv(1)
            if not byte or byte == b"\n":
                break
            line += byte
        return bytes(line).strip()

    def _exchange(self, phase: str) -> None:
        assert self._socket is not None
        best: SyncPoint | None = None
        for seq in range(PINGS):
            sent = time.monotonic_ns()
            self._socket.sendall(f"P {seq}\n".encode())
            try:
                reply = self._readline(REPLY_TIMEOUT_S)
            except TimeoutError:
                self.problem = f"the guest did not answer the {phase} clock exchange within {REPLY_TIMEOUT_S:.0f}s"
                break
            received = time.monotonic_ns()
            match = REPLY.fullmatch(reply)
            if match is None or int(match.group(1)) != seq:
                self.problem = f"the guest's {phase} clock reply was not understood"
                break
            half = (received - sent) // 2
            if best is None or half < best.half_rtt_ns:
                best = SyncPoint(phase, sent + half, int(match.group(2)), half)
        self._socket.sendall(b"D 0\n")  # ends the guest's loop
        if best is not None:
            self.points.append(best)

    def close(self) -> None:
        self._closed = True
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def clock_map(self) -> ClockMap | None:
        return clock_map(self.points)


def clock_map(points: list[SyncPoint]) -> ClockMap | None:
    """The map from what was exchanged (start and end: offset and rate; start only: offset), None if none."""
    starts = [p for p in points if p.phase == "start"]
    ends = [p for p in points if p.phase == "end"]
    if not starts:
        return None
    first = starts[0]
    if not ends:
        return ClockMap(first.host_ns, first.guest_ns, 1.0, first.half_rtt_ns,
                        ("guest clock aligned at its start only (no end exchange): its drift is not known",),
                        start_only=True)
    last = ends[-1]
    rate = (last.guest_ns - first.guest_ns) / max(1, last.host_ns - first.host_ns)
    drift_ppm = (rate - 1.0) * 1e6
    notes = [f"guest clock aligned at start and end (+-{first.half_rtt_ns / 1000:.0f} us, "
             f"+-{last.half_rtt_ns / 1000:.0f} us); it ran {drift_ppm:+.0f} ppm against the host's"]
    if abs(drift_ppm) > RATE_TOLERANCE_PPM:  # a kernel that mis-measured its clock's rate (tcg_clock)
        notes.append(f"the guest's clock ran {rate:.3f} times the host's: its samples' times and latencies are "
                     "not in real time")
    return ClockMap(first.host_ns, first.guest_ns, rate, max(first.half_rtt_ns, last.half_rtt_ns), tuple(notes))


# The host's half on a KVM host reached over a transport (ScriptedClockExchange): QEMU's clock port is a chardev
# pipe there ($1.in to the guest, $1.out from it), and this constant script answers the guest's RTVIRT-CLOCK
# lines, stamping each ping with the KVM host's own CLOCK_MONOTONIC the way the guest stamps its reply (the "now
# at" line of /proc/timer_list, read by builtins). The stamps are the KVM host's, so the map is to its clock, on
# which its trace is; each round trip is one line on stdout for rtvirt to pick the shortest of.
HOST_CLOCK_SYNC = r"""exec 3> "$1.in" 4< "$1.out"
while read -r word phase <&4; do
  [ "$word" = RTVIRT-CLOCK ] || continue
  seq=0
  while [ "$seq" -lt "$2" ]; do
    { read -r x; read -r x; read -r sent; } < /proc/timer_list
    echo "P $seq" >&3
    read -r reply <&4 || exit 0
    { read -r x; read -r x; read -r received; } < /proc/timer_list
    echo "X $phase $seq $sent | $reply | $received"
    seq=$((seq + 1))
  done
  echo "D 0" >&3
done
"""
_ROUND_TRIP = re.compile(rb"X (\S{1,16}) (\d{1,6}) now at (\d{1,20}) nsecs \| R (\d{1,6}) now at (\d{1,20}) nsecs \| "
                         rb"now at (\d{1,20}) nsecs")


class ScriptedClockExchange:
    """The exchange with the host's half run on the KVM host itself (HOST_CLOCK_SYNC over ``transport``): the
    same points, problem and map as :class:`ClockExchange`, on the KVM host's clock."""

    def __init__(self, transport: HostTransport, stem: str) -> None:
        self.transport = transport
        self.stem = stem
        self.points: list[SyncPoint] = []
        self.problem: str | None = None
        self._best: dict[str, SyncPoint] = {}
        self._pending = b""
        self._process: HostProcess | None = None

    def start(self) -> None:
        self._process = self.transport.spawn(["sh", "-c", HOST_CLOCK_SYNC, "rtvirt-clock", self.stem, str(PINGS)],
                                             None, on_data=self._arrived)

    def _arrived(self, data: bytes) -> None:
        """Lines of the script (on the connection's event loop: nothing here blocks)."""
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        self._pending = self._pending[-LINE_LIMIT:]
        for line in lines:
            match = _ROUND_TRIP.fullmatch(line.strip()[:3 * LINE_LIMIT])
            if match is None or match.group(2) != match.group(4):
                if line.strip():
                    self.problem = "a clock exchange line from the KVM host was not understood"
                continue
            phase = match.group(1).decode("ascii", errors="replace")
            sent, guest, received = int(match.group(3)), int(match.group(5)), int(match.group(6))
            point = SyncPoint(phase, (sent + received) // 2, guest, (received - sent) // 2)
            best = self._best.get(phase)
            if best is None or point.half_rtt_ns < best.half_rtt_ns:
                self._best[phase] = point
            if int(match.group(2)) == PINGS - 1:  # the exchange's last round trip: its best point counts
                self.points.append(self._best.pop(phase))

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop(grace=2.0)

    def clock_map(self) -> ClockMap | None:
        return clock_map(self.points)
