"""partition: the workload in a cgroup with its own cpuset, an optional CPU bandwidth limit and a policy.

Works on cgroup v1 (one hierarchy per controller: cpuset/, cpu/) and on cgroup v2 (one unified tree,
controllers enabled through cgroup.subtree_control); :class:`CgroupTree` hides the difference. The agent
joins the cgroup between fork and exec, so not one instruction of it runs outside the partition.
The bandwidth limit (quota per period) throttles SCHED_OTHER tasks (CFS bandwidth); on v1 kernels with
RT group scheduling it is also the group's real-time budget (cpu.rt_runtime_us), without which SCHED_FIFO
tasks are refused in the group. On v2 real-time tasks are bounded by the global RT throttling only.

An exclusive partition (``exclusive``, on by default for SCHED_DEADLINE, which the kernel admits for a pinned
thread only when its CPUs are a root domain of their own) is made as the kernel recognises one: on v1 the cpuset
gets cpuset.cpu_exclusive and the root cpuset's sched_load_balance goes to 0, so the load-balanced cpusets become
the scheduling domains; on v2 the cgroup becomes a cpuset partition root (cpuset.cpus.partition = root), which
also takes its CPUs away from every other cgroup. ``shield`` does on v1 what ``cset shield`` does: every movable
task and kernel thread goes to a housekeeping cpuset on the other CPUs for the run. Every host setting changed
goes through the settings ledger (rtvirt.host.ledger), so it is put back at close, and after a kill -9 by the
next campaign's reclaim.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ..agents import agent_path
from ..errors import InputError, PrivilegeError, RunError
from ..host.ledger import Ledger, process_holder
from ..host.profiles import ProfileName
from ..units import duration_field
from .base import Environment, EnvironmentConfig, Launched
from .sched import SchedPolicy, apply_policy, thread_ids

__all__ = ["PartitionConfig", "PartitionEnvironment", "CgroupTree", "Cgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
SHIELD_SUFFIX = "-shield"


class PartitionConfig(EnvironmentConfig):
    kind: Literal["partition"] = "partition"
    quota: duration_field("us") | None = Field(  # type: ignore[valid-type]
        None, description="CPU time the partition may use per period (bare numbers in us); none = unlimited")
    period: duration_field("us") = Field(100_000_000, ge=1_000_000, le=1_000_000_000,  # type: ignore[valid-type]
                                         description="bandwidth period (bare numbers in us)")
    sched: SchedPolicy = Field(default_factory=lambda: SchedPolicy(policy="fifo", priority=99),
                               description="scheduling policy of the workload's threads")
    exclusive: bool | None = Field(None, description="an exclusive cpuset that is a scheduling domain of its own "
                                   "(v2: a partition root); default: when the policy needs it (deadline)")
    shield: bool = Field(False, description="move every movable task and kernel thread off the partition's CPUs "
                         "for the run (cgroup v1; v2 partition roots do it themselves)")
    tune: ProfileName | None = Field(None, description="a host tuning profile (rtvirt host tune) applied for this "
                             "environment's runs, restored after each")


    @model_validator(mode="after")
    def _quota_fits_period(self) -> PartitionConfig:
        if self.quota is not None and self.quota < 1_000_000:
            raise ValueError("quota must be at least 1ms")
        if (self.exclusive or self.shield) and not self.pin:
            raise ValueError("exclusive and shield need pin = true (a partition of the measured CPUs)")
        return self

    @property
    def wants_exclusive(self) -> bool:
        return self.sched.policy == "deadline" if self.exclusive is None else self.exclusive


class Cgroup:
    """One created cgroup: the directories it spans (one per v1 hierarchy, or one v2 directory)."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories

    def join(self, pid: int) -> None:
        for directory in self.directories:
            (directory / "cgroup.procs").write_text(f"{pid}\n")

    def remove(self) -> None:
        """Move leftover tasks to the parent, then remove the directories (deepest first)."""
        for directory in self.directories:
            if not directory.exists():
                continue
            procs = directory / "cgroup.procs"
            leftovers = procs.read_text().split() if procs.exists() else []
            for pid in leftovers:
                with contextlib.suppress(OSError):  # the task may have exited meanwhile
                    (directory.parent / "cgroup.procs").write_text(f"{pid}\n")
            try:
                directory.rmdir()
            except OSError as exc:
                if exc.errno == 16:  # EBUSY: a task is still exiting; give it a moment
                    time.sleep(0.2)
                    directory.rmdir()
                elif directory.exists():
                    raise


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

    def create(self, name: str, cpus: tuple[int, ...], quota_us: int | None, period_us: int) -> Cgroup:
        cpu_list = ",".join(map(str, cpus))
        try:
            if self.version == 2:
                return self._create_v2(name, cpu_list, quota_us, period_us)
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

    def _create_v2(self, name: str, cpu_list: str, quota_us: int | None, period_us: int) -> Cgroup:
        available = (self.root / "cgroup.controllers").read_text().split()
        wanted = ["cpuset"] + (["cpu"] if quota_us is not None else [])
        missing = [c for c in wanted if c not in available]
        if missing:
            raise RunError(f"partition: cgroup v2 controller(s) {', '.join(missing)} not available at {self.root}")
        enabled = (self.root / "cgroup.subtree_control").read_text().split()
        for controller in wanted:
            if controller not in enabled:
                (self.root / "cgroup.subtree_control").write_text(f"+{controller}")
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
        try:
            (directory / "cpuset.cpu_exclusive").write_text("1")
            self.notes["cpu_exclusive"] = True
        except OSError as exc:  # EINVAL: a sibling cpuset (another tool's, another rtvirt's) holds these CPUs too
            if exc.errno != 22:
                raise
            holders = [p.name for p in directory.parent.iterdir() if p.is_dir() and p != directory
                       and set(_cpus_of(p)) & set(_cpus_of(directory))]
            self.notes["cpu_exclusive"] = False
            self.notes["warning"] = (f"cpuset {directory.name} is not exclusive: sibling cpuset(s) "
                                     f"{', '.join(holders[:4]) or '?'} share its CPUs")
        # with the root cpuset not load balanced, each load-balanced cpuset below is a scheduling domain
        self.ledger.change(self.holder, str(self.tree.root / "cpuset" / "cpuset.sched_load_balance"), "0")
        self.notes["root_sched_load_balance"] = 0

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


def _cpus_of(directory: Path) -> tuple[int, ...]:
    from ..params import parse_cpulist

    try:
        text = (directory / "cpuset.cpus").read_text().strip()
        return parse_cpulist(text) if text else ()
    except (OSError, ValueError):
        return ()


class PartitionEnvironment(Environment):
    kind = "partition"
    config_model = PartitionConfig
    config: PartitionConfig

    def __init__(self, *args: Any, cgroup_root: Path = CGROUP_ROOT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cgroup_root = cgroup_root
        self._cgroup: Cgroup | None = None
        self._tree: CgroupTree | None = None
        self._placed: set[int] = set()
        self._exclusive: Exclusive | None = None
        self._holder = process_holder(f"partition-{secrets.token_hex(3)}")
        # fixed before a shield moves this process (and its affinity) off the partition's CPUs
        self._platform = tuple(sorted(os.sched_getaffinity(0)))
        self._measured: tuple[int, ...] | None = None
        self._tuning: dict[str, Any] | None = None
        self._tuned: Any = None  # the TuneResult: what it holds open is let go at close

    @staticmethod
    def available() -> str | None:
        try:
            CgroupTree()
        except RunError as exc:
            return str(exc)
        return None if os.geteuid() == 0 else "partition needs root to create cgroups"

    def measured_cpus(self) -> tuple[int, ...]:
        if self._measured is None:
            self._measured = super().measured_cpus()
        return self._measured

    def platform_cpus(self) -> tuple[int, ...]:
        return self._platform

    @classmethod
    def reclaim(cls, config: Any, shared: Any) -> list[str]:
        """Cgroups of a killed rtvirt, then the host settings it left changed (root load balancing, tuning)."""
        removed = CgroupTree().remove_stale()
        return removed + [f"{c.path} = {c.value.strip()}" for c in Ledger().reclaim()]

    def start(self) -> None:
        self._tree = CgroupTree(self._cgroup_root)
        self._tree.remove_stale()
        Ledger().reclaim()
        name = f"rtvirt-{os.getpid()}-{secrets.token_hex(3)}"
        quota = None if self.config.quota is None else max(1000, self.config.quota // 1000)
        cpus = self.measured_cpus()
        if self.config.tune is not None:
            self._tune(cpus)
        self._cgroup = self._tree.create(name, cpus, quota, self.config.period // 1000)
        if self.config.wants_exclusive or self.config.shield:
            self._exclusive = Exclusive(self._tree, self._holder)
            if self.config.shield:
                self._exclusive.shield(name + SHIELD_SUFFIX, cpus)
            self._exclusive.apply(self._cgroup, cpus)

    def _tune(self, cpus: tuple[int, ...]) -> None:
        from ..host import checklist_summary, host_context, profile_named, tune_host

        assert self.config.tune is not None
        try:
            result = tune_host(host_context(cpus), profile_named(self.config.tune, "tune"), self._holder)
        except InputError as exc:
            raise RunError(f"partition: {exc}") from None
        self._tuned = result
        self._tuning = {"profile": self.config.tune,
                        "applied": [s.path for s in result.steps if s.outcome == "applied"],
                        "failed": [f"{s.path}: {s.error}" for s in result.steps if s.outcome == "failed"],
                        "checklist": checklist_summary(result.after, self.config.tune)}

    def probe_overrides(self) -> dict[str, Any]:
        # the agent sets SCHED_FIFO itself; other policies start it at SCHED_OTHER (priority 0)
        priority = self.config.sched.priority if self.config.sched.policy == "fifo" else 0
        return {**super().probe_overrides(), "priority": priority}

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        if self._cgroup is None:
            self.start()
        assert self._cgroup is not None
        cgroup = self._cgroup
        argv = [str(agent_path(agent)), *args]
        if out is not None:
            argv.append(f"--out={out}")
        proc = self.supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     before_exec=lambda: cgroup.join(os.getpid()))
        return Launched(proc, out)

    def after_launch(self, launched: Launched) -> None:
        # SCHED_DEADLINE cannot be inherited through thread creation, so it is set on each worker thread
        # (every thread but the main one) once the agent has made them.
        if self.config.sched.policy != "deadline":
            return
        pid = launched.proc.pid  # type: ignore[union-attr]  # this environment launches local processes
        for tid in thread_ids(pid):
            if tid != pid and tid not in self._placed:
                apply_policy(tid, self.config.sched)
                self._placed.add(tid)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "cgroup_version": self._tree.version if self._tree else None,
                "cgroup": [str(d) for d in self._cgroup.directories] if self._cgroup else None,
                **({"exclusive_cpuset": self._exclusive.notes} if self._exclusive else {}),
                **({"tuning": self._tuning, "checklist": self._tuning["checklist"]} if self._tuning else {})}

    def warnings(self) -> list[str]:
        notes = self._exclusive.notes if self._exclusive else {}
        return [notes["warning"]] if "warning" in notes else []

    def close(self) -> None:
        try:
            if self._cgroup is not None:
                cgroup, self._cgroup = self._cgroup, None
                cgroup.remove()
        finally:
            try:
                if self._exclusive is not None:
                    exclusive, self._exclusive = self._exclusive, None
                    exclusive.undo()
            finally:
                if self._tuned is not None:
                    self._tuned.release()
                Ledger().release(self._holder)  # this environment's tuning (and anything else it held)
                super().close()
