"""Taking a domain down: a bare-metal guest's samples first, the streams, then the domain and its initrd,
on a fresh connection if the run's own was lost: a domain must not outlive its run."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from ...errors import RunError
from .. import baremetal
from ..console_log import bound_console_file
from .connection import LibvirtConnection, _domain_gone, _libvirt
from .streams import LibvirtStreams


def _destroy_and_undefine(domain: Any, uri: str) -> None:
    """Destroy and undefine ``domain``; if its connection is lost (keepalive closed it while libvirtd did not
    answer), once more on a new connection: a domain must not outlive its run."""
    libvirt = _libvirt()

    def remove(target: Any) -> None:
        with contextlib.suppress(libvirt.libvirtError):  # an already stopped domain refuses destroy
            if target.isActive():
                target.destroy()
        target.undefine()

    try:
        remove(domain)
    except libvirt.libvirtError as exc:
        if not _domain_gone(exc):
            _on_a_fresh_connection(uri, lambda fresh: remove(fresh.conn.lookupByUUID(domain.UUID())))

def _on_a_fresh_connection(uri: str, action: Callable[[LibvirtConnection], object]) -> None:
    """``action`` on a new connection to ``uri``, the run's own having been lost; if that fails too, what is
    left is reclaimed by the next campaign or ``--resume``."""
    with contextlib.suppress(RunError, _libvirt().libvirtError):
        fresh = LibvirtConnection(uri)
        try:
            action(fresh)
        finally:
            fresh.close()


class LibvirtTeardown(LibvirtStreams):
    """Destroys and undefines the domain and deletes its initrd volume, whatever state the connection is in."""

    def _stop_baremetal(self) -> None:
        """As baremetal.request_stop for QEMU: an NMI makes the guest write out every sample it holds and
        end its stream with reason 'signal'; it gets STOP_TIMEOUT_S to leave before the domain is destroyed."""
        libvirt = _libvirt()
        with contextlib.suppress(libvirt.libvirtError):
            self._domain.injectNMI(0)
            deadline = time.monotonic() + baremetal.STOP_TIMEOUT_S
            while self.stopped() is None and time.monotonic() < deadline:
                self._pump()
                time.sleep(0.1)
            self.drain()

    def close(self) -> None:
        with contextlib.suppress(RunError):  # a lost connection: destroyed below, on a new one if need be
            if self._domain is not None and self.config.guest == "baremetal" and self.stopped() is None:
                self._stop_baremetal()
        # the streams are closed before the domain goes: destroyed with its console open, the stream is torn
        # down (our event loop aborts it) while we undefine the domain, a race others saw deadlock libvirt and
        # which fits a CI hang here (a stressor guest destroyed, its clean-up never finished, every later
        # connection hung); what libvirt already holds for a stream is taken first
        for reader in self._readers:
            reader.pump()
            reader.stop()
        self._readers = []
        self._stop_watching_qemu_shutdown()
        bound_console_file(self._console_file)  # kept in the run, bounded
        if self._ack_stream is not None:
            with contextlib.suppress(Exception):  # the guest has gone, or goes now: nothing to finish
                self._ack_stream.abort()
            self._ack_stream = None
        if self._domain is not None:
            _destroy_and_undefine(self._domain, self.uri)
            self._domain = None
        if self._connection is not None:
            for name in (self._initrd_volume, self._copy_volume):
                if name:
                    with contextlib.suppress(RunError):
                        if not self._connection.delete_volume(name):
                            delete = functools.partial(LibvirtConnection.delete_volume, name=name)
                            _on_a_fresh_connection(self.uri, delete)
            self._initrd_volume = self._copy_volume = ""
            self._connection.close()
            self._connection = None
        super().close()
