"""The VM layer of a local libvirt domain (explain.vm): its vCPU threads from QEMU's own answer through
libvirt (``query-cpus-fast`` over virDomainQemuMonitorCommand, read-only) and the host side of its guest's
clock port (a unix channel libvirt binds; we connect to it as the host's root, as qemu-guest-agent
clients do)."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ...errors import RunError
from ...explain.clocksync import CLOCK_PORT, ClockExchange
from .connection import _error_text, _libvirt

QMP_REPLY_LIMIT = 1 << 16


def vcpu_threads(domain: Any) -> dict[int, int]:
    """vCPU index -> host thread id of a running (or paused) domain."""
    libvirt = _libvirt()
    import libvirt_qemu

    try:
        reply = libvirt_qemu.qemuMonitorCommand(domain, json.dumps({"execute": "query-cpus-fast"}), 0)
        cpus = json.loads(str(reply)[:QMP_REPLY_LIMIT])["return"]
        return {int(cpu["cpu-index"]): int(cpu["thread-id"]) for cpu in cpus}
    except (libvirt.libvirtError, ValueError, KeyError, TypeError) as exc:
        detail = _error_text(exc) if isinstance(exc, libvirt.libvirtError) else f"unexpected reply ({exc})"
        raise RunError(f"libvirt: cannot read the vCPU threads of {domain.name()}: {detail}") from None


def qemu_pid(thread: int) -> int:
    """The process (QEMU) a host thread belongs to."""
    for line in Path(f"/proc/{thread}/status").read_text().splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    raise RunError(f"libvirt: thread {thread} has no process")


def clock_exchange(applied_xml: str) -> ClockExchange | None:
    """The clock exchange on the domain's rtvirt.clock channel (the socket libvirt bound for it), connected."""
    try:
        root = ET.fromstring(applied_xml)
    except ET.ParseError:
        return None
    path = None
    for channel in root.iter("channel"):
        target, source = channel.find("target"), channel.find("source")
        if target is not None and target.get("name") == CLOCK_PORT and source is not None:
            path = source.get("path")
    if not path:
        return None
    socket_path = path

    def connect() -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(socket_path)
        return connection

    exchange = ClockExchange(connect)
    exchange.start()
    return exchange
