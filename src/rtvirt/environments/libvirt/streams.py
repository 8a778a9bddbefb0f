"""The domain's console and samples channel, read through the libvirt connection (non-blocking streams on
libvirt's event loop) into the run directory, and the domain in the shape of an agent process."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

from ...errors import InputError, RunError
from .. import baremetal
from ..guest_image import EXIT_MARK, READY_MARK, agent_failure, delivery_said
from ..qemu import ACK_PORT
from ..tcg_clock import clock_failure
from .connection import _domain_gone, _error_text, _libvirt
from .domain_xml import LibvirtDomainXml
from .stream_reader import _StreamToFile

DRAIN_TIMEOUT_S = 10.0  # time the stream readers get to write the last samples after the guest stopped
QEMU_EVENT_WAIT_S = 2.0  # time QEMU's event gets to arrive on libvirt's event loop after the domain stopped
QEMU_STOP_EVENTS = ("RESET", "SHUTDOWN")
# QEMU's reasons for a RESET or SHUTDOWN event (qapi ShutdownCause), as a run's failure says them
SHUTDOWN_CAUSES = {
    "guest-shutdown": "the guest powered itself off",
    "guest-reset": "the guest reset itself, as its kernel does on a panic (panic=-1) or a triple fault",
    "guest-panic": "the guest's kernel panicked",
    "host-signal": "QEMU was sent a signal on its host (libvirt's, when the domain was destroyed)",
    "host-qmp-quit": "QEMU was told to quit over its monitor",
    "host-qmp-system-reset": "the guest was reset over QEMU's monitor",
    "host-ui": "QEMU's window was closed",
    "host-error": "QEMU stopped on an error",
}


class RunningDomain:
    """A running domain in the shape of an agent process: it has exited once the domain is shut off."""

    def __init__(self, env: LibvirtStreams) -> None:
        self._env = env
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            crashed = self._env.stopped()
            if crashed is not None:
                self._env.drain()  # every sample on disk before the run reads the stream's end
                self._returncode = 1 if crashed else 0
                if self._env.config.guest == "baremetal":  # it ends the VM by a triple fault: its status is said
                    failure = baremetal.guest_error(self._env.console_text())
                    self._returncode = failure[0] if failure else 0
        return self._returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the domain did not stop within {timeout:.0f}s")
            time.sleep(0.2)
        assert self._returncode is not None
        return self._returncode

    def error_tail(self) -> str:
        return self._env.console_text()[-300:]


class LibvirtStreams(LibvirtDomainXml):
    """The running domain: its streams, its state, whether it booted and how it ended."""

    def _open_stream(self, channel: str | None, path: Path, keep: bytearray | None) -> _StreamToFile:
        libvirt = _libvirt()
        stream = self._conn().conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        try:
            if channel is None:
                self._domain.openConsole(None, stream, 0)
            else:
                self._domain.openChannel(channel, stream, 0)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt ({self.libvirtd}): cannot open the {channel or 'console'} of "
                           f"{self._name}: {_error_text(exc)}") from None
        reader = _StreamToFile(stream, path, keep)
        reader.start()
        self._readers.append(reader)
        return reader

    def stopped(self) -> bool | None:
        """None while the domain runs; else whether it crashed."""
        libvirt = _libvirt()
        if self._domain is None:
            return False
        try:
            state, reason = self._domain.state(0)
        except libvirt.libvirtError as exc:
            if _domain_gone(exc):
                return False  # gone: destroyed by close()
            # the connection failed (keepalive closed it: libvirtd stopped answering): not a guest that ended
            raise self._conn().failure(f"the state of {self._name}", exc) from None
        if state in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_CRASHED):
            return state == libvirt.VIR_DOMAIN_CRASHED or reason == libvirt.VIR_DOMAIN_SHUTOFF_CRASHED
        return None

    def _confirm_delivery(self, records: int) -> str:
        """Tell the guest's agent how many data records the host holds (it ends once told): a Linux guest on its
        ack channel, whose stream stays open until the domain goes; the bare-metal guest back on the console
        its samples came by."""
        libvirt = _libvirt()
        line = f"RTVIRT-ACK {int(records)}\n".encode()
        try:
            if self.config.guest == "baremetal":
                assert self._channel_reader is not None
                self._channel_reader.send(line)
                return "sent"
            self._ack_stream = self._conn().conn.newStream(0)
            self._domain.openChannel(ACK_PORT, self._ack_stream, 0)
            self._ack_stream.send(line)
        except libvirt.libvirtError as exc:
            return f"not sent: {_error_text(exc)}"
        except TimeoutError as exc:
            return f"not sent: {exc}"
        return "sent"

    def stream_copy(self) -> Path | None:
        if not self._copy_volume:
            return None
        local = self.workdir / "stream-copy.img"
        self._conn().download_written_part(self._copy_volume, local)
        return local

    def delivery(self) -> dict[str, Any]:
        return {"channel": "libvirt channel (virtio-serial)", "handshake": "RTVIRT-ACK",
                **delivery_said(self.console_text())}

    def drain(self) -> None:
        """Wait until the stream readers wrote everything the stopped guest sent."""
        for reader in self._readers:
            reader.join(timeout=DRAIN_TIMEOUT_S)

    def _watch_qemu_shutdown(self) -> None:
        """Listen for QEMU's RESET and SHUTDOWN events of the domain: QEMU's own word on why it stops (the guest
        powered off, reset itself, was signalled), where libvirt's state says "shut off" for all of them. The
        first event is the cause: libvirt then ends QEMU with a signal, and QEMU's second SHUTDOWN says only
        that (seen: "host-qmp-system-reset", then "host-signal"). A libvirtd that does not offer QEMU's events
        leaves the failure without them."""
        libvirt = _libvirt()
        import libvirt_qemu

        def on_event(_conn: Any, _dom: Any, event: str, _seconds: int, _micros: int, details: str,
                     _opaque: Any) -> None:
            try:
                reason = json.loads(str(details)[:2000]).get("reason")
            except (ValueError, AttributeError):
                reason = None
            if self._qemu_stop is None:
                self._qemu_stop = (str(event)[:20], str(reason)[:40] if reason else "unknown")

        for event in QEMU_STOP_EVENTS:
            with contextlib.suppress(libvirt.libvirtError):
                self._qemu_stop_watches.append(libvirt_qemu.qemuMonitorEventRegister(
                    self._conn().conn, self._domain, event, on_event, None, 0))

    def _stop_watching_qemu_shutdown(self) -> None:
        watches, self._qemu_stop_watches = self._qemu_stop_watches, []
        if not watches or self._connection is None:
            return
        libvirt = _libvirt()
        import libvirt_qemu

        for watch in watches:
            with contextlib.suppress(libvirt.libvirtError):
                libvirt_qemu.qemuMonitorEventDeregister(self._connection.conn, watch)

    def qemu_said(self) -> str:
        """QEMU's reason for the domain's stop, as a clause for a failure ("" when it gave none)."""
        deadline = time.monotonic() + QEMU_EVENT_WAIT_S
        while self._qemu_stop is None and self._qemu_stop_watches and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._qemu_stop is None:
            return ""
        event, reason = self._qemu_stop
        said = ", ".join(re.sub(r"[^a-z0-9-]", "?", word) for word in (event.lower(), reason))
        return f" (QEMU: {said}: {SHUTDOWN_CAUSES.get(reason, 'a reason rtvirt does not know')})"

    def _samples_complete(self) -> bool:
        """Whether the samples the guest sent end with the agent's END record for a complete run."""
        from ...stream import read_stream  # numpy/pyarrow: not at CLI start

        if self._channel_reader is None:
            return False
        try:
            return read_stream(self._channel_reader.path).end_reason == "complete"
        except InputError:
            return False

    def _pump(self) -> None:
        for reader in self._readers:
            reader.pump()

    def console_text(self) -> str:
        return bytes(self._console).decode("utf-8", errors="replace")

    def check(self) -> str | None:
        if self._domain is None:
            return None
        if self._lab is not None and not self._lab.alive():
            return f"the KVM lab stopped: {self._lab.why_stopped()}"
        self._pump()
        console = self.console_text()
        if self._ready_at is None and READY_MARK in console:
            self._ready_at = time.monotonic()
        stopped = self.stopped()
        if self._ready_at is None:
            if stopped is not None:
                said = " ".join(self.console_text()[-300:].split())
                return (f"the domain {self._name} stopped before the guest booted{' (crashed)' if stopped else ''}"
                        f"{self.qemu_said()}; console: {said or '(nothing)'}")
            if time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
                return f"the guest did not boot within {self.config.boot_timeout / 1e9:.0f}s"
            return None
        if (clock := clock_failure(console, self._ready_at - self._launched_at)) is not None:
            return clock
        if stopped is not None:
            self.drain()
            if self.config.guest == "baremetal":
                exception = baremetal.failure_exception(self.console_text())
                if exception is not None:
                    raise exception  # status 2 (a parameter the guest refused) is bad input: exit 2
                return None
            failure = agent_failure(self.console_text())
            if failure and not stopped and EXIT_MARK not in self.console_text() and self._samples_complete():
                # libvirt kills QEMU as soon as the guest powers off and the console's last lines can be
                # lost with it under load; the agent's END record on the channel says it finished
                return None
            return f"{failure}{self.qemu_said()}" if failure else None
        channel = self._channel_reader
        if channel is not None and channel.ended and (channel.ended != "end of stream"
                                                      or time.monotonic() - channel.ended_at > DRAIN_TIMEOUT_S):
            # libvirt stopped relaying the channel: the guest's further samples would be lost (an end of
            # stream is normal when the agent finishes, shortly before the guest powers off)
            return f"the samples channel of {self._name} closed while the guest ran: {channel.ended}"
        return None

    @property
    def booted(self) -> bool:
        self._pump()
        if self._ready_at is None and READY_MARK in self.console_text():
            self._ready_at = time.monotonic()
        return self._ready_at is not None
