"""What carries a domU's samples to dom0, behind one interface: dom0's ``nc`` listener for our Linux guest (its
console is xenconsoled's log), or the bare-metal guest's console relay (the samples framed on its console)."""

from __future__ import annotations

from typing import Any, Protocol

from ...errors import RunError
from .. import baremetal

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


class ListenerRelay:
    """dom0's ``nc`` listener writing a Linux domU's stream to the run's file."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    def poll(self) -> int | None:
        return self.listener.poll()  # type: ignore[no-any-return]

    def stop(self, grace: float = 5.0) -> int | None:
        return self.listener.stop(grace=grace)  # type: ignore[no-any-return]

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

    def delivery(self) -> dict[str, Any]:
        return {"channel": "PV console (framed, split from dom0's log)",
                "handshake": "the guest waits until xenconsoled took every byte", "channel_corrupt": self.relay.corrupt}
