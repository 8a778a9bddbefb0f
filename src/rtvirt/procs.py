"""Child processes that never outlive rtvirt.

Every process rtvirt starts (agents, stress-ng, QEMU) goes through :class:`Supervisor`: each child gets
its own process group (so Ctrl-C reaches rtvirt, which then stops children in order, letting probes
flush), and the kernel kills it should rtvirt itself die (PR_SET_PDEATHSIG). Commands are argument
lists, never shell strings.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Supervisor", "cpu_ticks", "die_with_parent", "stops_deferred", "terminate_group",
           "process_start_time", "move_threads", "restore_threads"]

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold anything, ")" too); None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_ticks(stat: str) -> int:
    """The clock ticks a process or thread has run (utime + stime), from the text of its /proc stat file."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def process_start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat): with the pid, who owns something
    we left (a ledger entry, a tracefs instance), also after the pid is reused; None once it is gone."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def owned_prefix(prefix: str) -> str:
    """``prefix`` followed by this process's pid and start time: a temporary directory named so is one that
    ``_remove_orphaned_dirs`` removes once this process is gone (a kill -9 leaves it behind)."""
    return f"{prefix}{os.getpid()}-{process_start_time(os.getpid())}-"


def _remove_orphaned_dirs(prefix: str) -> None:
    """The temporary directories named by ``owned_prefix(prefix)`` whose process is gone."""
    for entry in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        owner = entry.name.removeprefix(prefix).split("-")
        if len(owner) == 3 and owner[0].isdigit() and process_start_time(int(owner[0])) != owner[1]:
            shutil.rmtree(entry, ignore_errors=True)


def owned_temp_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A new temporary directory named by ``owned_prefix(prefix)``, once those of earlier processes that were
    killed before removing theirs are gone."""
    _remove_orphaned_dirs(prefix)
    return tempfile.TemporaryDirectory(prefix=owned_prefix(prefix))


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, D, T, Z...); None once it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def move_threads(cpus: set[int]) -> dict[int, set[int]]:
    """Every thread of this process onto ``cpus`` (threads started later inherit it from theirs); returns each
    thread's CPUs before, for ``restore_threads``."""
    before: dict[int, set[int]] = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    return before


def restore_threads(before: dict[int, set[int]]) -> None:
    """Every thread of this process back on the CPUs ``move_threads`` found it on (a thread started since: on
    the main thread's)."""
    default = before.get(os.getpid())
    for tid in map(int, os.listdir("/proc/self/task")):
        if (cpus := before.get(tid, default)) is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> None:
    """The kernel sends this process ``signum`` when its parent dies: a parent that is SIGKILLed takes its
    children along. The kernel ties this to the *thread* that forked, so children are started from long-lived
    threads only (rtvirt starts them all from the main thread). ``parent``, the pid that forked us: a parent
    killed between the fork and this call sends nothing (seen: a stressor with no end kept a CPU busy for the
    rest of a test session), so the child ends here as the signal would have ended it."""
    _libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(128 + signum)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM that come during the block take effect right after it, never inside it.

    Around starting children: subprocess runs Python's at-fork handlers (logging's takes its lock before fork
    and releases it after); a KeyboardInterrupt raised inside one is ignored and leaves that lock held, so every
    other thread that logs hangs. And a child started but not yet recorded would outlive us. Signal handlers
    run in the main thread only, so elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _: caught.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if caught:
            signal.raise_signal(caught[0])  # the handler it was meant for, now


def terminate_group(proc: subprocess.Popen[Any], grace: float = 5.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL after ``grace`` seconds; return its status."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.wait()
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


_live: weakref.WeakSet[Supervisor] = weakref.WeakSet()


@atexit.register
def _stop_all_supervisors() -> None:
    for supervisor in list(_live):
        supervisor.stop_all()


class Supervisor:
    """Starts and reliably stops a set of child processes; use as a context manager."""

    def __init__(self) -> None:
        self._children: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()
        _live.add(self)

    def start(
        self,
        argv: Sequence[str],
        *,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = subprocess.PIPE,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
        before_exec: Callable[[], None] | None = None,
    ) -> subprocess.Popen[Any]:
        """Start ``argv``; ``before_exec`` runs in the child before exec (e.g. to join a cgroup)."""

        parent = os.getpid()

        def prepare_child() -> None:  # in the child between fork and exec
            die_with_parent(parent=parent)
            if before_exec is not None:
                before_exec()

        with stops_deferred():
            proc = subprocess.Popen(
                list(argv),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=env,
                pass_fds=tuple(pass_fds),
                start_new_session=True,
                preexec_fn=prepare_child,
            )
            with self._lock:
                self._children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[Any], grace: float = 5.0) -> int | None:
        status = terminate_group(proc, grace)
        with self._lock:
            if proc in self._children:
                self._children.remove(proc)
        return status

    def stop_all(self, grace: float = 5.0) -> None:
        with self._lock:
            children = list(reversed(self._children))
            self._children.clear()
        for proc in children:
            terminate_group(proc, grace)

    @property
    def children(self) -> list[subprocess.Popen[Any]]:
        with self._lock:
            return list(self._children)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
