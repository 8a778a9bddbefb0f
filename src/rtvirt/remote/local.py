"""This machine as a :class:`~rtvirt.remote.transport.HostTransport`: commands run as argument vectors, files are
copied, unix sockets are reached where they are, and every process started dies with rtvirt (procs.Supervisor)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ..errors import CommandTimeout, RunError
from ..procs import Supervisor, terminate_group
from .transport import OUTPUT_LIMIT, RemoteResult

__all__ = ["LocalProcess", "LocalTransport"]

ERROR_TAIL_BYTES = 4096


class LocalProcess:
    """A process started here by :meth:`LocalTransport.spawn` (the HostProcess shape): its stderr goes to a file
    of its own (never a pipe that could fill while nobody reads it), whose end ``error_tail`` reads."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr: IO[bytes], supervisor: Supervisor) -> None:
        self.proc = proc
        self._stderr = stderr
        self._supervisor = supervisor

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def error_tail(self) -> str:
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - ERROR_TAIL_BYTES))
            return self._stderr.read(ERROR_TAIL_BYTES).decode(errors="replace").strip()
        except (OSError, ValueError):  # closed once stopped
            return ""

    def send(self, data: bytes) -> None:
        """Write ``data`` to its stdin (dom0's listener relays it back to the domU)."""
        if self.proc.stdin is None or self.proc.poll() is not None:
            raise RunError("the process has no stdin any more")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM its process group, SIGKILL after ``grace`` (procs.terminate_group)."""
        status = terminate_group(self.proc, grace)
        self._supervisor.stop(self.proc, grace=0)
        return status


class LocalTransport:
    """This machine (a Xen host's dom0, the host QEMU runs on): a :class:`HostTransport` without a connection."""

    label = "this machine"
    here = True

    def __init__(self, supervisor: Supervisor, what: str = "local") -> None:
        self.supervisor = supervisor
        self._what = what  # names the caller in messages ("dom0", "qemu")

    def run(self, argv: Sequence[str], timeout: float = 60.0, input: bytes | None = None,
            limit: int = OUTPUT_LIMIT) -> RemoteResult:
        try:
            done = subprocess.run(list(argv), capture_output=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"{self._what}: {argv[0]} did not finish within {timeout:g}s") from None
        except OSError as exc:
            raise RunError(f"{self._what}: {argv[0]} failed: {exc}") from None
        return RemoteResult(done.returncode, done.stdout[:limit].decode(errors="replace"),
                            done.stderr[:limit].decode(errors="replace"))

    def spawn(self, argv: Sequence[str], stream_to: Path | None,
              on_data: Callable[[bytes], None] | None = None) -> LocalProcess:
        """Start ``argv``; its stdout goes to ``stream_to``. Its stdin stays open (a pipe we hold, as an SSH
        channel is): busybox nc shuts its socket's sending side at EOF on stdin, the domU's nc then ends and the
        probe dies of a broken pipe."""
        if on_data is not None:
            raise ValueError("a local process writes its stdout to a file: follow the file instead")
        sink: Any = stream_to.open("wb") if stream_to is not None else subprocess.DEVNULL
        stderr = tempfile.TemporaryFile(prefix="rtvirt-stderr-")  # noqa: SIM115 - kept with the process
        try:
            return LocalProcess(self.supervisor.start(argv, stdout=sink, stderr=stderr, stdin=subprocess.PIPE),
                                stderr, self.supervisor)
        except OSError as exc:
            stderr.close()
            raise RunError(f"{self._what}: cannot start {argv[0]}: {exc.strerror or exc}") from None
        finally:
            if stream_to is not None:
                sink.close()

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        partial = f"{remote}.part-{os.getpid()}"
        shutil.copyfile(local, partial)
        os.chmod(partial, mode)
        os.replace(partial, remote)

    def get(self, remote: str, local: Path, timeout: float = 300.0) -> int:
        try:
            shutil.copyfile(remote, local)
        except OSError as exc:
            raise RunError(f"{self._what}: cannot read {remote[:200]}: {exc.strerror}") from None
        return local.stat().st_size

    def forward_unix(self, remote_path: str) -> str:
        return remote_path  # it is here

    def close(self) -> None:
        pass
