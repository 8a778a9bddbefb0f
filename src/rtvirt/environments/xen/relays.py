"""What carries a domU's samples to dom0, behind one interface: dom0's ``nc`` listener for our Linux guest (its
console is xenconsoled's log), or the bare-metal guest's console relay (the samples framed on its console)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ...errors import RunError
from .. import baremetal

COPY_WAIT_S = 120.0  # for the copy a domU offered to reach the host (tens of MB over the lab's SSH at most)
LISTENER_END_WAIT_S = 5.0  # for a listener's channel to close once dom0 ended the listener

__all__ = ["BaremetalRelay", "ListenerRelay", "SampleRelay"]


class SampleRelay(Protocol):
    def poll(self) -> int | None:
        """None while samples may still come."""
        ...

    def stop(self, grace: float = 5.0) -> int | None: ...

    def console_text(self) -> str | None:
        """The guest's console as the relay holds it; None: read xenconsoled's log of the domain."""
        ...

    def failure(self, console: str) -> Exception | None:
        """The guest's own account of a failed run (bad input: exit 2), if it gives one."""
        ...

    def stop_guest(self, dom0: Any, domain: str) -> None:
        """Before the domain is destroyed: have the guest write out every sample it holds."""
        ...

    def send(self, data: bytes) -> None:
        """Write ``data`` back to the guest (the end-of-stream confirmation), where the relay has a way back."""
        ...

    def delivery(self) -> dict[str, Any]:
        """The channel and its end-of-stream handshake, for the manifest (docs/sample-stream.md, "Delivery")."""
        ...

    def copy(self, offered: bool) -> Path | None:
        """The guest's own copy of its stream, once its job ended, if it ``offered`` one (its console says so)."""
        ...


class ListenerRelay:
    """dom0's ``nc`` listener writing a Linux domU's stream to the run's file, a second one for the copy the
    domU offers when the host did not confirm its END (console.STREAM_RELAY), and in an explained run a third
    one for the guest's own trace (explain.guest: sent after the main job, before the domU's exit mark).
    ``end_listeners`` ends the given ones in dom0: a listener nobody connected to ends no other way."""

    def __init__(self, listener: Any, copy_listener: Any, copy_path: Path, trace_listener: Any | None,
                 end_listeners: Callable[[list[Any]], None]) -> None:
        self.listener = listener
        self.copy_listener = copy_listener
        self.copy_path = copy_path
        self.trace_listener = trace_listener
        self.end_listeners = end_listeners

    def poll(self) -> int | None:
        return self.listener.poll()  # type: ignore[no-any-return]

    def _end(self, listeners: list[Any]) -> None:
        """End ``listeners`` in dom0 if they still run, then collect their channels' ends."""
        if running := [listener for listener in listeners if listener.poll() is None]:
            self.end_listeners(running)
            for listener in running:
                listener.stop(grace=LISTENER_END_WAIT_S)

    def stop(self, grace: float = 5.0) -> int | None:
        self.listener.stop(grace=grace)  # the end of its stdin lets a connected listener pass on its last bytes
        self._end([self.listener, self.copy_listener,
                   *([self.trace_listener] if self.trace_listener is not None else [])])
        return self.listener.poll()  # type: ignore[no-any-return]

    def trace_received(self, timeout_s: float) -> bool:
        """Wait until the trace listener ended (the domU's nc closed its connection and every byte reached the
        run's file), at most ``timeout_s``; then stop it either way. False: it had not ended."""
        if self.trace_listener is None:
            return False
        deadline = time.monotonic() + timeout_s
        while self.trace_listener.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ended = self.trace_listener.poll() is not None
        self._end([self.trace_listener])
        return ended

    def copy(self, offered: bool) -> Path | None:
        deadline = time.monotonic() + COPY_WAIT_S
        while offered and self.copy_listener.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the listener ends when the domU's nc has sent the whole copy
        self._end([self.copy_listener])
        return self.copy_path if offered and self.copy_path.exists() and self.copy_path.stat().st_size else None

    def console_text(self) -> str | None:
        return None

    def failure(self, console: str) -> Exception | None:
        return None

    def stop_guest(self, dom0: Any, domain: str) -> None:
        pass  # the agent's stream ends with the domain; its last samples are on the listener's side

    def send(self, data: bytes) -> None:
        self.listener.send(data)  # nc relays its stdin back over the domU's connection

    def delivery(self) -> dict[str, Any]:
        return {"channel": "vif (TCP to dom0's listener)", "handshake": "RTVIRT-ACK"}


class BaremetalRelay:
    """The bare-metal PVH guest's console, split into its text and its framed stream (baremetal.XenConsoleRelay)."""

    def __init__(self, relay: baremetal.XenConsoleRelay) -> None:
        self.relay = relay

    def poll(self) -> int | None:
        return self.relay.poll()

    def stop(self, grace: float = 5.0) -> int | None:
        return self.relay.stop(grace=grace)

    def console_text(self) -> str | None:
        return self.relay.text()  # the text part of the console; the log also holds the stream

    def failure(self, console: str) -> Exception | None:
        return baremetal.failure_exception(console)

    def stop_guest(self, dom0: Any, domain: str) -> None:
        baremetal.xen_request_stop(dom0, domain, self.relay)  # every sample it holds, then off

    def send(self, data: bytes) -> None:
        raise RunError("the bare-metal guest's console has no way back to it")

    def copy(self, offered: bool) -> Path | None:
        return None  # the bare-metal guest keeps no copy: its console ring is drained before it powers off

    def delivery(self) -> dict[str, Any]:
        return {"channel": "PV console (framed, split from dom0's log)",
                "handshake": "the guest waits until xenconsoled took every byte", "channel_corrupt": self.relay.corrupt}
