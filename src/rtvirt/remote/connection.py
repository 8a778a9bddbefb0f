"""A synchronous facade over asyncssh: one connection to one target, driven from rtvirt's threads.

asyncssh is asynchronous; rtvirt's runners are not. Every connection's coroutines run on one event loop in
a background daemon thread (shared by all connections of the process), and the methods here block on them.
Commands are argument vectors: each argument is ``shlex.quote``d on the far side's command line, so no
string from a scenario or a target is ever interpreted by the remote shell. Output read back is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import EXIT_USAGE, CommandTimeout, RunError
from ..procs import owned_temp_dir
from .target import SshTarget
from .transport import OUTPUT_LIMIT, RemoteResult

__all__ = ["STDERR_HEAD_BYTES", "HostKeyRefused", "RemoteProcess", "RemoteResult", "SshConnection", "connect",
           "remote_command"]

ERROR_TAIL_BYTES = 4096
STDERR_HEAD_BYTES = 4096  # room for what a target's login shell prints before our wrapper's pid line
CHUNK = 1 << 16
FORWARD_PREFIX = "rtvirt-fwd-"  # + <pid>-<start time>-<random>: the local ends of forward_unix
T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


class HostKeyRefused(RunError):
    """The target's host key is not the one known_hosts trusts: never retried, exit 2 (fix the setup)."""

    exit_code = EXIT_USAGE


def _event_loop() -> asyncio.AbstractEventLoop:
    """The background loop every connection runs on (started on first use, a daemon thread)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rtvirt-ssh", daemon=True).start()
            _loop = loop
        return _loop


def _call(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    future = asyncio.run_coroutine_threadsafe(coro, _event_loop())
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise


def remote_command(argv: Sequence[str]) -> str:
    """The far side's command line for ``argv``: every argument quoted, nothing left to the shell."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(shlex.quote(str(arg)) for arg in argv)


async def _read_bounded(stream: Any, limit: int) -> bytes:
    """Read ``stream`` to its end, keeping the first ``limit`` bytes (reading on so the far side never blocks)."""
    kept = bytearray()
    while chunk := await stream.read(CHUNK):
        if len(kept) < limit:
            kept += chunk[:limit - len(kept)]
    return bytes(kept)


class RemoteProcess:
    """An agent on a target, with the :class:`rtvirt.environments.base.AgentProcess` shape.

    Its stdout is copied live into a local file as it arrives; the last ``ERROR_TAIL_BYTES`` of stderr are
    kept. ``returncode`` stays None while it runs; if the connection drops first, ``lost`` is True and the
    return code is 255 (as ``ssh`` reports it).
    """

    def __init__(self, label: str) -> None:
        self._label = label
        self._returncode: int | None = None
        self._stderr = bytearray()
        self.stderr_head = bytearray()  # the first bytes of stderr (where a wrapper announces the remote pid)
        self._done = threading.Event()
        self._process: Any = None
        self.lost = False
        self.received_bytes = 0

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self._returncode

    def send(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin (a listener relays it back to the guest it serves)."""
        if self._process is None or self._returncode is not None:
            raise RunError(f"ssh target {self._label}: the process has no stdin any more")

        async def go() -> None:
            self._process.stdin.write(data)

        _call(go(), 10.0)

    def error_tail(self) -> str:
        text = bytes(self._stderr).decode(errors="replace").strip()
        if self.lost:
            text = (text + "\n" if text else "") + f"the connection to {self._label} was lost"
        return text

    async def _follow(self, process: Any, stream_to: Path | None,
                      on_data: Callable[[bytes], None] | None = None) -> None:
        self._process = process
        try:
            sink = stream_to.open("wb") if stream_to is not None else None
            try:
                copy = asyncio.ensure_future(self._copy(process.stdout, sink, on_data))
                errors = asyncio.ensure_future(self._tail(process.stderr))
                await asyncio.gather(copy, errors, return_exceptions=True)
                await process.wait_closed()
            finally:
                if sink is not None:
                    sink.close()
            status = process.exit_status
            if status is None and process.exit_signal is None:
                self.lost = True  # the channel closed without an exit status: the connection went away
            self._returncode = 255 if status is None else (status if status >= 0 else 255)
        except Exception:  # noqa: BLE001 - any failure of the channel is a lost connection for the run
            self.lost = True
            self._returncode = 255
        finally:
            self._done.set()

    async def _copy(self, stream: Any, sink: Any, on_data: Callable[[bytes], None] | None) -> None:
        while chunk := await stream.read(CHUNK):
            self.received_bytes += len(chunk)
            if sink is not None:
                sink.write(chunk)
                sink.flush()  # the local reader follows the file while the agent runs
            if on_data is not None:
                on_data(chunk)

    async def _tail(self, stream: Any) -> None:
        while chunk := await stream.read(CHUNK):
            if len(self.stderr_head) < STDERR_HEAD_BYTES:
                self.stderr_head += chunk[:STDERR_HEAD_BYTES - len(self.stderr_head)]
            self._stderr += chunk
            del self._stderr[:-ERROR_TAIL_BYTES]

    def stop(self, grace: float = 10.0) -> int | None:
        """Ask the agent to finish (end of its stdin: it flushes and writes its trailer), then close the channel."""
        if self._returncode is None and self._process is not None:
            with contextlib.suppress(Exception):
                _event_loop().call_soon_threadsafe(self._process.stdin.write_eof)
            if not self._done.wait(grace):
                with contextlib.suppress(Exception):
                    _event_loop().call_soon_threadsafe(self._process.close)
                self._done.wait(5.0)
        return self._returncode


class SshConnection:
    """One SSH connection to one target; every method blocks until the remote side has answered. A
    :class:`rtvirt.remote.transport.HostTransport`."""

    here = False

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self._conn: Any = None
        self._processes: list[RemoteProcess] = []
        self._arch: str | None = None
        self._forwards: list[Any] = []  # unix socket listeners (forward_unix), closed with the connection
        self._forward_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def label(self) -> str:
        return self.target.label

    def open(self) -> SshConnection:
        self._conn = _call(self._connect(), self.target.connect_timeout + 5)
        return self

    async def _connect(self) -> Any:
        import asyncssh  # lazily: the CLI must start fast

        options: dict[str, Any] = {"connect_timeout": self.target.connect_timeout}
        if self.target.port is not None:
            options["port"] = self.target.port
        if self.target.user is not None:
            options["username"] = self.target.user
        if self.target.identity_file is not None:
            options["client_keys"] = [str(self.target.identity_file)]
        if self.target.known_hosts is not None:
            options["known_hosts"] = str(self.target.known_hosts)  # never None: that would accept any key
        if self.target.proxy_jump is not None:
            options["tunnel"] = self.target.proxy_jump
        if self.target.ssh_config is not None:
            options["config"] = [str(self.target.ssh_config)]
        label = self.target.label
        try:
            return await asyncssh.connect(self.target.host, **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyRefused(f"ssh target {label}: its host key is not trusted ({str(exc)[:200]}); refusing to "
                           "connect. Verify the key out of band and add it to known_hosts "
                           f"({self.target.known_hosts or '~/.ssh/known_hosts'})") from None
        except asyncssh.PermissionDenied:
            raise RunError(f"ssh target {label}: authentication refused (key, ssh-agent or user wrong)") from None
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise RunError(f"ssh target {label}: cannot connect: {str(exc)[:300] or type(exc).__name__}") from None

    @property
    def connection(self) -> Any:
        if self._conn is None:
            raise RunError(f"ssh target {self.target.label}: not connected")
        return self._conn

    @property
    def closed(self) -> bool:
        return self._conn is None or self._conn.is_closed()

    def run(self, argv: Sequence[str], timeout: float = 60.0, input: bytes | None = None,
            limit: int = OUTPUT_LIMIT) -> RemoteResult:
        """Run ``argv`` to completion; stdout and stderr are cut at ``limit`` bytes each."""
        async def go() -> RemoteResult:
            process = await self.connection.create_process(remote_command(argv), encoding=None)
            try:
                if input:
                    process.stdin.write(input)
                process.stdin.write_eof()
                out, err = await asyncio.gather(_read_bounded(process.stdout, limit),
                                                _read_bounded(process.stderr, limit))
                await process.wait_closed()
            finally:
                process.close()
            return RemoteResult(process.exit_status, out.decode(errors="replace"), err.decode(errors="replace"))

        try:
            return _call(asyncio.wait_for(go(), timeout), timeout + 5)
        except TimeoutError:
            raise CommandTimeout(f"ssh target {self.target.label}: {remote_command(argv[:3])[:100]} "
                                 f"did not finish within {timeout:g}s") from None
        except (OSError, EOFError) as exc:
            raise RunError(f"ssh target {self.target.label}: connection failed: {str(exc)[:200]}") from None
        except Exception as exc:
            if type(exc).__module__.startswith("asyncssh"):
                raise RunError(f"ssh target {self.target.label}: {str(exc)[:300]}") from None
            raise

    def spawn(self, argv: Sequence[str], stream_to: Path | None,
              on_data: Callable[[bytes], None] | None = None) -> RemoteProcess:
        """Start ``argv`` on the target; its stdout is copied into ``stream_to`` as it arrives, and handed to
        ``on_data`` (called on the connection's event loop: it must not block).

        Its stdin stays open for the life of the session: agents run with ``--watch-stdin`` stop (flushing)
        when it ends, so an agent never outlives the connection that started it.
        """
        remote = RemoteProcess(self.target.label)
        if stream_to is not None:
            stream_to.parent.mkdir(parents=True, exist_ok=True)

        async def go() -> None:
            process = await self.connection.create_process(remote_command(argv), encoding=None)
            asyncio.ensure_future(remote._follow(process, stream_to, on_data))

        try:
            _call(go(), 30.0)
        except Exception as exc:
            raise RunError(f"ssh target {self.target.label}: cannot start {str(argv[0])[:100]}: "
                           f"{str(exc)[:200]}") from None
        self._processes.append(remote)
        return remote

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy ``local`` to ``remote`` atomically (written beside it, then renamed): safe over a running binary."""
        data = local.read_bytes()
        partial = f"{remote}.part-{time.monotonic_ns()}"
        # a guest image to a loaded, emulated KVM host: 66 MB took more than 120 s; allow 256 KiB/s beyond that
        timeout = 120 + len(data) / (256 << 10)
        self.run(["dd", f"of={partial}", "bs=65536"], timeout=timeout, input=data).check(f"copying {local.name}")
        self.run(["chmod", f"{mode:o}", partial]).check(f"chmod {remote}")
        self.run(["mv", "-f", partial, remote]).check(f"installing {remote}")

    def get(self, remote: str, local: Path, timeout: float = 300.0) -> int:
        """Copy the target's file ``remote`` to ``local``; return its size. Missing file: RunError."""
        local.parent.mkdir(parents=True, exist_ok=True)
        process = RemoteProcess(self.target.label)

        async def go() -> None:
            channel = await self.connection.create_process(remote_command(["cat", "--", remote]), encoding=None)
            channel.stdin.write_eof()
            await process._follow(channel, local)

        _call(asyncio.wait_for(go(), timeout), timeout + 5)
        if process.returncode != 0:
            local.unlink(missing_ok=True)
            raise RunError(f"ssh target {self.target.label}: cannot fetch {remote[:200]}: "
                           f"{process.error_tail()[-200:]}")
        return local.stat().st_size

    def forward_unix(self, remote_path: str) -> str:
        """A unix socket here whose every connection asyncssh carries to ``remote_path`` on the target (an
        OpenSSH ``direct-streamlocal`` channel, as ``ssh -L local.sock:remote.sock`` makes): QMP clients and the
        chardev sockets of a remote QEMU are then used exactly as local ones. Listening starts at once; a
        connection made before the remote socket exists is refused, and the client tries again."""
        if self._forward_dir is None:
            # short (a socket path fits 108 bytes), and named after its owner so that a killed one's is removed
            self._forward_dir = owned_temp_dir(FORWARD_PREFIX)
        local = f"{self._forward_dir.name}/{len(self._forwards)}.sock"

        async def go() -> Any:
            return await self.connection.forward_local_path(local, remote_path)

        try:
            self._forwards.append(_call(go(), 30.0))
        except Exception as exc:
            raise RunError(f"ssh target {self.target.label}: cannot forward {remote_path[:100]}: "
                           f"{str(exc)[:200]}") from None
        return local

    def arch(self) -> str:
        """The target's machine architecture as rtvirt names agents (x86_64, aarch64)."""
        if self._arch is None:
            machine = self.run(["uname", "-m"], timeout=30).check("uname -m").stdout.strip()
            self._arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)[:32]
        return self._arch

    def close(self) -> None:
        """Stop our processes (their agents see the end of stdin) and close the connection; safe twice."""
        for process in self._processes:
            process.stop(grace=5.0)
        self._processes.clear()
        forwards, self._forwards = self._forwards, []
        for listener in forwards:
            with contextlib.suppress(Exception):
                _event_loop().call_soon_threadsafe(listener.close)
        if self._forward_dir is not None:
            self._forward_dir.cleanup()
            self._forward_dir = None
        if self._conn is not None:
            conn, self._conn = self._conn, None

            async def go() -> None:
                conn.close()
                await conn.wait_closed()

            with contextlib.suppress(Exception):
                _call(go(), 10.0)

    def __enter__(self) -> SshConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(target: SshTarget) -> SshConnection:
    """An open connection to ``target`` (RunError with the reason if it cannot be made)."""
    return SshConnection(target).open()
