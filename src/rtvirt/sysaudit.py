"""System audit: the host settings that change latency results, recorded in every manifest.

Everything read here comes from files a misconfigured or hostile system controls: each value is
bounded in length, and an unreadable file is recorded as None rather than failing the run.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["audit_system", "MAX_VALUE"]

MAX_VALUE = 512


def _read(path: str | Path, limit: int = MAX_VALUE) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace").strip()
    except OSError:
        return None


def _cmdline_value(cmdline: str, key: str) -> str | None:
    for token in cmdline.split():
        if token == key or token.startswith(key + "="):
            return token.partition("=")[2][:MAX_VALUE] or "on"
    return None


def _preemption(version: str) -> str:
    if _read("/sys/kernel/realtime") == "1" or "PREEMPT_RT" in version:
        return "PREEMPT_RT"
    mode = _read("/sys/kernel/debug/sched/preempt")
    if mode:  # e.g. "none voluntary (full)": the bracketed one is active
        active = re.search(r"\((\w+)\)", mode)
        if active:
            return f"PREEMPT_DYNAMIC ({active.group(1)})"
    for model in ("PREEMPT_DYNAMIC", "PREEMPT", "PREEMPT_VOLUNTARY"):
        if model in version.split():
            return model
    return "none (server)"


def _cpu_values(pattern: str, cpus: list[int]) -> dict[str, str | None]:
    return {str(cpu): _read(pattern.format(cpu=cpu)) for cpu in cpus}


def _idle_states(cpu: int) -> list[dict[str, Any]]:
    states = []
    for state in sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle").glob("state*"))[:16]:
        states.append({"name": _read(state / "name", 64), "latency_us": _read(state / "latency", 32),
                       "disabled": _read(state / "disable", 8) == "1"})
    return states


def _irq_affinity(limit: int = 64) -> dict[str, str | None]:
    result: dict[str, str | None] = {}
    for irq in sorted((p for p in Path("/proc/irq").glob("[0-9]*")), key=lambda p: int(p.name))[:limit]:
        result[irq.name] = _read(irq / "smp_affinity_list", 128)
    return result


def _detect_virt(kind: str) -> str | None:
    if not shutil.which("systemd-detect-virt"):
        return None
    try:
        out = subprocess.run(["systemd-detect-virt", kind], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip()[:64] or None


def _virtualization() -> dict[str, Any]:
    """Are we in a VM (cpuinfo's hypervisor flag, or systemd-detect-virt --vm), and in a container?"""
    cpuinfo = _read("/proc/cpuinfo", 1 << 16) or ""
    flag = bool(re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M))
    vm = _detect_virt("--vm")
    return {"in_vm": flag or vm not in (None, "none"), "hypervisor_flag": flag, "vm": vm,
            "container": _detect_virt("--container")}


def audit_system() -> dict[str, Any]:
    """The settings recorded with every run, plus warnings for the ones known to hurt latency."""
    cpus = sorted(os.sched_getaffinity(0))
    cmdline = _read("/proc/cmdline", 4096) or ""
    version = platform.version()[:MAX_VALUE]
    governors = _cpu_values("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", cpus)
    smt = _read("/sys/devices/system/cpu/smt/active", 8)
    thp = _read("/sys/kernel/mm/transparent_hugepage/enabled", 128)
    audit: dict[str, Any] = {
        "hostname": platform.node()[:128],
        "kernel": platform.release()[:MAX_VALUE],
        "kernel_version": version,
        "cmdline": cmdline,
        "preemption": _preemption(version),
        "cpus": len(cpus),
        "isolcpus": _cmdline_value(cmdline, "isolcpus") or _read("/sys/devices/system/cpu/isolated"),
        "nohz_full": _cmdline_value(cmdline, "nohz_full") or _read("/sys/devices/system/cpu/nohz_full"),
        "rcu_nocbs": _cmdline_value(cmdline, "rcu_nocbs"),
        "governors": governors,
        "idle_states": {str(cpu): _idle_states(cpu) for cpu in cpus[:8]},
        "smt_active": None if smt is None else smt == "1",
        "clocksource": _read("/sys/devices/system/clocksource/clocksource0/current_clocksource", 64),
        "transparent_hugepages": thp,
        "irq_affinity": _irq_affinity(),
        "virtualization": _virtualization(),
        "rt_throttling_us": _read("/proc/sys/kernel/sched_rt_runtime_us", 32),
    }
    audit["warnings"] = _warnings(audit)
    return audit


def _warnings(a: dict[str, Any]) -> list[str]:
    warnings = []
    if a["preemption"] != "PREEMPT_RT":
        warnings.append(f"kernel is not PREEMPT_RT ({a['preemption']}): expect larger worst-case latencies")
    if a["virtualization"]["in_vm"]:
        warnings.append(f"rtvirt itself runs inside a VM ({a['virtualization']['vm'] or 'hypervisor flag'}): "
                        "host timings include the outer hypervisor")
    slow = sorted({g for g in a["governors"].values() if g and g != "performance"})
    if slow:
        warnings.append(f"CPU frequency governor {', '.join(slow)} (not 'performance'): frequency changes add jitter")
    deep = [s["name"] for states in a["idle_states"].values() for s in states
            if not s["disabled"] and (s["latency_us"] or "0").isdigit() and int(s["latency_us"] or 0) > 10]
    if deep:
        warnings.append(f"deep C-states enabled ({', '.join(sorted(set(map(str, deep))))}): wake-up from them "
                        "adds latency")
    if a["smt_active"]:
        warnings.append("SMT (hyper-threading) is active: sibling threads share a core")
    if a["clocksource"] and a["clocksource"] != "tsc":
        warnings.append(f"clocksource is {a['clocksource']}, not tsc: reading time is slower")
    if a["transparent_hugepages"] and "[always]" in a["transparent_hugepages"]:
        warnings.append("transparent huge pages set to 'always': compaction can stall tasks")
    if not a["isolcpus"] and not a["nohz_full"]:
        warnings.append("no isolcpus/nohz_full: measured CPUs also run housekeeping work")
    return warnings
