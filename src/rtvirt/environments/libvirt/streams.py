"""The domain's console and samples channel, read through the libvirt connection (non-blocking streams on
libvirt's event loop) into the run directory, and the domain in the shape of an agent process."""

from __future__ import annotations

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
            raise RunError(f"libvirt ({self.uri}): cannot open the {channel or 'console'} of "
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
                        f"; console: {said or '(nothing)'}")
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
            return failure
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
