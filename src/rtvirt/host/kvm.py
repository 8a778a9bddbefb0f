"""What a KVM host has in force: KVM's module parameters, its kernel, and whether KVM really accelerates there.

One reader for every use: the ``qemu`` kind records it in each run's manifest (the KVM host it ran on, this
machine or one over SSH), and ``rtvirt host check``/``host tune`` for KVM hosts read the same values. It reads
through a :class:`rtvirt.sysaudit.SystemView`, so the KVM host may be this machine (``LocalSystem``) or one
behind a transport (``rtvirt.remote.RemoteSystem``). Values come from a system we do not control: bounded, and
an unreadable file is None.

Real-time KVM guides (tuned's ``realtime-virtual-host``, Red Hat's and KubeVirt's) set these: ``kvm
kvmclock_periodic_sync=0`` and ``nx_huge_pages=0`` (its page splits gave ~100 us spikes), ``kvm_intel
ple_gap=0`` (no pause-loop exits), ``halt_poll_ns`` (how long a halted vCPU polls before it sleeps) and the LAPIC
timer advance (``lapic_timer_advance_ns``, a boolean ``lapic_timer_advance`` since Linux 6.x).
"""

from __future__ import annotations

import re
from typing import Any

from ..sysaudit import SystemView

__all__ = ["KVM_MODULES", "REALTIME_PARAMETERS", "kvm_settings", "kvm_accelerates"]

KVM_MODULES = ("kvm", "kvm_amd", "kvm_intel")
# the parameters the real-time guides name, first in the record (every other parameter follows)
REALTIME_PARAMETERS = {
    "kvm": ("halt_poll_ns", "halt_poll_ns_grow", "halt_poll_ns_shrink", "lapic_timer_advance_ns",
            "lapic_timer_advance", "nx_huge_pages", "kvmclock_periodic_sync", "min_timer_period_us",
            "tsc_tolerance_ppm", "enable_pmu"),
    "kvm_intel": ("ple_gap", "ple_window", "preemption_timer", "enable_apicv", "nested", "ept"),
    "kvm_amd": ("pause_filter_count", "pause_filter_thresh", "avic", "nested", "npt", "nrips", "vgif"),
}
MAX_PARAMETERS = 96  # per module: a kernel may have many; the record stays bounded
VALUE_LIMIT = 64


def _flags(cpuinfo: str) -> set[str]:
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    return set(match.group(1).split()) if match else set()


def kvm_accelerates(flags: set[str], modules: set[str], arm64: bool = False, dev_kvm: bool = False
                    ) -> tuple[bool, str]:
    """Whether KVM runs guests on the CPU here (hardware virtualization, real or emulated by an outer
    hypervisor) and why we think so: on x86 /dev/kvm alone says nothing (a paravirtual KVM such as PVM provides
    it on a CPU without VMX or SVM, and emulates); on arm64 KVM is built in and registers /dev/kvm only once it
    initialised at EL2, so there it does."""
    if arm64:
        return (True, "arm64 KVM initialised at EL2 (/dev/kvm exists only then)") if dev_kvm else \
            (False, "arm64 without /dev/kvm: the kernel did not start at EL2, or KVM is not built in")
    vendor = "kvm_intel" if "vmx" in flags else "kvm_amd" if "svm" in flags else None
    if vendor is None:
        others = sorted(modules - {"kvm", "kvm_intel", "kvm_amd"})
        return False, ("the CPU has neither VMX nor SVM: KVM here (" + (", ".join(others) or "no vendor module")
                       + ") does not run guests on the CPU")
    if vendor not in modules:
        return False, f"the CPU has {'VMX' if vendor == 'kvm_intel' else 'SVM'} but {vendor} is not loaded"
    nested = " (nested: the CPU itself is virtual)" if "hypervisor" in flags else ""
    return True, f"{vendor} on a CPU with {'VMX' if vendor == 'kvm_intel' else 'SVM'}{nested}"


def kvm_settings(view: SystemView) -> dict[str, Any]:
    """The KVM host's record: kernel, /dev/kvm, the CPU's virtualization, every parameter of kvm, kvm_amd and
    kvm_intel (the real-time ones first), and whether KVM really accelerates."""
    files = view.read_many(["/proc/sys/kernel/osrelease", "/proc/cmdline"], 1024)
    cpuinfo = view.read_many(["/proc/cpuinfo"], 1 << 16)["/proc/cpuinfo"] or ""
    loaded = {path.rsplit("/", 1)[1] for path in view.glob("/sys/module", "kvm*", 16)}
    modules: dict[str, dict[str, str | None]] = {}
    for module in KVM_MODULES:
        if module not in loaded:
            continue
        names = sorted(p.rsplit("/", 1)[1] for p in view.glob(f"/sys/module/{module}/parameters", "*",
                                                                MAX_PARAMETERS))
        first = [n for n in REALTIME_PARAMETERS.get(module, ()) if n in names]
        ordered = first + [n for n in names if n not in first]
        values = view.read_many([f"/sys/module/{module}/parameters/{n}" for n in ordered], VALUE_LIMIT)
        modules[module] = {n: values[f"/sys/module/{module}/parameters/{n}"] for n in ordered}
    flags = _flags(cpuinfo)
    dev_kvm = bool(view.glob("/dev", "kvm", 1))
    # (an arm64 /proc/cpuinfo lists "Features" and "CPU architecture: 8", x86's "flags")
    arm64 = re.search(r"^CPU architecture\s*:\s*8", cpuinfo, re.M) is not None
    accelerates, why = kvm_accelerates(flags, loaded, arm64, dev_kvm)
    return {
        "kernel": (files["/proc/sys/kernel/osrelease"] or "")[:128] or None,
        "cmdline": (files["/proc/cmdline"] or "")[:1024] or None,
        "dev_kvm": dev_kvm,
        "cpu_virtualization": sorted(flags & {"vmx", "svm", "npt", "ept", "tsc_deadline_timer", "hypervisor",
                                              "constant_tsc", "nonstop_tsc"}),
        "other_kvm_modules": sorted(loaded - set(KVM_MODULES)),
        "modules": modules,
        "accelerates": accelerates,
        "accelerates_why": why,
    }
