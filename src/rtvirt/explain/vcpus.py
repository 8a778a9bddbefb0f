"""Which VM each vCPU thread of this rtvirt process belongs to: the environments register their VMs' vCPU threads
as they start them, the VM layer (explain.vm) names a stressor VM's vCPU that took the measured vCPU's pCPU with
its VM. Apart from explain.vm (numpy) so that starting a VM imports none of the explanation."""

from __future__ import annotations

import threading
from collections.abc import Mapping

__all__ = ["forget_vcpus", "register_vcpus", "vcpu_owner"]

# vCPU threads of every VM this rtvirt process started (host tid -> "vCPU 0 of stress-vm-0"): a stressor VM's
# vCPU that takes the measured vCPU's pCPU is named with its VM
_VCPU_OWNERS: dict[int, str] = {}
_OWNERS_LOCK = threading.Lock()


def register_vcpus(vm: str, threads: Mapping[int, int]) -> None:
    """``threads``: vCPU index -> host thread id of the VM labelled ``vm``."""
    with _OWNERS_LOCK:
        for index, tid in threads.items():
            _VCPU_OWNERS[int(tid)] = f"vCPU {int(index)} of VM {vm[:64]}"


def forget_vcpus(threads: Mapping[int, int]) -> None:
    with _OWNERS_LOCK:
        for tid in threads.values():
            _VCPU_OWNERS.pop(int(tid), None)


def vcpu_owner(tid: int) -> str | None:
    with _OWNERS_LOCK:
        return _VCPU_OWNERS.get(tid)
