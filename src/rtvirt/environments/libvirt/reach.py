"""How rtvirt reaches the libvirtd that runs a domain: this machine's at the configured URI (or a raw remote URI,
libvirt's own transport), or a remote host's (the KVM lab, ``host = "user@host"``) through the campaign's SSH link
to that host, libvirtd's unix socket forwarded over it as ``ssh -L`` would. That link is the one the domain's host
is traced through and its stressors run over, and the qemu kind's KVM hosts use: one host-key check (known_hosts,
the lab's pinned key), one set of SSH options (``ssh``), and nothing needed on the host besides libvirtd and sshd
(no virt-ssh-helper or nc, which libvirt's ssh transport runs there)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import RunError
from ..base import SharedResources
from ..kvmlab.config import LAB_HOST, LOCAL_HOST
from .config import LibvirtConfig

if TYPE_CHECKING:
    from ...remote import TargetLink
    from ...remote.connection import SshConnection

# the system libvirtd's socket, monolithic or modular (virtqemud), as virt-ssh-helper looks for them
LIBVIRTD_SOCKETS = ("/run/libvirt/libvirt-sock", "/run/libvirt/virtqemud-sock")


def host_link(config: LibvirtConfig, shared: SharedResources) -> TargetLink | None:
    """The campaign's SSH link to the host whose libvirtd runs the domain: the lab's (its pinned host key), or
    ``host = "user@host"``'s (``ssh`` options, its host key checked against known_hosts); None for this host or a
    raw URI (no target of ours to connect to)."""
    if config.host == LOCAL_HOST:
        return None
    from ...remote import TargetLink, parse_target
    from ...remote.probe import DEFAULT_REMOTE_DIR

    if config.host == LAB_HOST:
        from ..kvmlab import open_kvm_lab

        target = open_kvm_lab(config.lab, config.arch, shared).ssh_target
    else:
        target = parse_target(config.host, option=f"environment {config.label}: host",
                              **config.ssh.model_dump(exclude_none=True))
    return shared.get(f"libvirt-host:{target.model_dump_json()}", lambda: TargetLink(target, DEFAULT_REMOTE_DIR))


class ForwardedLibvirtd:
    """libvirtd's socket on a remote host, forwarded to a socket here over the host's link: a ``qemu+unix`` URI
    libvirt connects to as to a local daemon. Made again when the link's connection was (a forward lives in its
    connection)."""

    def __init__(self, link: TargetLink) -> None:
        self.link = link
        self.remote_socket = ""
        self._connection: SshConnection | None = None
        self._uri = ""

    def uri(self) -> str:
        connection = self.link.connection()
        if connection is not self._connection:
            self.remote_socket = self._socket_of(connection)
            self._uri = f"qemu+unix:///system?socket={connection.forward_unix(self.remote_socket)}"
            self._connection = connection
        return self._uri

    def _socket_of(self, connection: SshConnection) -> str:
        for path in LIBVIRTD_SOCKETS:
            if connection.run(["test", "-S", path], timeout=30).returncode == 0:
                return path
        raise RunError(f"libvirt on {self.link.target.label}: no libvirtd socket ({' or '.join(LIBVIRTD_SOCKETS)}):"
                       " libvirtd must run there (`systemctl start libvirtd`, or without systemd "
                       "`virtlogd -d && libvirtd -d`)")

    def place(self) -> str:
        """Where the daemon is, for manifests and messages (the forward's local path says nothing)."""
        return f"{self.link.target.label}:{self.remote_socket or LIBVIRTD_SOCKETS[0]} (over rtvirt's SSH)"


def libvirtd_of(config: LibvirtConfig, shared: SharedResources) -> ForwardedLibvirtd | None:
    """The forwarded libvirtd of a remote host (one per host and campaign); None where libvirt connects itself."""
    link = host_link(config, shared)
    if link is None:
        return None
    return shared.get(f"libvirtd:{link.target.model_dump_json()}", lambda: ForwardedLibvirtd(link))


def libvirtd_address(config: LibvirtConfig, shared: SharedResources) -> tuple[str, str]:
    """The URI libvirt opens for ``config``'s domains, and where that daemon is for messages and manifests: the
    configured URI for both, or a remote host's forward and its host and socket."""
    forwarded = libvirtd_of(config, shared)
    if forwarded is None:
        return config.uri, config.uri
    return forwarded.uri(), forwarded.place()
