"""Configuration to apply a design: Xen ``xl`` commands, a KVM/Linux shell script, libvirt ``<cputune>`` XML,
an rtvirt scenario that measures the designed system, and the designed model itself (for ``rtvirt sim``).

Everything here is text for people to review and run; names come from the model (validated to
``[A-Za-z0-9_.-]``) and are still quoted for the shell (shlex) and escaped for XML (ElementTree).
"""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from typing import Any

import tomli_w

from ..model.schema import Model
from .design import DESIGNABLE, Design, VcpuDesign

__all__ = ["xen_commands", "kvm_script", "libvirt_cputune", "scenario_toml", "model_toml", "FIFO_TOP_PRIORITY"]

FIFO_TOP_PRIORITY = 90  # below 99 so the kernel's own RT threads (migration, watchdog) keep precedence


def _us(ns: int) -> int:
    return -(-ns // 1000)


def _fifo_priority(vcpu: VcpuDesign, design: Design) -> int:
    top = max((v.priority for v in design.vcpus), default=0)
    return max(1, FIFO_TOP_PRIORITY - (top - vcpu.priority)) if vcpu.realtime else 1


def xen_commands(design: Design) -> str:
    scheduler = DESIGNABLE[design.label][0]
    cpus = sorted({v.cpu for v in design.vcpus})
    xen_sched = {"rtds": "rtds", "arinc653": "arinc653", "partitioned": "null", "sedf": "sedf",
                 "sedf-prime": "sedf"}.get(scheduler)
    lines = [f"# rtvirt design for Xen, scheduler {design.label}: review, then run in dom0",
             "set -eu"]
    if xen_sched is None:
        lines.append(f"# {design.label} is not an upstream Xen scheduler (RT-Xen / the automotive study's patch);"
                     " the parameters below are for that patched hypervisor")
    else:
        pool = f"rtvirt-{xen_sched}"
        if 0 in cpus:
            lines.append("# pCPU 0 stays in Pool-0 for dom0: move the design's pCPU 0 work to another pCPU first")
        movable = [cpu for cpu in cpus if cpu != 0]
        for cpu in movable:
            lines.append(f"xl cpupool-cpu-remove Pool-0 {cpu}")
        if movable:
            cpu_list = ",".join(f'"{cpu}"' for cpu in movable)
            lines.append("xl cpupool-create " + " ".join(shlex.quote(item) for item in
                                                         (f'name="{pool}"', f'sched="{xen_sched}"',
                                                          f"cpus=[{cpu_list}]")))
        for vm in sorted({v.vm for v in design.vcpus}):
            lines.append(f"xl cpupool-migrate {shlex.quote(vm)} {shlex.quote(pool)}")
    for v in design.vcpus:
        vm = shlex.quote(v.vm)
        lines.append(f"xl vcpu-pin {vm} {v.vcpu} {v.cpu}")
        if v.budget is None or v.period is None:
            continue
        if scheduler == "rtds":
            extra = " -e 1" if not v.realtime else ""
            lines.append(f"xl sched-rtds -d {vm} -v {v.vcpu} -p {_us(v.period)} -b {_us(v.budget)}{extra}")
        elif scheduler in ("sedf", "sedf-prime"):
            lines.append(f"xl sched-sedf -d {vm} -p {v.period / 1e6:g} -s {v.budget / 1e6:g}  # Xen <= 4.5, ms")
        elif scheduler in ("fifo", "psedf"):
            lines.append(f"# {v.vm} vCPU {v.vcpu}: priority {v.priority}, budget {_us(v.budget)} us "
                         f"every {_us(v.period)} us{' (real-time domain)' if v.realtime else ''}")
        elif scheduler == "arinc653" and v.window is not None:
            lines.append(f"# ARINC 653 window for {v.vm} vCPU {v.vcpu}: [{_us(v.window[0])}, {_us(v.window[1])}) us "
                         f"of a {_us(v.period)} us major frame (load with the arinc653 schedule tool)")
    return "\n".join(lines) + "\n"


_VCPU_TID = '''vcpu_tid() {  # VM name, vCPU index -> the QEMU thread "CPU n/KVM" of the guest started with -name NAME
    pid=$(pgrep -f -- "-name $1" | head -n 1)
    [ -n "$pid" ] || { echo "VM $1 is not running" >&2; exit 1; }
    for task in /proc/"$pid"/task/*; do
        if [ "$(cat "$task"/comm)" = "CPU $2/KVM" ]; then basename "$task"; return; fi
    done
    echo "vCPU $2 of $1 not found (start QEMU with -name $1,debug-threads=on)" >&2
    exit 1
}'''


def kvm_script(design: Design) -> str:
    """Pin every vCPU thread and give it the designed host policy (SCHED_DEADLINE or SCHED_FIFO + quota)."""
    scheduler = DESIGNABLE[design.label][0]
    lines = ["#!/bin/sh", f"# rtvirt design for KVM/Linux, scheduler {design.label}: review, then run as root",
             "set -eu", _VCPU_TID]
    quota: dict[str, list[VcpuDesign]] = {}
    if scheduler == "deadline":
        lines.append("# SCHED_DEADLINE refuses threads pinned to part of their root domain: give each pCPU its own "
                     "root domain (cgroup v2 cpuset partition, or isolcpus) before pinning")
    for v in design.vcpus:
        thread = f'"$(vcpu_tid {shlex.quote(v.vm)} {v.vcpu})"'
        lines.append(f"taskset -pc {v.cpu} {thread}")
        if scheduler == "deadline" and v.budget and v.period:
            lines.append(f"chrt --deadline --sched-runtime {v.budget} --sched-deadline {v.period} "
                         f"--sched-period {v.period} -p 0 {thread}")
        elif scheduler in ("fifo", "psedf") and v.realtime:
            lines.append(f"chrt -f -p {_fifo_priority(v, design)} {thread}")
            if v.budget and v.period:
                quota.setdefault(v.vm, []).append(v)
        elif scheduler not in ("partitioned", "deadline"):
            lines.append(f"# {design.label} has no Linux equivalent for {v.vm} vCPU {v.vcpu}; "
                         "use the deadline or fifo design on KVM")
    for vm, vcpus in quota.items():
        period = vcpus[0].period or 0
        budget = sum(v.budget or 0 for v in vcpus if v.period == period)
        group = f"${{RTVIRT_CGROUP:-/sys/fs/cgroup/rtvirt}}/{vm}"
        lines += [f'mkdir -p "{group}"',
                  f'echo "{_us(budget)} {_us(period)}" > "{group}/cpu.max"  # cgroup v2 quota per period, us',
                  f'pgrep -f -- {shlex.quote("-name " + vm)} | head -n 1 > "{group}/cgroup.procs"']
    return "\n".join(lines) + "\n"


LIBVIRT_MIN_PERIOD_US = 1000


def libvirt_cputune(design: Design, vm: str) -> str:
    """A ``<cputune>`` element for one VM's libvirt domain XML."""
    scheduler = DESIGNABLE[design.label][0]
    root = ET.Element("cputune")
    mine = [v for v in design.vcpus if v.vm == vm]
    for v in mine:
        ET.SubElement(root, "vcpupin", vcpu=str(v.vcpu), cpuset=str(v.cpu))
    realtime_cpus = {v.cpu for v in design.vcpus if v.realtime}
    all_cpus = {v.cpu for v in design.vcpus}
    spare = sorted(all_cpus - realtime_cpus)
    if spare:
        ET.SubElement(root, "emulatorpin", cpuset=",".join(str(cpu) for cpu in spare))
    budgets = [v for v in mine if v.budget and v.period and v.realtime]
    if budgets and scheduler in ("fifo", "psedf", "rtds", "sedf", "sedf-prime"):
        # libvirt applies one period/quota to every vCPU of the domain: take the tightest vCPU's.
        tightest = min(budgets, key=lambda v: v.period or 0)
        if _us(tightest.period or 0) >= LIBVIRT_MIN_PERIOD_US:
            ET.SubElement(root, "vcpu_period").text = str(_us(tightest.period or 0))
            ET.SubElement(root, "vcpu_quota").text = str(_us(tightest.budget or 0))
        else:  # libvirt silently drops a period below its minimum: say so where the user looks
            root.append(ET.Comment(f" the designed period {_us(tightest.period or 0)}us is below libvirt's "
                                   f"vcpu_period minimum ({LIBVIRT_MIN_PERIOD_US}us): no CFS quota is set "))
    for v in mine:
        if scheduler in ("fifo", "psedf") and v.realtime:
            ET.SubElement(root, "vcpusched", vcpus=str(v.vcpu), scheduler="fifo",
                          priority=str(_fifo_priority(v, design)))
    if scheduler == "deadline":
        root.append(ET.Comment(" libvirt has no SCHED_DEADLINE vcpusched: apply the kvm script's chrt lines "))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def _durations_as_ns(python: Any, dumped: Any) -> Any:
    """The model as TOML-ready data with every duration exact ("NNNns"); None values dropped."""
    if isinstance(python, dict):
        return {key: _durations_as_ns(value, dumped[key]) for key, value in python.items() if value is not None}
    if isinstance(python, (list, tuple)):
        return [_durations_as_ns(value, other) for value, other in zip(python, dumped, strict=True)]
    if isinstance(python, int) and not isinstance(python, bool) and isinstance(dumped, str):
        return f"{python}ns"
    return python


def model_toml(model: Model) -> str:
    data = _durations_as_ns(model.model_dump(mode="python"), model.model_dump(mode="json"))
    return tomli_w.dumps(data)


def scenario_toml(design: Design, model: Model, duration: str = "60s", kind: str = "qemu") -> str:
    """A scenario (docs/scenarios.md) that measures the tightest VM of the design, solo and next to a
    same-core interferer, so the predicted bound can be compared with a measurement: in a QEMU guest
    (``kind`` "qemu"), or as a libvirt domain carrying the design's own ``<cputune>`` ("libvirt")."""
    realtime = [v for v in design.vcpus if v.realtime]
    if not realtime:
        raise ValueError("the design has no real-time vCPU to measure")
    chain_period = {stage: chain.period for chain in model.chain for stage in chain.stages}
    periods: dict[str, int] = {}
    for vm in model.vm:
        for task in vm.task:
            period = task.period or task.min_interarrival or chain_period.get(f"{vm.name}/{task.name}")
            if period:
                periods[vm.name] = min(periods.get(vm.name, period), period)
    chosen = min(realtime, key=lambda v: (v.period or 1 << 62, v.vm)).vm
    vcpus = sorted((v for v in design.vcpus if v.vm == chosen), key=lambda v: v.vcpu)
    scheduler = DESIGNABLE[design.label][0]
    first = vcpus[0]
    environment: dict[str, Any] = {"kind": "qemu", "name": chosen, "vcpus": len(vcpus), "cpus": [v.cpu for v in vcpus]}
    if kind == "libvirt":
        if scheduler == "deadline":
            raise ValueError("libvirt has no SCHED_DEADLINE vcpusched: measure a deadline design with kind qemu")
        environment = {"kind": "libvirt", "name": chosen, "vcpus": max(v.vcpu for v in vcpus) + 1,
                       "cputune": libvirt_cputune(design, chosen)}
    elif scheduler == "deadline" and first.budget and first.period:
        # The kernel refuses SCHED_DEADLINE for threads pinned to part of their root domain.
        environment |= {"pin": False, "vcpu_sched": {"policy": "deadline", "runtime": f"{first.budget}ns",
                                                     "period": f"{first.period}ns"}}
    else:
        environment["vcpu_sched"] = {"policy": "fifo", "priority": _fifo_priority(first, design)}
    interval = periods.get(chosen, 1_000_000)
    document = {
        "name": f"design-{design.label}-{chosen}"[:64],
        "description": f"measures {chosen} as designed by rtvirt design ({design.label}) for model {model.name}",
        "duration": duration,
        "workload": {"probe": "timer", "params": {"interval": f"{interval}ns", "threads": 1}},
        "environments": [environment],
        "disturbances": [
            {"name": "solo"},
            {"name": "same-core", "stressors": [{"stressor": "cpu", "where": "same-core"}]},
        ],
    }
    return tomli_w.dumps(document)
