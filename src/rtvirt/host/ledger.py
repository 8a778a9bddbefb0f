"""The settings ledger: every kernel setting rtvirt changes, with the value it had, until it is put back.

One JSON file under /run (gone at reboot, as the settings themselves are), rewritten atomically under an
exclusive lock, shared by every rtvirt on the machine. Each entry names its holders: a campaign or partition
(``pid:<pid>:<start time>``, so that a reused pid is not mistaken for it) or ``rtvirt host tune`` (``cli``).
The first holder records the value it found; later holders join the entry. When the last holder releases a
setting, or is found dead (kill -9), the recorded value is written back, byte for byte as it was read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PrivilegeError
from ..fileio import write_atomically
from ..params import parse_cpulist
from ..procs import process_start_time
from .checks.base import AFFINITY_PREFIX, cpu_list
from .tuned_adm import run_tuned_adm

__all__ = ["Ledger", "Change", "DEFAULT_LEDGER", "process_holder", "CLI_HOLDER", "holder_alive", "read_raw"]

DEFAULT_LEDGER = Path(os.environ.get("RTVIRT_LEDGER", "/run/rtvirt/ledger.json"))
CLI_HOLDER = "cli"
MAX_VALUE = 65536

def process_holder(tag: str = "", pid: int | None = None) -> str:
    """The holder id of a process (default: this one); ``tag`` tells apart what one process holds for different
    lifetimes (a campaign's tuning, one run's partition)."""
    pid = os.getpid() if pid is None else pid
    return f"pid:{pid}:{process_start_time(pid)}" + (f":{tag}" if tag else "")


def holder_alive(holder: str) -> bool:
    if not holder.startswith("pid:"):
        return True  # `rtvirt host tune` holds until `rtvirt host restore`
    parts = holder.split(":")
    return len(parts) >= 3 and parts[1].isdigit() and process_start_time(int(parts[1])) == parts[2]


@dataclass
class Change:
    """One setting put back (or that could not be, or whose knob went away: a thread that ended, a device or
    cgroup removed, so there is nothing left to put back)."""

    path: str
    value: str
    error: str | None = None
    gone: bool = False


def _affinity_pid(path: str) -> int:
    pid, start = path.removeprefix(AFFINITY_PREFIX).split(":", 1)
    if process_start_time(int(pid)) != start:
        raise ProcessLookupError(3, "thread gone", path)
    return int(pid)


def read_raw(path: str) -> str | None:
    """What a setting reads now: a file's text, or a thread's allowed CPUs as a list ("0-1")."""
    try:
        if path.startswith(AFFINITY_PREFIX):
            return cpu_list(sorted(os.sched_getaffinity(_affinity_pid(path))))
        with open(path, "rb") as f:
            return f.read(MAX_VALUE).decode("utf-8", errors="surrogateescape")
    except OSError:
        return None


def write_raw(path: str, value: str) -> None:
    if path.startswith(AFFINITY_PREFIX):
        os.sched_setaffinity(_affinity_pid(path), parse_cpulist(value))
        return
    with open(path, "wb", buffering=0) as f:
        f.write(value.encode("utf-8", errors="surrogateescape"))


COMMAND_PREFIX = "command:"


def _put_back(path: str, value: str) -> None:
    if path == f"{COMMAND_PREFIX}tuned":  # tuned's selection as found (tune.tuned_selection)
        mode, _, names = value.partition(" ")
        # a bare profile name: an entry an earlier rtvirt recorded (the ledger lasts until reboot)
        wanted = "" if not value else names if mode in ("auto", "manual") else value
        argv = (["tuned-adm", "off"] if not value else ["tuned-adm", "auto_profile"] if mode == "auto"
                else ["tuned-adm", "profile", *wanted.split()])
        done = run_tuned_adm(argv, wanted)
        if done.returncode != 0:
            raise OSError(5, f"{' '.join(argv)} failed: {(done.stderr.strip() or done.stdout.strip())[:200]}", path)
        return
    if read_raw(path) == value:  # already as found (e.g. put back by the tool that changed it): nothing to write
        return
    write_raw(path, value)


class Ledger:
    """The ledger file at ``path``; every method takes the lock for its whole read-change-write."""

    def __init__(self, path: Path = DEFAULT_LEDGER) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _locked(self, create: bool = False) -> Iterator[dict[str, Any]]:
        """The ledger under its lock; without ``create``, a ledger that was never written is an empty one (so
        that releasing and reclaiming cost nothing, and need no privilege, where nothing was ever changed)."""
        try:
            fresh = not create and not self.path.exists()
            if not fresh:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                lock = open(self.path.with_suffix(".lock"), "a")  # noqa: SIM115 - closed below, after the write
        except OSError as exc:
            raise PrivilegeError(f"settings ledger {self.path}: {exc.strerror} (changing host settings needs "
                                 "root)") from None
        if fresh:
            yield {"entries": []}
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                document = json.loads(self.path.read_text()) if self.path.exists() else {"entries": []}
            except ValueError:
                document = {"entries": []}  # a torn file cannot happen (atomic writes); a hand-edited one can
            before = json.dumps(document)
            yield document
            if json.dumps(document) != before:
                write_atomically(self.path, json.dumps(document, indent=1))

    def change(self, holder: str, path: str, value: str, restore_as: Callable[[str], str] | None = None) -> str:
        """Write ``value`` to ``path`` on behalf of ``holder``, recording what it was; returns the value read.

        ``restore_as`` turns what the file reads into what must be written to get it back (a sysfs choice
        file reads "always [madvise] never" and takes "madvise"); by default the text read is written back.
        Raises OSError when the file cannot be read or written (nothing is recorded then).
        """
        with self._locked(create=True) as document:
            entries = document["entries"]
            entry = next((e for e in entries if e["path"] == path), None)
            found = read_raw(path)
            if found is None:
                raise FileNotFoundError(2, "cannot read", path)
            if entry is None:
                entry = {"path": path, "found": found,
                         "restore": restore_as(found) if restore_as else found, "holders": []}
                write_raw(path, value)
                entries.append(entry)
            else:
                write_raw(path, value)
            if holder not in entry["holders"]:
                entry["holders"].append(holder)
            return found

    def remember_command(self, holder: str, tool: str, previous: str) -> None:
        """Record a tool's state that is not a file (tuned's active profile) before ``holder`` changes it."""
        self._remember(holder, f"{COMMAND_PREFIX}{tool}", previous, previous)

    def remember(self, holder: str, path: str) -> None:
        """Record what ``path`` reads before another tool (tuned) changes it on ``holder``'s behalf, so that it is
        written back if that tool does not put it back itself; a sysfs choice file ("always [madvise] never") is
        put back as its chosen word. A file that cannot be read is not recorded."""
        found = read_raw(path)
        if found is not None:
            choice = re.fullmatch(r"(?:[^\s\[\]]+ )*\[([^\s\[\]]+)\](?: [^\s\[\]]+)*\n?", found)
            self._remember(holder, path, found, choice.group(1) if choice else found)

    def _remember(self, holder: str, path: str, found: str, restore: str) -> None:
        with self._locked(create=True) as document:
            entry = next((e for e in document["entries"] if e["path"] == path), None)
            if entry is None:
                entry = {"path": path, "found": found, "restore": restore, "holders": []}
                document["entries"].append(entry)
            if holder not in entry["holders"]:
                entry["holders"].append(holder)

    def release(self, holder: str) -> list[Change]:
        """Give up ``holder``'s settings; those nobody else holds go back to what was found."""
        with self._locked() as document:
            for entry in document["entries"]:
                if holder in entry["holders"]:
                    entry["holders"].remove(holder)
            return self._restore_unheld(document)

    def reclaim(self) -> list[Change]:
        """Put back what holders that died (kill -9) left changed."""
        with self._locked() as document:
            for entry in document["entries"]:
                entry["holders"] = [h for h in entry["holders"] if holder_alive(h)]
            return self._restore_unheld(document)

    def held(self, holder: str | None = None) -> list[dict[str, Any]]:
        """The entries (of ``holder``, or all)."""
        with self._locked() as document:
            return [dict(e) for e in document["entries"] if holder is None or holder in e["holders"]]

    @staticmethod
    def _restore_unheld(document: dict[str, Any]) -> list[Change]:
        changes, kept = [], []
        # last changed first: a setting that depends on another (a cpuset flag on its parent's) goes back in order
        for entry in reversed(document["entries"]):
            if entry["holders"]:
                kept.append(entry)
                continue
            change = Change(entry["path"], entry["restore"])
            try:
                _put_back(entry["path"], entry["restore"])
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ESRCH, errno.ENODEV):
                    change.gone = True  # unbound kworkers come and go between a tune and its restore
                else:
                    change.error = exc.strerror or str(exc)
                    kept.append(entry)  # kept, so a later restore or reclaim tries again
            changes.append(change)
        document["entries"] = list(reversed(kept))
        return changes
