"""System audit: the host settings that change latency results, recorded in every manifest.

Everything read here comes from files a misconfigured or hostile system controls: each value is
bounded in length, and an unreadable file is recorded as None rather than failing the run.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Protocol

__all__ = ["audit_system", "LocalSystem", "SystemView", "MAX_VALUE"]

MAX_VALUE = 512
KERNEL_CONFIG_LIMIT = 1 << 20
# The kernel's default for SCHED_DEADLINE's high-resolution enforcement (kernel/sched/features.h:
# SCHED_FEAT(HRTICK_DL, false)): budgets are checked at the tick unless someone switched it on in debugfs.
HRTICK_DL_DEFAULT = False


class LocalSystem:
    """The machine rtvirt runs on, as the audit reads it."""

    label = "local"

    def read_many(self, paths: list[str], limit: int = MAX_VALUE) -> dict[str, str | None]:
        return {path: _read(path, limit) for path in paths}

    def glob(self, directory: str, pattern: str, limit: int = 64) -> list[str]:
        return [str(p) for p in sorted(Path(directory).glob(pattern))[:limit]]

    def detect_virt(self, kind: str) -> str | None:
        if not shutil.which("systemd-detect-virt"):
            return None
        try:
            out = subprocess.run(["systemd-detect-virt", kind], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.strip()[:64] or None

    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    def kernel_config(self, release: str) -> tuple[str | None, str | None]:
        for path in (f"/boot/config-{release}", "/proc/config.gz"):
            try:
                opener = gzip.open if path.endswith(".gz") else open
                with opener(path, "rb") as f:
                    return f.read(KERNEL_CONFIG_LIMIT).decode(errors="replace"), path
            except (OSError, EOFError):
                continue
        return None, None


class SystemView(Protocol):
    """What the audit needs from a system: the local one, or a target behind a connection
    (rtvirt.remote.RemoteSystem). ``read_many`` is one round trip for many files."""

    label: str

    def read_many(self, paths: list[str], limit: int = MAX_VALUE) -> dict[str, str | None]: ...

    def glob(self, directory: str, pattern: str, limit: int = 64) -> list[str]: ...

    def detect_virt(self, kind: str) -> str | None: ...

    def cpus(self) -> list[int]: ...

    def kernel_config(self, release: str) -> tuple[str | None, str | None]:
        """The running kernel's build configuration and where it was read (/boot/config-RELEASE or
        /proc/config.gz), (None, None) where neither is there."""
        ...


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


def _preemption(version: str, realtime: str | None, preempt_mode: str | None) -> str:
    if realtime == "1" or "PREEMPT_RT" in version:
        return "PREEMPT_RT"
    if preempt_mode:  # e.g. "none voluntary (full)": the bracketed one is active
        active = re.search(r"\((\w+)\)", preempt_mode)
        if active:
            return f"PREEMPT_DYNAMIC ({active.group(1)})"
    for model in ("PREEMPT_DYNAMIC", "PREEMPT", "PREEMPT_VOLUNTARY"):
        if model in version.split():
            return model
    return "none (server)"


def _idle_states(system: SystemView, cpus: list[int]) -> dict[str, list[dict[str, Any]]]:
    dirs = {cpu: system.glob(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle", "state*", 16) for cpu in cpus}
    values = system.read_many([f"{d}/{name}" for found in dirs.values() for d in found
                               for name in ("name", "latency", "disable")], 64)
    return {str(cpu): [{"name": values.get(f"{d}/name"), "latency_us": values.get(f"{d}/latency"),
                        "disabled": values.get(f"{d}/disable") == "1"} for d in found]
            for cpu, found in dirs.items()}


def _irq_affinity(system: SystemView, limit: int = 64) -> dict[str, str | None]:
    irqs = sorted(system.glob("/proc/irq", "[0-9]*", 4096), key=lambda p: int(p.rsplit("/", 1)[1]))[:limit]
    values = system.read_many([f"{irq}/smp_affinity_list" for irq in irqs], 128)
    return {irq.rsplit("/", 1)[1]: values.get(f"{irq}/smp_affinity_list") for irq in irqs}


def _virtualization(system: SystemView, files: dict[str, str | None]) -> dict[str, Any]:
    """Is the system a guest (cpuinfo's hypervisor flag, systemd-detect-virt --vm, /sys/hypervisor, DMI),
    of which hypervisor, and is it in a container?"""
    cpuinfo = files["/proc/cpuinfo"] or ""
    flag = bool(re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M))
    vm = system.detect_virt("--vm")
    hypervisor_type = files["/sys/hypervisor/type"]  # "xen" in a Xen domain, also on Arm
    dmi = " ".join(v for v in (files["/sys/class/dmi/id/sys_vendor"], files["/sys/class/dmi/id/product_name"]) if v)
    return {"in_vm": flag or vm not in (None, "none") or bool(hypervisor_type), "hypervisor_flag": flag, "vm": vm,
            "hypervisor_type": hypervisor_type, "dmi": dmi[:128] or None,
            "container": system.detect_virt("--container")}


_FILES = ["/proc/cmdline", "/proc/sys/kernel/hostname", "/proc/sys/kernel/osrelease", "/proc/sys/kernel/version",
          "/sys/kernel/realtime", "/sys/kernel/debug/sched/preempt", "/sys/devices/system/cpu/isolated",
          "/sys/devices/system/cpu/nohz_full", "/sys/devices/system/cpu/smt/active",
          "/sys/devices/system/clocksource/clocksource0/current_clocksource",
          "/sys/kernel/mm/transparent_hugepage/enabled", "/proc/sys/kernel/sched_rt_runtime_us",
          "/sys/hypervisor/type", "/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name",
          "/sys/kernel/debug/sched/features"]


def _scheduler_tick(system: SystemView, release: str, features: str | None) -> dict[str, Any]:
    """The tick that enforces SCHED_DEADLINE runtimes and cgroup bandwidth where no high-resolution tick
    does: HZ from the kernel's configuration, HRTICK_DL from sched/features (or the kernel's default)."""
    config, source = system.kernel_config(release) if release and "/" not in release else (None, None)
    found = re.search(r"^CONFIG_HZ=(\d+)$", config or "", re.M)
    hz = int(found.group(1)) if found and 0 < int(found.group(1)) <= 10_000 else None
    words = set((features or "").split())
    hrtick = True if "HRTICK_DL" in words else False if "NO_HRTICK_DL" in words else None
    return {"hz": hz, "hz_source": source if hz else None,
            "hrtick_dl": HRTICK_DL_DEFAULT if hrtick is None else hrtick,
            "hrtick_dl_source": "sched/features" if hrtick is not None
            else "the kernel's default (sched/features not readable)"}


def audit_system(system: SystemView | None = None) -> dict[str, Any]:
    """The settings recorded with every run, plus warnings for the ones known to hurt latency.

    ``system``: where to look (default: this machine; an SSH target's view audits the target).
    """
    system = system or LocalSystem()
    cpus = system.cpus()
    files = system.read_many(_FILES, 4096)
    files["/proc/cpuinfo"] = system.read_many(["/proc/cpuinfo"], 1 << 16)["/proc/cpuinfo"]
    cmdline = files["/proc/cmdline"] or ""
    version = (files["/proc/sys/kernel/version"] or "")[:MAX_VALUE]
    governor_paths = {cpu: f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor" for cpu in cpus}
    governor_values = system.read_many(list(governor_paths.values()), 64)
    smt = files["/sys/devices/system/cpu/smt/active"]
    audit: dict[str, Any] = {
        "hostname": (files["/proc/sys/kernel/hostname"] or "")[:128],
        "kernel": (files["/proc/sys/kernel/osrelease"] or "")[:MAX_VALUE],
        "kernel_version": version,
        "cmdline": cmdline,
        "preemption": _preemption(version, files["/sys/kernel/realtime"], files["/sys/kernel/debug/sched/preempt"]),
        "cpus": len(cpus),
        "isolcpus": _cmdline_value(cmdline, "isolcpus") or files["/sys/devices/system/cpu/isolated"],
        "nohz_full": _cmdline_value(cmdline, "nohz_full") or files["/sys/devices/system/cpu/nohz_full"],
        "rcu_nocbs": _cmdline_value(cmdline, "rcu_nocbs"),
        "governors": {str(cpu): governor_values.get(path) for cpu, path in governor_paths.items()},
        "idle_states": _idle_states(system, cpus[:8]),
        "smt_active": None if smt is None else smt == "1",
        "clocksource": (files["/sys/devices/system/clocksource/clocksource0/current_clocksource"] or "")[:64] or None,
        "transparent_hugepages": (files["/sys/kernel/mm/transparent_hugepage/enabled"] or "")[:128] or None,
        "irq_affinity": _irq_affinity(system),
        "virtualization": _virtualization(system, files),
        "rt_throttling_us": (files["/proc/sys/kernel/sched_rt_runtime_us"] or "")[:32] or None,
        "scheduler_tick": _scheduler_tick(system, (files["/proc/sys/kernel/osrelease"] or "").strip(),
                                          files["/sys/kernel/debug/sched/features"]),
    }
    audit["warnings"] = _warnings(audit, system.label)
    return audit


def _warnings(a: dict[str, Any], system_label: str) -> list[str]:
    warnings = []
    if a["preemption"] != "PREEMPT_RT":
        warnings.append(f"kernel is not PREEMPT_RT ({a['preemption']}): expect larger worst-case latencies")
    if a["virtualization"]["in_vm"]:
        virt = a["virtualization"]
        which = virt["vm"] or virt["hypervisor_type"] or "hypervisor flag"
        who = "rtvirt itself runs" if system_label == "local" else f"the target {system_label} runs"
        warnings.append(f"{who} inside a VM ({which}): host timings include the outer hypervisor")
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
