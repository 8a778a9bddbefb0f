"""Copying a non-blocking libvirt stream (a console or the samples channel) to a file from libvirt's event loop."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from .connection import _error_text, _libvirt

CONSOLE_LIMIT = 1 << 16  # bytes of the guest console kept (it is untrusted)
SEND_TIMEOUT_S = 5.0


class _StreamToFile:
    """Copies a non-blocking libvirt stream (console or channel) to a file from the event loop, until the
    guest closes it."""

    def __init__(self, stream: Any, path: Path, keep: bytearray | None = None) -> None:
        self.stream, self.path, self.keep = stream, path, keep
        self.received = 0
        self.ended = ""  # why the stream ended, once it has: "end of stream" or libvirt's error
        self.ended_at = 0.0
        self._out = path.open("ab", buffering=0)
        self._lock = threading.Lock()
        self._done = threading.Event()

    def start(self) -> None:
        libvirt = _libvirt()
        events = (libvirt.VIR_STREAM_EVENT_READABLE | libvirt.VIR_STREAM_EVENT_ERROR
                  | libvirt.VIR_STREAM_EVENT_HANGUP)
        self.stream.eventAddCallback(events, self._readable, None)

    def _readable(self, stream: Any, _events: int, _opaque: object) -> None:
        libvirt = _libvirt()
        with self._lock:
            while not self._done.is_set():
                try:
                    data = stream.recv(1 << 16)
                except libvirt.libvirtError as exc:
                    self._finish(abort=True, why=_error_text(exc))
                    return
                if isinstance(data, int):  # -2: nothing more for now
                    return
                if not data:  # end of stream: the guest side closed
                    self._finish(abort=False, why="end of stream")
                    return
                self._out.write(data)
                self.received += len(data)
                if self.keep is not None and len(self.keep) < CONSOLE_LIMIT:
                    self.keep += data[:CONSOLE_LIMIT - len(self.keep)]

    def _finish(self, abort: bool, why: str) -> None:
        """Called with the lock held: unregister, close the stream and the file, wake drain()."""
        self.ended, self.ended_at = why, time.monotonic()
        with contextlib.suppress(Exception):
            self.stream.eventRemoveCallback()
        with contextlib.suppress(Exception):
            self.stream.abort() if abort else self.stream.finish()
        self._out.close()
        self._done.set()

    def send(self, data: bytes) -> None:
        """Write ``data`` back into the stream (to the guest), waiting briefly while libvirt's buffer is full (the
        lock is let go meanwhile: libvirt's event loop, which empties that buffer, also runs ``_readable``)."""
        deadline = time.monotonic() + SEND_TIMEOUT_S
        while data:
            with self._lock:
                sent = self.stream.send(data)
            if sent == -2:  # the non-blocking stream would block: libvirt takes it once it has room
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the stream took no data for {SEND_TIMEOUT_S:.0f}s")
                time.sleep(0.01)
                continue
            data = data[sent:]

    def pump(self) -> None:
        """Take what libvirt already holds for this stream, from the calling thread: samples keep moving
        even if the event loop falls behind (the run's poll loop calls this)."""
        self._readable(self.stream, 0, None)

    def join(self, timeout: float) -> None:
        self.pump()
        self._done.wait(timeout)

    def stop(self) -> None:
        with self._lock:
            if not self._done.is_set():
                self._finish(abort=True, why="closed by rtvirt")
