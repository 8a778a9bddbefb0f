"""The VM layer of a libvirt domain (explain.vm): its vCPU threads from QEMU's own answer through libvirt
(``query-cpus-fast`` over virDomainQemuMonitorCommand, read-only, this host's or a remote one's) and the host
side of its guest's clock port. On this host, a unix channel libvirt binds, which we connect to as the host's
root, as qemu-guest-agent clients do; on a KVM host over SSH, a pipe channel whose FIFOs we make there, the
host's half of the exchange run there too (explain.clocksync.ScriptedClockExchange), so that its stamps are on
the clock the host's trace is on."""

from __future__ import annotations

import json
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import RunError
from ...explain.clocksync import CLOCK_PORT, ClockExchange
from .connection import _error_text, _libvirt

if TYPE_CHECKING:
    from ...remote.connection import SshConnection

QMP_REPLY_LIMIT = 1 << 16
# on a KVM host: a directory of the run's own with the clock channel's two FIFOs (QEMU's pipe chardev opens
# <stem>.in and <stem>.out); its path printed for us to check. QEMU may run as another user (Debian's libvirt:
# libvirt-qemu), which libvirt's DAC driver makes the FIFOs' owner: it must pass through the directory (711), which
# it cannot list
_CLOCK_PIPES = ('d=$(mktemp -d /tmp/rtvirt-clock.XXXXXXXX) && chmod 711 "$d" && '
                'mkfifo -m 600 "$d/clock.in" "$d/clock.out" && echo "$d"')
_CLOCK_DIR = re.compile(r"/tmp/rtvirt-clock\.[A-Za-z0-9]{8}")


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


def qemu_pid(thread: int, host: SshConnection | None = None) -> int:
    """The process (QEMU) a thread of this host, or of the KVM host ``host`` reaches, belongs to."""
    path = f"/proc/{int(thread)}/status"
    status = Path(path).read_text() if host is None else \
        host.run(["cat", "--", path], timeout=30).check(f"libvirt on {host.label}: {path}").stdout
    for line in status.splitlines():
        fields = line.split()
        if fields[:1] == ["Tgid:"] and len(fields) == 2 and fields[1].isdigit():  # (a remote host's text)
            return int(fields[1])
    raise RunError(f"libvirt: thread {thread} has no process")


def make_clock_pipes(host: SshConnection) -> str:
    """The FIFOs of a domain's clock channel on the KVM host ``host`` reaches: their stem (``remove_clock_pipes``
    takes them away)."""
    made = host.run(["sh", "-c", _CLOCK_PIPES], timeout=30).check(f"libvirt on {host.label}: the clock's FIFOs")
    directory = made.stdout.strip()
    if not _CLOCK_DIR.fullmatch(directory):
        raise RunError(f"libvirt on {host.label}: mktemp made {directory[:100]!r}")
    return f"{directory}/clock"


def remove_clock_pipes(host: SshConnection, stem: str) -> None:
    """Remove what ``make_clock_pipes`` made (once the domain is gone)."""
    directory = stem.rsplit("/", 1)[0]
    assert _CLOCK_DIR.fullmatch(directory), directory
    host.run(["rm", "-rf", "--", directory], timeout=30)


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
