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

__all__ = ["CLOCK_PORT", "ClockExchange", "ClockMap", "GUEST_CLOCK_SYNC"]

CLOCK_PORT = "rtvirt.clock"
PINGS = 32  # round trips per exchange: the shortest one counts
LINE_LIMIT = 200  # bytes of one guest line we read (it is untrusted)
REPLY_TIMEOUT_S = 5.0
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
        """The map from what was exchanged (start and end: offset and rate; start only: offset), None if none."""
        starts = [p for p in self.points if p.phase == "start"]
        ends = [p for p in self.points if p.phase == "end"]
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
        return ClockMap(first.host_ns, first.guest_ns, rate, max(first.half_rtt_ns, last.half_rtt_ns),
                        (f"guest clock aligned at start and end (+-{first.half_rtt_ns / 1000:.0f} us, "
                         f"+-{last.half_rtt_ns / 1000:.0f} us); it ran {drift_ppm:+.0f} ppm against the host's",))
