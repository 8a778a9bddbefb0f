"""partition: the workload in a cgroup with its own cpuset, an optional CPU bandwidth limit and a policy.

Works on cgroup v1 (one hierarchy per controller: cpuset/, cpu/) and on cgroup v2 (one unified tree,
controllers enabled through cgroup.subtree_control); :class:`CgroupTree` hides the difference. The agent
joins the cgroup between fork and exec, so not one instruction of it runs outside the partition.
The bandwidth limit (quota per period) throttles SCHED_OTHER tasks (CFS bandwidth); on v1 kernels with
RT group scheduling it is also the group's real-time budget (cpu.rt_runtime_us), without which SCHED_FIFO
tasks are refused in the group. On v2 real-time tasks are bounded by the global RT throttling only.
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
from ..errors import PrivilegeError, RunError
from ..units import duration_field
from .base import Environment, EnvironmentConfig, Launched
from .qemu import qemu_stressor_guest
from .sched import SchedPolicy, apply_policy, thread_ids

__all__ = ["PartitionConfig", "PartitionEnvironment", "CgroupTree", "Cgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


class PartitionConfig(EnvironmentConfig):
    kind: Literal["partition"] = "partition"
    quota: duration_field("us") | None = Field(  # type: ignore[valid-type]
        None, description="CPU time the partition may use per period (bare numbers in us); none = unlimited")
    period: duration_field("us") = Field(100_000_000, ge=1_000_000, le=1_000_000_000,  # type: ignore[valid-type]
                                         description="bandwidth period (bare numbers in us)")
    sched: SchedPolicy = Field(default_factory=lambda: SchedPolicy(policy="fifo", priority=99),
                               description="scheduling policy of the workload's threads")

    @model_validator(mode="after")
    def _quota_fits_period(self) -> PartitionConfig:
        if self.quota is not None and self.quota < 1_000_000:
            raise ValueError("quota must be at least 1ms")
        return self


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

    @staticmethod
    def available() -> str | None:
        try:
            CgroupTree()
        except RunError as exc:
            return str(exc)
        return None if os.geteuid() == 0 else "partition needs root to create cgroups"

    def start(self) -> None:
        self._tree = CgroupTree(self._cgroup_root)
        self._tree.remove_stale()
        name = f"rtvirt-{os.getpid()}-{secrets.token_hex(3)}"
        quota = None if self.config.quota is None else max(1000, self.config.quota // 1000)
        self._cgroup = self._tree.create(name, self.measured_cpus(), quota, self.config.period // 1000)

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

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        return qemu_stressor_guest(self, index, host_cpus, guest)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "cgroup_version": self._tree.version if self._tree else None,
                "cgroup": [str(d) for d in self._cgroup.directories] if self._cgroup else None}

    def close(self) -> None:
        if self._cgroup is not None:
            cgroup, self._cgroup = self._cgroup, None
            cgroup.remove()
        super().close()
