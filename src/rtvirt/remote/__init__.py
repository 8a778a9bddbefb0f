"""Reaching targets over SSH: the description of a target and a blocking connection to it.

Used by the ``ssh`` environment (any board or guest reachable over SSH) and by environments that drive a
control host over SSH (the Xen lab's dom0). asyncssh is imported only when a connection is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .agents import RemoteAgent, TargetLink, merge_stream_copy
    from .connection import HostKeyRefused, RemoteProcess, RemoteResult, SshConnection, connect, remote_command
    from .system import RemoteSystem
    from .target import REMOTE_DIR_PATTERN, SshTarget, SshTargetFields, parse_target

# each on first use: a scenario's schema reads a target's fields (.target), not the agents' stream code (numpy)
__getattr__ = lazy_names(__name__, {
    **dict.fromkeys(("RemoteAgent", "TargetLink", "merge_stream_copy"), ".agents"),
    **dict.fromkeys(("HostKeyRefused", "RemoteProcess", "RemoteResult", "SshConnection", "connect",
                     "remote_command"), ".connection"),
    "RemoteSystem": ".system",
    **dict.fromkeys(("REMOTE_DIR_PATTERN", "SshTarget", "SshTargetFields", "parse_target"), ".target")})

__all__ = ["HostKeyRefused", "REMOTE_DIR_PATTERN", "RemoteAgent", "RemoteProcess", "RemoteResult", "RemoteSystem",
           "SshConnection", "SshTarget", "SshTargetFields", "TargetLink", "connect", "merge_stream_copy",
           "parse_target",
           "remote_command"]
