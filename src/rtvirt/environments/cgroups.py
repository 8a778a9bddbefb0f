"""Cgroups rtvirt makes for a run: a cpuset (and CPU bandwidth) per partition, made exclusive — a scheduling domain
of its own, as SCHED_DEADLINE on pinned threads needs — and a shield for everything else (docs/host.md).

Works on cgroup v1 (one hierarchy per controller: cpuset/, cpu/) and on cgroup v2 (one unified tree,
controllers enabled through cgroup.subtree_control); :class:`CgroupTree` hides the difference. Used by the
partition environment (its workload's cgroup) and the qemu one (pinned deadline vCPU threads). Host settings
changed on the way (the v1 root cpuset's load balancing) go through the settings ledger.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Any

from ..errors import PrivilegeError, RunError
from ..host.ledger import Ledger

__all__ = ["Cgroup", "CgroupTree", "Exclusive", "CGROUP_ROOT", "SHIELD_SUFFIX", "reclaim_leftovers"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIELD_SUFFIX = "-shield"


class Cgroup:
    """One created cgroup: the directories it spans (one per v1 hierarchy, or one v2 directory)."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories

    def join(self, pid: int) -> None:
        for directory in self.directories:
            (directory / "cgroup.procs").write_text(f"{pid}\n")

    def join_thread(self, tid: int) -> None:
        """One thread, not its whole process: v1's ``tasks``, a v2 threaded cgroup's ``cgroup.threads``."""
        for directory in self.directories:
            (directory / ("cgroup.threads" if _threaded(directory) else "tasks")).write_text(f"{tid}\n")

    def remove(self) -> None:
        """Move leftover tasks to the parent, then remove the directories (and any below them, deepest first)."""
        for directory in self.directories:
            if not directory.exists():
                continue
            for child in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _remove_one(child)
            _remove_one(directory)


class CgroupTree:
    """The host's cgroup layout under ``root``: v2 when cgroup.controllers is there, else v1."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = Path(root)
        if (self.root / "cgroup.controllers").exists():
            self.version = 2
        elif (self.root / "cpuset" / "cpuset.cpus").exists():
            self.version = 1
        else:
            raise RunError(f"{self.root}: no usable cgroup hierarchy with a cpuset controller")

    def _v1_hierarchy(self, controller: str) -> Path | None:
        for candidate in (controller, f"{controller},cpuacct", f"cpuacct,{controller}"):
            if (self.root / candidate / "cgroup.procs").exists():
                return self.root / candidate
        return None

    def host_cpus(self) -> tuple[int, ...]:
        """The CPUs the root cgroup's tasks may use (on v2 what partition roots left it)."""
        from ..params import parse_cpulist

        top = self.root / "cpuset.cpus.effective" if self.version == 2 else self.root / "cpuset" / "cpuset.cpus"
        return parse_cpulist(top.read_text().strip())

    def remove_stale(self, prefix: str = "rtvirt-") -> list[str]:
        """Remove cgroups left by an rtvirt that was killed (named rtvirt-<pid>-..., that pid gone)."""
        removed = []
        parents = [self.root] if self.version == 2 else [p for p in (self.root / "cpuset", self._v1_hierarchy("cpu"))
                                                          if p is not None]
        for parent in parents:
            for directory in parent.glob(f"{prefix}*"):
                owner = directory.name.removeprefix(prefix).split("-", 1)[0]
                if directory.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    if directory.name.endswith(SHIELD_SUFFIX):
                        _unshield(directory)
                    else:
                        Cgroup([directory]).remove()
                    removed.append(str(directory))
        return removed

    def create(self, name: str, cpus: tuple[int, ...], quota_us: int | None, period_us: int,
               holder: str | None = None) -> Cgroup:
        """``holder``: on v2, controllers this enables in the root's subtree_control are recorded in the ledger
        for it, so they are disabled again when it lets go (else the root keeps them enabled for good)."""
        cpu_list = ",".join(map(str, cpus))
        try:
            if self.version == 2:
                return self._create_v2(name, cpu_list, quota_us, period_us, holder)
            return self._create_v1(name, cpu_list, quota_us, period_us)
        except PermissionError as exc:
            raise PrivilegeError(f"partition: cannot create cgroup {name} ({exc.strerror}); it needs root") from None
        except OSError as exc:
            raise RunError(f"partition: cannot configure cgroup {name}: {exc.filename}: {exc.strerror}") from None

    def _create_v1(self, name: str, cpu_list: str, quota_us: int | None, period_us: int) -> Cgroup:
        cpuset_root = self.root / "cpuset"
        cpuset = cpuset_root / name
        cpuset.mkdir()
        created = Cgroup([cpuset])
        try:
            (cpuset / "cpuset.cpus").write_text(cpu_list)
            # a v1 cpuset accepts no task until it has memory nodes; inherit the parent's
            (cpuset / "cpuset.mems").write_text((cpuset_root / "cpuset.mems").read_text().strip() or "0")
            if quota_us is not None:
                hierarchy = self._v1_hierarchy("cpu")
                if hierarchy is None:
                    raise RunError("partition: a quota needs the cgroup v1 'cpu' controller, which is not mounted")
                cpu = hierarchy / name
                cpu.mkdir()
                created.directories.append(cpu)
                (cpu / "cpu.cfs_period_us").write_text(str(period_us))
                (cpu / "cpu.cfs_quota_us").write_text(str(quota_us))
                if (cpu / "cpu.rt_runtime_us").exists():
                    # with RT group scheduling a child group starts with no real-time budget (SCHED_FIFO is
                    # refused in it); the same quota per period bounds its real-time tasks
                    (cpu / "cpu.rt_period_us").write_text(str(period_us))
                    (cpu / "cpu.rt_runtime_us").write_text(str(quota_us))
        except BaseException:
            created.remove()
            raise
        return created

    def _create_v2(self, name: str, cpu_list: str, quota_us: int | None, period_us: int,
                   holder: str | None) -> Cgroup:
        available = (self.root / "cgroup.controllers").read_text().split()
        wanted = ["cpuset"] + (["cpu"] if quota_us is not None else [])
        missing = [c for c in wanted if c not in available]
        if missing:
            raise RunError(f"partition: cgroup v2 controller(s) {', '.join(missing)} not available at {self.root}")
        enabled = (self.root / "cgroup.subtree_control").read_text().split()
        added = [controller for controller in wanted if controller not in enabled]
        if added:
            control = self.root / "cgroup.subtree_control"
            if holder is None:
                control.write_text(" ".join(f"+{c}" for c in added))
            else:
                Ledger().change(holder, str(control), " ".join(f"+{c}" for c in added),
                                lambda _found: " ".join(f"-{c}" for c in added))
        directory = self.root / name
        directory.mkdir()
        created = Cgroup([directory])
        try:
            (directory / "cpuset.cpus").write_text(cpu_list)
            if quota_us is not None:
                (directory / "cpu.max").write_text(f"{quota_us} {period_us}")
        except BaseException:
            created.remove()
            raise
        return created

    def create_threaded(self, parent: Cgroup, name: str, cpus: tuple[int, ...]) -> Cgroup:
        """A v2 threaded cgroup below ``parent`` (which becomes a thread root): some threads of a process get CPUs
        (and a partition) of their own while its other threads stay in ``parent``."""
        if self.version != 2:
            raise RunError("a threaded cgroup needs cgroup v2")
        top = parent.directories[0]
        directory = top / name
        created = Cgroup([directory])
        try:
            directory.mkdir()
            (directory / "cgroup.type").write_text("threaded")
            if "cpuset" not in (top / "cgroup.subtree_control").read_text().split():
                (top / "cgroup.subtree_control").write_text("+cpuset")
            (directory / "cpuset.cpus").write_text(",".join(map(str, cpus)))
        except OSError as exc:
            created.remove()
            if isinstance(exc, PermissionError):
                raise PrivilegeError(f"cannot create cgroup {directory} ({exc.strerror}); it needs root") from None
            raise RunError(f"cannot configure cgroup {directory}: {exc.filename}: {exc.strerror}") from None
        return created


class Exclusive:
    """Makes a created cpuset an exclusive scheduling domain, and shields its CPUs; ``undo`` puts it all back."""

    def __init__(self, tree: CgroupTree, holder: str, ledger: Ledger | None = None) -> None:
        self.tree, self.holder, self.ledger = tree, holder, ledger or Ledger()
        self.notes: dict[str, Any] = {}
        self._shield: Cgroup | None = None

    def apply(self, cgroup: Cgroup, cpus: tuple[int, ...]) -> None:
        directory = cgroup.directories[0]
        try:
            if self.tree.version == 2:
                self._partition_root(directory, cpus)
            else:
                self._v1_exclusive(directory)
        except PermissionError as exc:
            raise PrivilegeError(f"partition: cannot make {directory} exclusive ({exc.strerror}); it needs root") \
                from None
        except OSError as exc:
            raise RunError(f"partition: cannot make {directory} exclusive: {exc.filename}: {exc.strerror}") from None

    def _v1_exclusive(self, directory: Path) -> None:
        flag = directory / "cpuset.cpu_exclusive"
        try:
            flag.write_text("1")
        except OSError as exc:  # EINVAL: a sibling cpuset (another tool's, another rtvirt's) holds these CPUs too
            if exc.errno != errno.EINVAL:
                raise
            ours = set(_cpus_of(directory))
            holders = [p for p in directory.parent.iterdir() if p.is_dir() and p != directory and
                       set(_cpus_of(p)) & ours]
            busy = [p for p in holders if _holds_tasks(p)]
            if busy:
                self.notes["cpu_exclusive"] = False
                self.notes["warning"] = (f"cpuset {directory.name} is not exclusive: sibling cpuset(s) "
                                         f"{', '.join(p.name for p in busy[:4])} share its CPUs and hold tasks")
            else:
                self._narrow_idle(holders, ours)
                flag.write_text("1")
                self.notes["cpu_exclusive"] = True
        else:
            self.notes["cpu_exclusive"] = True
        # with the root cpuset not load balanced, each load-balanced cpuset below is a scheduling domain
        self.ledger.change(self.holder, str(self.tree.root / "cpuset" / "cpuset.sched_load_balance"), "0")
        self.notes["root_sched_load_balance"] = 0

    def _narrow_idle(self, cpusets: list[Path], cpus: set[int]) -> None:
        """Take ``cpus`` out of sibling cpusets that hold no task (the ``machine`` cpuset libvirtd leaves behind
        when its last domain stops), deepest first as v1 wants a child's CPUs within its parent's; the ledger puts
        them back (parents first) when the partition is undone, or when a killed rtvirt is reclaimed."""
        narrowed = []
        for top in cpusets:
            for cpuset in sorted(_subtree(top), key=lambda p: len(p.parts), reverse=True):
                remaining = ",".join(str(c) for c in _cpus_of(cpuset) if c not in cpus)
                self.ledger.change(self.holder, str(cpuset / "cpuset.cpus"), remaining + "\n")
                narrowed.append(f"{cpuset.relative_to(top.parent)}={remaining or 'none'}")
        self.notes["narrowed_idle_cpusets"] = narrowed

    def _partition_root(self, directory: Path, cpus: tuple[int, ...]) -> None:
        cpu_list = ",".join(map(str, cpus))
        if (directory / "cpuset.cpus.exclusive").exists():  # 6.7+: CPUs claimed for a partition
            (directory / "cpuset.cpus.exclusive").write_text(cpu_list)
        (directory / "cpuset.cpus.partition").write_text("root")
        state = (directory / "cpuset.cpus.partition").read_text().strip()
        if state != "root":  # e.g. "root invalid (Cpu list in cpuset.cpus not exclusive)"
            raise RunError(f"partition: {directory} did not become a partition root: {state[:200]}")
        self.notes["partition"] = state

    def shield(self, name: str, cpus: tuple[int, ...]) -> None:
        """Move every movable task and kernel thread to a cpuset of the other CPUs (cgroup v1)."""
        if self.tree.version == 2:
            self.notes["shield"] = "a v2 partition root already takes its CPUs from every other cgroup"
            return
        root = self.tree.root / "cpuset"
        others = [c for c in _cpus_of(root) if c not in cpus]
        if not others:
            raise RunError("partition: shield needs a CPU outside the partition for everything else")
        self._shield = self.tree.create(name, tuple(others), None, 0)
        target = self._shield.directories[0]
        (target / "cpuset.sched_load_balance").write_text("1")
        moved = unmovable = 0
        # rtvirt itself stays: what it starts (the agent, same-core stressors) must reach the partition's CPUs
        ours = set(os.listdir("/proc/self/task"))
        for pid in (root / "tasks").read_text().split():
            if pid in ours:
                continue
            try:
                (target / "tasks").write_text(pid)
                moved += 1
            except OSError:  # per-CPU kernel threads, tasks that exited meanwhile
                unmovable += 1
        self.notes["shield"] = {"cpus": ",".join(map(str, others)), "moved": moved, "unmovable": unmovable}

    def undo(self) -> None:
        try:
            if self._shield is not None:
                shield, self._shield = self._shield, None
                _unshield(shield.directories[0])
        finally:
            self.ledger.release(self.holder)


def _unshield(directory: Path, rounds: int = 50) -> None:
    """Move every task of the shield cpuset back to the root one (and so to its own affinity), then remove it.

    Tasks the shielded ones fork meanwhile land in the shield too: moved round after round until it is empty."""
    root_tasks = directory.parent / "tasks"
    for _ in range(rounds):
        try:
            tasks = (directory / "tasks").read_text().split()
        except FileNotFoundError:
            return
        for tid in tasks:
            with contextlib.suppress(OSError):  # exited meanwhile
                root_tasks.write_text(tid)
        try:
            directory.rmdir()
            return
        except OSError as exc:
            if exc.errno != 16:  # EBUSY: something was forked into it meanwhile
                raise RunError(f"partition: cannot remove {directory}: {exc.strerror}") from None
            time.sleep(0.05)
    raise RunError(f"partition: {directory} kept filling with tasks; remove it by hand (move its tasks to "
                   f"{root_tasks}, then rmdir)")


def _threaded(directory: Path) -> bool:
    try:
        return (directory / "cgroup.type").read_text().strip() == "threaded"
    except OSError:  # v1, or no longer there
        return False


def _remove_one(directory: Path) -> None:
    # a threaded cgroup takes threads, never whole processes
    members = "cgroup.threads" if _threaded(directory) else "cgroup.procs"
    listed = directory / members
    for task in listed.read_text().split() if listed.exists() else []:
        with contextlib.suppress(OSError):  # the task may have exited meanwhile
            (directory.parent / members).write_text(f"{task}\n")
    try:
        directory.rmdir()
    except OSError as exc:
        if exc.errno == 16:  # EBUSY: a task is still exiting; give it a moment
            time.sleep(0.2)
            directory.rmdir()
        elif directory.exists():
            raise


def _subtree(cpuset: Path) -> list[Path]:
    """A v1 cpuset and every cpuset below it."""
    return [cpuset, *(p for p in cpuset.rglob("*") if p.is_dir())]


def _holds_tasks(cpuset: Path) -> bool:
    """Whether a v1 cpuset or any cpuset below it has a task."""
    return any((p / "tasks").read_text().strip() for p in _subtree(cpuset))


def _cpus_of(directory: Path) -> tuple[int, ...]:
    from ..params import parse_cpulist

    try:
        text = (directory / "cpuset.cpus").read_text().strip()
        return parse_cpulist(text) if text else ()
    except (OSError, ValueError):
        return ()


def reclaim_leftovers() -> list[str]:
    """Cgroups of a killed rtvirt, then the host settings it left changed (root load balancing, tuning)."""
    removed = CgroupTree().remove_stale()
    return removed + [f"{c.path} = {c.value.strip()}" for c in Ledger().reclaim()]
