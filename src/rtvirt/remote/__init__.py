"""Reaching targets over SSH: the description of a target and a blocking connection to it.

Used by the ``ssh`` environment (any board or guest reachable over SSH) and by environments that drive a
control host over SSH (the Xen lab's dom0). asyncssh is imported only when a connection is opened.
"""

from __future__ import annotations

from .connection import RemoteProcess, RemoteResult, SshConnection, connect, remote_command
from .target import SshTarget, parse_target

__all__ = ["RemoteProcess", "RemoteResult", "SshConnection", "SshTarget", "connect", "parse_target",
           "remote_command"]
