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

import os
import secrets
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from ..agents import agent_path
from ..errors import InputError, RunError
from ..host.ledger import Ledger, process_holder
from ..host.profiles import ProfileName
from ..units import duration_field
from .base import Environment, EnvironmentConfig, Launched
from .cgroups import CGROUP_ROOT, SHIELD_SUFFIX, Cgroup, CgroupTree, Exclusive, reclaim_leftovers
from .qemu import qemu_stressor_guest
from .sched import SchedPolicy, apply_policy, thread_ids

if TYPE_CHECKING:
    from ..explain.config import ExplainConfig
    from ..explain.model import TraceSource

__all__ = ["PartitionConfig", "PartitionEnvironment", "CgroupTree", "Cgroup", "Exclusive"]



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
        """An unpinned workload spans the whole root domain already: only pinned deadline ones need their own."""
        return self.pin and self.sched.policy == "deadline" if self.exclusive is None else self.exclusive


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
        return reclaim_leftovers()

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

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        return qemu_stressor_guest(self, index, host_cpus, guest)

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        from ..explain.sources import host_sources

        return host_sources(self.measured_cpus(), config)

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
