"""Pinned SCHED_DEADLINE vCPUs on this machine: an exclusive cpuset of their own (the kernel admits a pinned
deadline thread only in a root domain of its CPUs), made for one QEMU and removed with it."""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

from ...errors import RunError
from ...host.checks.base import cpu_list
from ...host.ledger import process_holder
from ..sched import SchedPolicy, apply_policy

__all__ = ["DeadlineCpuset", "apply_once_moved"]


def apply_once_moved(tid: int, policy: SchedPolicy, timeout_s: float = 5.0) -> None:
    """SCHED_DEADLINE for a vCPU thread just moved into its exclusive cpuset: the kernel checks the root domain of
    the CPU the thread last ran on, so the policy is refused (EPERM) until the thread has run on its new CPU."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            apply_policy(tid, policy)
            return
        except RunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class DeadlineCpuset:
    """The exclusive cpuset of one QEMU's pinned SCHED_DEADLINE vCPUs (``label``: its environment's, for
    messages); ``remove`` undoes whatever ``partition`` did, also after it failed half-way."""

    def __init__(self, label: str) -> None:
        from ..cgroups import CgroupTree, Exclusive

        self.label = label
        self.tree = CgroupTree()
        self.exclusive = Exclusive(self.tree, process_holder(f"qemu-{secrets.token_hex(3)}"))
        self.cgroups: list[Any] = []

    @property
    def notes(self) -> dict[str, Any]:
        return self.exclusive.notes  # type: ignore[no-any-return]

    def partition(self, cpus: list[int], vcpu_threads: list[int], qemu_pid: int, emulator: tuple[int, ...]) -> None:
        """The vCPUs' host CPUs become an exclusive cpuset, a root domain of their own, and the vCPU threads move
        into it, one by one.

        cgroup v1: a cpuset of the vCPUs' CPUs, exclusive, with the root's load balancing off. cgroup v2 moves
        threads only within a threaded subtree, and (before Linux 6.7) a partition root's parent must be one too:
        QEMU's process goes into a partition root of its emulator and vCPU CPUs, its vCPU threads into a threaded
        partition root below it, and the emulator threads keep the rest."""
        tree, exclusive = self.tree, self.exclusive
        name = f"rtvirt-{os.getpid()}-{secrets.token_hex(3)}"
        if tree.version == 1:
            vcpus = tree.create(f"{name}-vcpus", tuple(cpus), None, 0)
            self.cgroups.append(vcpus)
        else:
            host = tree.host_cpus()
            if set(emulator) & set(cpus) or not set(host) - set(emulator) - set(cpus):
                raise RunError(
                    f"{self.label}: pinned SCHED_DEADLINE vCPUs on cgroup v2 need a partition of QEMU's CPUs "
                    f"(vCPUs {cpu_list(cpus)}, emulator_cpus {cpu_list(emulator)}, which must differ) that leaves "
                    f"the host CPUs of its own (host: {cpu_list(host)}); choose cpus and emulator_cpus so, "
                    "or use pin = false")
            owned = tuple(sorted({*emulator, *cpus}))
            process = tree.create(f"{name}-qemu", owned, None, 0, holder=exclusive.holder)
            self.cgroups.append(process)
            exclusive.apply(process, owned)
            exclusive.notes["process_partition"] = exclusive.notes.pop("partition")
            try:
                process.join(qemu_pid)
            except OSError as exc:
                raise RunError(f"{self.label}: cannot move QEMU into {process.directories[0]}: "
                               f"{exc.strerror}") from None
            vcpus = tree.create_threaded(process, "vcpus", tuple(cpus))
            self.cgroups.append(vcpus)
        exclusive.apply(vcpus, tuple(cpus))
        try:
            for tid in vcpu_threads:
                vcpus.join_thread(tid)
        except OSError as exc:
            raise RunError(f"{self.label}: cannot move the vCPU threads into {vcpus.directories[0]}: "
                           f"{exc.strerror}") from None

    def remove(self) -> None:
        try:
            for cgroup in reversed(self.cgroups):  # a v2 vCPU cgroup lies inside the process's
                cgroup.remove()
        finally:
            self.cgroups.clear()
            self.exclusive.undo()
