"""One shape for a machine rtvirt drives: this one, or one reached over SSH.

QEMU (here or on a KVM host), a Xen dom0 (this machine's, or a lab's) and an SSH target's agents ask the same
few things of the machine they run on, and they ask them through a :class:`HostTransport`:

- ``run`` a command to its end (bounded output, a timeout);
- ``spawn`` one that lives for the session: its stdout is copied live into a local file, and its stdin stays
  open until rtvirt stops it or goes (so a process that watches its stdin, an agent's ``--watch-stdin`` or
  QEMU's watchdog script, never outlives rtvirt: the end of the connection ends it too);
- ``put`` and ``get`` files;
- ``forward_unix``: a path on this machine that connects to a unix socket over there (QMP, a chardev).

:class:`rtvirt.remote.local.LocalTransport` does them on this machine, :class:`rtvirt.remote.SshConnection`
over asyncssh. Commands are argument vectors on both: nothing is ever handed to a shell as code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import RunError

__all__ = ["OUTPUT_LIMIT", "HostProcess", "HostTransport", "RemoteResult", "controller_id", "file_digest", "install"]

OUTPUT_LIMIT = 1 << 20  # bytes of a command's stdout/stderr kept by run()


@dataclass(frozen=True)
class RemoteResult:
    """How a command ended: its status (None if the connection went first) and bounded output."""

    returncode: int | None
    stdout: str
    stderr: str

    def check(self, what: str) -> RemoteResult:
        if self.returncode != 0:
            tail = self.stderr.strip()[-300:] or f"exit status {self.returncode}"
            raise RunError(f"{what}: {tail}")
        return self


@runtime_checkable
class HostProcess(Protocol):
    """A process started with :meth:`HostTransport.spawn` (the AgentProcess shape, plus stdin and stop)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def error_tail(self) -> str:
        """The end of its error output (bounded, untrusted text)."""
        ...

    def send(self, data: bytes) -> None:
        """Write ``data`` to its stdin."""
        ...

    def stop(self, grace: float = 5.0) -> int | None:
        """End it: its stdin closes (a process that watches it ends by itself), then it is ended."""
        ...


class HostTransport(Protocol):
    """A machine rtvirt drives (see the module's text). ``here``: this machine, whose paths and pids are ours."""

    @property
    def label(self) -> str: ...

    @property
    def here(self) -> bool: ...

    def run(self, argv: Sequence[str], timeout: float = 60.0, input: bytes | None = None,
            limit: int = OUTPUT_LIMIT) -> RemoteResult: ...

    def spawn(self, argv: Sequence[str], stream_to: Path | None,
              on_data: Callable[[bytes], None] | None = None) -> HostProcess: ...

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None: ...

    def get(self, remote: str, local: Path, timeout: float = 300.0) -> int: ...

    def forward_unix(self, remote_path: str) -> str:
        """A unix socket path on this machine whose connections reach ``remote_path`` over there."""
        ...

    def close(self) -> None: ...


def file_digest(path: Path) -> str:
    """The first 12 hex digits of a file's SHA-256: what names a copy of it on another machine."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()[:12]


def install(transport: HostTransport, local: Path, remote: str, mode: int = 0o644) -> bool:
    """Copy ``local`` to ``remote`` unless a file is already there; the caller names ``remote`` by the content's
    digest (file_digest), so a file that is there is the same one. Returns whether it was copied."""
    if transport.run(["test", "-e", remote]).returncode == 0:
        return False
    transport.run(["mkdir", "-p", remote.rsplit("/", 1)[0] or "/"]).check(f"creating the directory of {remote}")
    transport.put(local, remote, mode)
    return True


def controller_id() -> str:
    """This machine, in 8 hex digits (its machine-id, else its hostname): what rtvirt's leftovers on another machine
    (tracefs instances, QEMU directories) carry besides their owner's pid, so that a later rtvirt here removes a
    killed one's, never another controller's."""
    with contextlib.suppress(OSError):
        machine = Path("/etc/machine-id").read_text().strip()
        if re.fullmatch(r"[0-9a-f]{32}", machine):
            return machine[:8]
    return hashlib.sha256(os.uname().nodename.encode()).hexdigest()[:8]
