"""What this host must offer before a local domain is defined: hugepages, locked memory, resctrl, NUMA nodes
(libvirt and QEMU would otherwise refuse late, with messages that do not say what to change)."""

from __future__ import annotations

import contextlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ...params import parse_cpulist

MEMLOCK_OVERHEAD_MIB = 256  # locked memory QEMU needs beyond guest RAM (its own allocations)
CAP_SYS_RESOURCE = 24  # the capability that lets libvirtd raise a process's RLIMIT_MEMLOCK hard limit
RESCTRL = Path("/sys/fs/resctrl")
NUMA_ONLINE = Path("/sys/devices/system/node/online")


def _mounts() -> list[list[str]]:
    """The fields of each line of /proc/mounts."""
    try:
        return [line.split() for line in Path("/proc/mounts").read_text()[:1 << 20].splitlines()]
    except OSError:
        return []

def _v1_cpu_controller() -> Path | None:
    """The cgroup v1 cpu controller's mount point if RT group scheduling is active there."""
    for fields in _mounts():
        if len(fields) > 3 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            mount = Path(fields[1])
            return mount if (mount / "cpu.rt_runtime_us").exists() else None
    return None

def _meminfo_kib(field: str) -> int | None:
    """A field of /proc/meminfo (kB, or a count for the HugePages_ ones); None if absent."""
    try:
        for line in Path("/proc/meminfo").read_text()[:1 << 16].splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None

def hugepage_problem(memory_mib: int) -> str | None:
    """Why this host cannot back ``memory_mib`` of guest RAM with hugepages (None: it can).

    libvirt only finds hugetlbfs mounts when libvirtd starts, and QEMU fails late (after the domain was
    defined) with a message that does not say what to reserve; this says it up front.
    """
    size_kib = _meminfo_kib("Hugepagesize")
    free = _meminfo_kib("HugePages_Free")
    if not size_kib or free is None:
        return "hugepages = true: this kernel has no hugetlb support (no Hugepagesize in /proc/meminfo)"
    needed = -(-memory_mib * 1024 // size_kib)
    if free < needed:
        return (f"hugepages = true: the guest's {memory_mib} MiB need {needed} free hugepages of {size_kib} kB, "
                f"the host has {free} (HugePages_Free in /proc/meminfo); reserve them with "
                f"`sysctl -w vm.nr_hugepages=N` (N = HugePages_Total + {needed - free} or more)")
    if not any(len(fields) > 2 and fields[2] == "hugetlbfs" for fields in _mounts()):
        return ("hugepages = true: no hugetlbfs is mounted, so libvirt cannot give QEMU hugepages: "
                "`mount -t hugetlbfs hugetlbfs /dev/hugepages`, then restart libvirtd (it looks for mounts at start)")
    return None

def _libvirtd_status() -> tuple[str, str, str]:
    """(/proc status, /proc limits, who) of the running libvirtd, else of this process (libvirtd started
    from here inherits its capability bounding set and limits)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "libvirtd":
                return ((entry / "status").read_text(), (entry / "limits").read_text(), f"libvirtd (pid {entry.name})")
    return (Path("/proc/self/status").read_text(), Path("/proc/self/limits").read_text(),
            "this host (libvirtd is not running; started from here it would inherit these)")

def memlock_problem(memory_mib: int) -> str | None:
    """Why libvirtd cannot lock ``memory_mib`` of guest RAM in QEMU (None: it can).

    libvirt sets QEMU's RLIMIT_MEMLOCK (soft and hard) to the domain's hard_limit: raising a hard limit
    needs CAP_SYS_RESOURCE, lowering it does not. Without the capability and with a smaller hard limit,
    QEMU's start fails ("cannot limit locked memory"); this says so before a domain is defined.
    """
    needed_mib = memory_mib + MEMLOCK_OVERHEAD_MIB
    status, limits, who = _libvirtd_status()
    caps = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    if caps is None or int(caps.group(1), 16) >> CAP_SYS_RESOURCE & 1:
        return None
    hard = re.search(r"^Max locked memory\s+\S+\s+(\S+)", limits, re.M)
    if hard is None or hard.group(1) == "unlimited" or int(hard.group(1)) >= needed_mib << 20:
        return None
    return (f"memory_locked = true: libvirt must raise QEMU's locked-memory limit (RLIMIT_MEMLOCK) to {needed_mib} "
            f"MiB (guest memory + {MEMLOCK_OVERHEAD_MIB} MiB for QEMU), which needs CAP_SYS_RESOURCE; {who} lacks it "
            f"(CapEff {caps.group(1).lstrip('0') or '0'}) and its hard limit is {int(hard.group(1)) >> 10} KiB "
            "(`ulimit -Hl`): run libvirtd with CAP_SYS_RESOURCE (a container must not drop it) or with a hard "
            f"RLIMIT_MEMLOCK of at least {needed_mib} MiB, or set memory_locked = false")

def resctrl_problem(cputune: ET.Element) -> str | None:
    """Why this host cannot apply ``<cachetune>``/``<memorytune>`` (None: it can, or none is asked for).

    libvirt allocates cache ways and memory bandwidth through the kernel's resctrl file system, which
    only exists with CPU support (Intel RDT, AMD PQoS) and must be mounted at /sys/fs/resctrl.
    """
    asked = [child.tag for child in cputune if child.tag in ("cachetune", "memorytune")]
    if not asked or (RESCTRL / "info").is_dir():
        return None
    try:
        flags = set(re.findall(r"\b(rdt_a|cat_l3|cat_l2|mba)\b", Path("/proc/cpuinfo").read_text()[:1 << 16]))
    except OSError:
        flags = set()
    fix = (f"mount it (`mount -t resctrl resctrl {RESCTRL}`), then restart libvirtd" if flags else
           "this CPU (or the hypervisor this host runs in) offers no cache allocation (no rdt_a/cat_l3/mba in "
           "/proc/cpuinfo): remove them, or run on a host that has it")
    return (f"cputune: <{asked[0]}> needs the kernel's resctrl file system at {RESCTRL}, which this host lacks; "
            f"{fix}")

def numa_problem(nodes: tuple[int, ...]) -> str | None:
    """Which of ``nodes`` this host does not have (None: it has them all)."""
    try:
        online = set(parse_cpulist(NUMA_ONLINE.read_text().strip()))
    except (OSError, ValueError):
        online = {0}  # a kernel without NUMA: one node
    missing = sorted(set(nodes) - online)
    if not missing:
        return None
    return (f"numa_nodes: this host has no NUMA node {','.join(map(str, missing))} (online: "
            f"{','.join(map(str, sorted(online)))}, from {NUMA_ONLINE})")
