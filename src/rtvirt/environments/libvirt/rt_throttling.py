"""Real-time vCPUs under cgroup v1 RT group scheduling: lifting kernel.sched_rt_runtime_us for a campaign,
restoring it, and saying why libvirt was refused a real-time vcpusched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...fileio import write_atomically
from ...procs import process_start_time
from ..guest_image import cache_dir
from .host import _v1_cpu_controller

RT_SYSCTL = Path("/proc/sys/kernel/sched_rt_runtime_us")
RT_RECORD = "libvirt-rt-throttling.json"  # under cache_dir(): what to restore after a kill -9
RT_REFUSED = "Cannot set scheduler parameters"  # libvirt's message when vcpusched is refused


def _rt_sysctl() -> int | None:
    try:
        return int(RT_SYSCTL.read_text().strip())
    except (OSError, ValueError):
        return None

class RtThrottlingLifted:
    """kernel.sched_rt_runtime_us = -1 for a campaign, restored at its end (and by reclaim after a kill -9).

    Under cgroup v1 RT group scheduling the kernel refuses SCHED_FIFO/RR to a thread whose cgroup has
    cpu.rt_runtime_us = 0, and libvirt creates each domain's cgroups (machine/qemu-N-NAME.libvirt-qemu/vcpuN)
    with exactly that at start, so no budget given beforehand can reach them. With throttling lifted the
    kernel does not check group budgets at all; it also drops the 5% of CPU time real-time threads leave to
    others, which is why it is recorded in the manifest and undone afterwards.
    """

    def __init__(self) -> None:
        self.was = _rt_sysctl()
        self._record = cache_dir() / RT_RECORD
        if self.was is None or self.was < 0:
            self.changed = False
            return
        write_atomically(self._record, json.dumps({"was": self.was, "pid": os.getpid(),
                                                   "started": process_start_time(os.getpid())}))
        RT_SYSCTL.write_text("-1\n")
        self.changed = True

    def describe(self) -> dict[str, Any]:
        return {"kernel.sched_rt_runtime_us": {"before": self.was, "during": -1 if self.changed else self.was},
                "why": "cgroup v1 RT group scheduling gives libvirt's new vCPU cgroups cpu.rt_runtime_us = 0"}

    def close(self) -> None:
        if self.changed:
            RT_SYSCTL.write_text(f"{self.was}\n")
            self._record.unlink(missing_ok=True)
            self.changed = False

    @staticmethod
    def restore_after_kill() -> str | None:
        """Undo the lift of a killed rtvirt (its record names a process that is gone); what was done."""
        record = cache_dir() / RT_RECORD
        try:
            data = json.loads(record.read_text()[:4096])
            was, pid, started = int(data["was"]), int(data["pid"]), str(data["started"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if started and process_start_time(pid) == started:
            return None  # its campaign still runs
        RT_SYSCTL.write_text(f"{was}\n")
        record.unlink(missing_ok=True)
        return f"kernel.sched_rt_runtime_us = {was} (lifted by a killed campaign)"

def _rt_refusal_diagnosis(uri: str, local: bool) -> str:
    """Why libvirt could not give the vCPUs a real-time policy, and how to fix it on the host."""
    fixes = ("fix it on the host with `sysctl -w kernel.sched_rt_runtime_us=-1` (lifts RT throttling, which "
             "rtvirt does itself as root on a local URI unless rt_throttling = \"keep\"), or remove \"cpu\" "
             "from cgroup_controllers in /etc/libvirt/qemu.conf and restart libvirtd")
    mount = _v1_cpu_controller() if local else None
    if mount is None:
        return (f"libvirt ({uri}) was refused a real-time vcpusched (EPERM): where cgroup v1 RT group "
                f"scheduling is on, libvirt's new vCPU cgroups get cpu.rt_runtime_us = 0; {fixes}")
    machine = mount / "machine" / "cpu.rt_runtime_us"
    try:
        machine_value = machine.read_text().strip()[:20]
    except OSError:
        machine_value = "missing"
    return (f"libvirt ({uri}) was refused a real-time vcpusched (EPERM): cgroup v1 RT group scheduling is on "
            f"({mount}/cpu.rt_runtime_us exists; {machine} = {machine_value}) and libvirt creates each "
            f"domain's vcpuN cgroup under {mount}/machine with cpu.rt_runtime_us = 0, which forbids SCHED_FIFO/RR "
            f"there; kernel.sched_rt_runtime_us = {_rt_sysctl()}; {fixes}")
