"""Our agents on a target: installed by architecture, started with their pid known, never left behind.

A target runs only the static agents we copy to it (``<remote_dir>/bin-<arch>-<digest>/``). Each agent
runs with ``--watch-stdin``: its stdin is the SSH channel, so when the session goes, the agent stops,
flushing. Probes also write ``--tee``: a copy of the stream in ``<remote_dir>/runs/``, which
:meth:`RemoteAgent.recover` fetches after a dropped connection, so that no sample is lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from ..agents import agent_path
from ..errors import RunError
from ..params import cpu_list
from ..procs import move_threads, restore_threads
from ..stream import merge_stream_copy
from .connection import HostKeyRefused, RemoteProcess, SshConnection, connect
from .target import SshTarget
from .transport import file_digest, install

__all__ = ["TargetLink", "RemoteAgent", "merge_stream_copy"]

# A constant wrapper script: it announces the pid, then becomes the agent. The agent and its arguments
# are positional parameters ($0, $@), never part of the script. The session's sshd may have been kept off some CPUs
# (a tracer's pipe readers, a remote QEMU's output copies: explain.remote, environments.qemu.where), and the agent
# would inherit that: it gets every online CPU back first (its own --affinity/--cpus then place it).
_PID_WRAPPER = ('echo "rtvirt-pid $$" >&2; '
                'if command -v taskset > /dev/null 2>&1 && cpus=$(cat /sys/devices/system/cpu/online 2> /dev/null); '
                'then taskset -p -c "$cpus" $$ > /dev/null 2>&1; fi; exec "$0" "$@"')
_PID_LINE = re.compile(rb"(?m)^rtvirt-pid (\d{1,10})\n")  # a login shell may print before it


class TargetLink:
    """The connection to one target for a whole campaign: made on first use, remade after it drops.

    Campaigns keep one per target in ``SharedResources``; ``close()`` closes the connection.
    """

    def __init__(self, target: SshTarget, remote_dir: str) -> None:
        self.target = target
        self.remote_dir = remote_dir.rstrip("/")
        self._connection: SshConnection | None = None
        self._installed: dict[str, str] = {}
        self._this_machine: bool | None = None

    def connection(self) -> SshConnection:
        if self._connection is None or self._connection.closed:
            self._connection = connect(self.target)
        return self._connection

    def reconnect(self, timeout: float) -> SshConnection:
        """A new connection, retrying for ``timeout`` seconds (a target that reboots takes a while)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        deadline = time.monotonic() + timeout
        pause = 0.2
        while True:
            try:
                return self.connection()
            except HostKeyRefused:
                raise  # another machine answers: waiting will not help
            except RunError:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    @property
    def bin_dir_prefix(self) -> str:
        return f"{self.remote_dir}/bin-"

    def install(self, agent: str) -> str:
        """The target-side path of ``agent`` for the target's architecture, copied there if missing."""
        connection = self.connection()
        arch = connection.arch()
        local = agent_path(agent, arch)
        remote = f"{self.bin_dir_prefix}{arch}-{file_digest(local)}/{agent}"
        if self._installed.get(agent) == remote:
            return remote
        if install(connection, local, remote, 0o755):
            connection.run(["mkdir", "-p", f"{self.remote_dir}/runs"]).check(
                f"creating {self.remote_dir}/runs on {self.target.label}")
        self._installed[agent] = remote
        return remote

    def start(self, agent: str, args: list[str], stream_to: Path | None, tee_name: str | None = None) -> RemoteAgent:
        """Start ``agent`` with ``args`` (plus --watch-stdin); with ``tee_name``, a probe streams to stdout
        and keeps its copy in ``<remote_dir>/runs/<tee_name>``."""
        remote = self.install(agent)
        argv = [remote, *args, "--watch-stdin"]
        tee = f"{self.remote_dir}/runs/{tee_name}" if tee_name else None
        if tee is not None:
            argv += ["--out=-", f"--tee={tee}"]
        process = self.connection().spawn(["sh", "-c", _PID_WRAPPER, *argv], stream_to)
        return RemoteAgent(self, process, remote, stream_to, tee)

    def is_this_machine(self) -> bool:
        """Whether the target runs on this very kernel (a login to localhost, a container here): the same boot
        id. Asked once."""
        if self._this_machine is None:
            theirs = self.connection().run(["cat", "/proc/sys/kernel/random/boot_id"], timeout=60).stdout.strip()
            try:
                self._this_machine = theirs == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            except OSError:
                self._this_machine = False
        return self._this_machine

    @contextlib.contextmanager
    def controller_off(self, measured: Collection[int]) -> Iterator[str | None]:
        """On a target that is this machine, our own threads (the connection's, which receive the samples and the
        trace) keep to CPUs the probe does not measure while it runs, as rtla's -H and cyclictest's --mainaffinity
        keep theirs: else the scheduler puts them beside the probe and an explanation names them. Yields what was
        done, for the record (None: the target is another machine, which needs nothing of the kind)."""
        if not self.is_this_machine():
            yield None
            return
        others = os.sched_getaffinity(0) - set(measured)
        if not others:
            yield (f"target {self.target.label} is this machine: rtvirt's own threads share the measured CPUs "
                   f"{cpu_list(measured)} (it may run on no other)")
            return
        moved = move_threads(others)
        try:
            yield (f"target {self.target.label} is this machine: rtvirt's own threads kept to CPUs "
                   f"{cpu_list(others)}, off the measured {cpu_list(measured)}, while the probe ran")
        finally:
            restore_threads(moved)

    def reclaim(self) -> list[str]:
        """Kill agents a killed earlier rtvirt left on the target (ours: started from our bin dirs) and
        remove their stream copies; say what was found."""
        # "[/]" keeps the pattern from matching the command line that carries it
        pattern = "[/]" + re.escape(self.bin_dir_prefix.lstrip("/")).replace("\\-", "-") + ".*/rtvirt-"
        connection = self.connection()
        found = connection.run(["pgrep", "-f", pattern], timeout=30).stdout.split()
        pids = [pid for pid in found if pid.isdigit()][:256]
        if pids:
            connection.run(["kill", "-KILL", *pids], timeout=30)
        # copies of streams whose rtvirt was killed: their samples were received up to the kill
        copies = connection.run(["find", f"{self.remote_dir}/runs", "-maxdepth", "1", "-type", "f", "-name", "*.rtvs",
                                 "-print", "-delete"], timeout=60, limit=1 << 16).stdout.split()
        return ([f"agent pid {pid} left on {self.target.label}" for pid in pids]
                + [f"stream copy {name[-80:]} left on {self.target.label}: removed" for name in copies[:64]])

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class RemoteAgent:
    """A started agent on a target, with the AgentProcess shape (returncode, poll, error_tail)."""

    def __init__(self, link: TargetLink, process: RemoteProcess, remote_path: str, stream_to: Path | None,
                 tee: str | None) -> None:
        self.link, self.process, self.remote_path = link, process, remote_path
        self.stream_to, self.tee = stream_to, tee
        self.recovered: str | None = None  # what recover() found, once it ran

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        return self.process.poll()

    @property
    def lost(self) -> bool:
        return self.process.lost

    def error_tail(self) -> str:
        return _PID_LINE.sub(b"", bytes(self.process.error_tail(), "utf-8")).decode(errors="replace")

    def pid(self, timeout: float = 5.0) -> int | None:
        """The agent's pid on the target, as its wrapper announced it (None if it never did)."""
        deadline = time.monotonic() + timeout
        while True:
            match = _PID_LINE.search(bytes(self.process.stderr_head))
            if match:
                return int(match.group(1))
            if time.monotonic() > deadline or (self.process.poll() is not None and b"\n" in self.process.stderr_head):
                return None
            time.sleep(0.02)

    def stop(self, grace: float = 10.0) -> int | None:
        """End the agent: its stdin closes, it stops measuring, flushes and writes its trailer."""
        return self.process.stop(grace)

    def recover(self, reconnect_timeout: float = 60.0) -> str:
        """After a dropped connection: reconnect, fetch the agent's copy of the stream and complete the
        local stream with it. Returns what happened, for the run's reason. Safe to call twice."""
        if self.recovered is not None:
            return self.recovered
        if self.tee is None or self.stream_to is None:
            self.recovered = "no copy on the target to fetch"
            return self.recovered
        try:
            connection = self.link.reconnect(reconnect_timeout)
            fetched = self.stream_to.with_name(self.stream_to.name + ".target-copy")
            self._wait_gone(connection, grace=10.0)
            connection.get(self.tee, fetched)
            added = merge_stream_copy(self.stream_to, fetched)
            self.recovered = f"the copy on the target was fetched after reconnecting ({added} bytes more)"
        except RunError as exc:
            self.recovered = f"the copy on the target could not be fetched: {str(exc)[:300]}"
        return self.recovered

    def _wait_gone(self, connection: SshConnection, grace: float) -> bool:
        """Wait for the agent (which stops when its session ends) to exit; True once it has."""
        pid = self.pid(timeout=0)
        if pid is None:
            return True
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not self._still_ours(connection, pid):
                return True
            time.sleep(0.2)
        return False

    def _still_ours(self, connection: SshConnection, pid: int) -> bool:
        cmdline = connection.run(["cat", f"/proc/{pid}/cmdline"], timeout=30, limit=4096).stdout
        return cmdline.split("\0", 1)[0] == self.remote_path

    def cleanup(self) -> list[str]:
        """Make sure the agent is gone (kill it if not) and remove its copy of the stream; say what was wrong."""
        problems: list[str] = []
        try:
            connection = self.link.connection()
            pid = self.pid(timeout=0)
            if pid is not None and not self._wait_gone(connection, grace=5.0):
                connection.run(["kill", "-KILL", str(pid)], timeout=30)
                problems.append(f"agent pid {pid} on {self.link.target.label} outlived its session: killed")
            if self.tee is not None:
                connection.run(["rm", "-f", "--", self.tee], timeout=30)
        except RunError as exc:
            problems.append(f"cannot check {self.link.target.label} for leftover agents: {str(exc)[:200]}")
        return problems
