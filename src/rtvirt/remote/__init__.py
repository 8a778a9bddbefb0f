"""Reaching the machines rtvirt drives: this one or one over SSH, through one transport shape (.transport).

Used by the ``ssh`` environment (any board or guest reachable over SSH), by environments that drive a control
host (a Xen dom0, this machine's or a lab's) and by the ``qemu`` kind on a KVM host reached over SSH. asyncssh
is imported only when a connection is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .agents import RemoteAgent, TargetLink, merge_stream_copy
    from .connection import HostKeyRefused, RemoteProcess, SshConnection, connect, remote_command
    from .local import LocalProcess, LocalTransport
    from .system import RemoteSystem
    from .target import REMOTE_DIR_PATTERN, SshTarget, SshTargetFields, parse_target
    from .transport import HostProcess, HostTransport, RemoteResult, file_digest, install

# each on first use: a scenario's schema reads a target's fields (.target), not the agents' stream code (numpy)
__getattr__ = lazy_names(__name__, {
    **dict.fromkeys(("RemoteAgent", "TargetLink", "merge_stream_copy"), ".agents"),
    **dict.fromkeys(("HostKeyRefused", "RemoteProcess", "SshConnection", "connect", "remote_command"),
                    ".connection"),
    **dict.fromkeys(("LocalProcess", "LocalTransport"), ".local"),
    **dict.fromkeys(("HostProcess", "HostTransport", "RemoteResult", "file_digest", "install"), ".transport"),
    "RemoteSystem": ".system",
    **dict.fromkeys(("REMOTE_DIR_PATTERN", "SshTarget", "SshTargetFields", "parse_target"), ".target")})

__all__ = ["HostKeyRefused", "HostProcess", "HostTransport", "LocalProcess", "LocalTransport", "REMOTE_DIR_PATTERN",
           "RemoteAgent", "RemoteProcess", "RemoteResult", "RemoteSystem", "SshConnection", "SshTarget",
           "SshTargetFields", "TargetLink", "connect", "file_digest", "install", "merge_stream_copy", "parse_target",
           "remote_command"]
