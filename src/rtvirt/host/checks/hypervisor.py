"""The hypervisor side: KVM halt polling, and the pinning and policy of running libvirt / Xen guests' vCPUs.

Read through their own interfaces: libvirt-python (read-only connection) and ``xl`` (argv, never a shell). Neither
being there is not an error: the items say so.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from .base import US, HostContext, Item, Status, Step, cpu_list, parse_list

FAMILY = "hypervisor"

HALT_POLL = "/sys/module/kvm/parameters/halt_poll_ns"
LIBVIRT_URI = "qemu:///system"


def libvirt_domains(uri: str = LIBVIRT_URI) -> list[dict[str, Any]] | None:
    """Each running libvirt domain's vCPU pinning, vCPU scheduling and emulator pinning; None without libvirtd."""
    from ...environments.libvirt.connection import import_libvirt

    libvirt = import_libvirt()
    if libvirt is None:
        return None
    libvirt.registerErrorHandler(lambda *_: None, None)  # errors come as exceptions; no stderr noise
    try:
        connection = libvirt.openReadOnly(uri)
    except libvirt.libvirtError:
        return None
    from xml.etree import ElementTree

    found = []
    try:
        for domain in connection.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            try:  # a domain may stop between the listing and the reading
                found.append(domain_placement(domain.XMLDesc(0)))
            except (libvirt.libvirtError, ElementTree.ParseError):
                continue
    except libvirt.libvirtError:
        return None
    finally:
        connection.close()
    return found


def domain_placement(xml_text: str) -> dict[str, Any]:
    """A domain XML's vCPU count, each vCPU's pinning and scheduling policy, and its emulator pinning."""
    from xml.etree import ElementTree

    xml = ElementTree.fromstring(xml_text)
    tune, vcpu = xml.find("cputune"), xml.find("vcpu")
    count_text = (vcpu.text or "1").strip() if vcpu is not None else "1"
    count = int(count_text) if count_text.isdigit() else 1
    pins: dict[int, tuple[int, ...]] = {}
    policies: dict[int, str] = {}
    emulator = None
    if tune is not None:
        for pin in tune.findall("vcpupin"):
            if (pin.get("vcpu") or "").isdigit():
                pins[int(pin.get("vcpu") or 0)] = parse_list(pin.get("cpuset")) or ()
        for sched in tune.findall("vcpusched"):  # vcpus='0-1' scheduler='fifo' priority='1'; no vcpus: all
            for v in parse_list(sched.get("vcpus")) or range(count):
                policies[v] = (sched.get("scheduler") or "?")[:16]
        emulator_pin = tune.find("emulatorpin")
        emulator = None if emulator_pin is None else parse_list(emulator_pin.get("cpuset"))
    return {"name": (xml.findtext("name") or "?")[:64], "vcpus": count, "vcpupin": pins, "vcpusched": policies,
            "emulatorpin": emulator}


def judge_domains(domains: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per item, what each domain lacks: every vCPU pinned, on a real-time policy (fifo / rr), and the emulator
    threads pinned to CPUs none of its vCPUs is pinned to."""
    found: dict[str, list[str]] = {"libvirt-vcpu-pinning": [], "libvirt-vcpu-policy": [], "libvirt-emulatorpin": []}
    for d in domains:
        unpinned = [v for v in range(d["vcpus"]) if not d["vcpupin"].get(v)]
        if unpinned:
            found["libvirt-vcpu-pinning"].append(f"{d['name']} (vCPU {cpu_list(unpinned)} unpinned)")
        other = {v: d["vcpusched"].get(v, "other") for v in range(d["vcpus"])}
        not_rt = [v for v, policy in other.items() if policy not in ("fifo", "rr")]
        if not_rt:
            found["libvirt-vcpu-policy"].append(
                f"{d['name']} (vCPU {cpu_list(not_rt)}: {', '.join(sorted({other[v] for v in not_rt}))})")
        vcpu_cpus = {c for cpus in d["vcpupin"].values() for c in cpus}
        if not d["emulatorpin"]:
            found["libvirt-emulatorpin"].append(f"{d['name']} (emulator threads unpinned)")
        elif set(d["emulatorpin"]) & vcpu_cpus:
            found["libvirt-emulatorpin"].append(f"{d['name']} (emulator on {cpu_list(d['emulatorpin'])}, shared "
                                                f"with vCPUs on {cpu_list(sorted(set(d['emulatorpin']) & vcpu_cpus))})")
    return found


def xen_vcpus() -> list[dict[str, str]] | None:
    """``xl vcpu-list``: each domain's vCPUs and their hard affinity; None where xl is not usable."""
    if not shutil.which("xl"):
        return None
    try:
        result = subprocess.run(["xl", "vcpu-list"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    rows = []
    for line in result.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 7:  # Name ID VCPU CPU State Time(s) Affinity (Hard / Soft)
            rows.append({"domain": fields[0][:64], "vcpu": fields[2], "hard": fields[6]})
    return rows


LIBVIRT_ITEMS = (
    ("libvirt-vcpu-pinning", "libvirt guests' vCPUs each pinned",
     "an unpinned vCPU migrates and shares its CPU with whatever the host scheduler puts there",
     "virsh vcpupin DOMAIN VCPU CPU --config, or <cputune><vcpupin vcpu='N' cpuset='CPU'/> (libvirt's kvm-realtime "
     "page)"),
    ("libvirt-vcpu-policy", "libvirt guests' vCPU threads on a real-time policy",
     "a SCHED_OTHER vCPU thread is preempted by any host task on its CPU, and the guest's RT task with it",
     "<cputune><vcpusched vcpus='0-N' scheduler='fifo' priority='1'/> (the priority below the host's IRQ and "
     "per-CPU kthreads; RT throttling off: rtvirt host tune --profile realtime-virtual-host)"),
    ("libvirt-emulatorpin", "libvirt guests' emulator threads apart from their vCPUs",
     "QEMU's emulator threads (I/O, timers, migration) preempt a vCPU whose CPU they share",
     "virsh emulatorpin DOMAIN HOUSEKEEPING_CPUS --config, or <cputune><emulatorpin cpuset='HOUSEKEEPING'/> on "
     "CPUs none of the vCPUs is pinned to"),
)


def halt_poll(value: str | None) -> tuple[Status, str]:
    """What halt_poll_ns means for a halted vCPU (status: polling on, as the RT-KVM guides leave it)."""
    if value is None:
        return "unknown", "kvm not loaded (no /sys/module/kvm/parameters/halt_poll_ns)"
    ns = int(value) if value.strip().isdigit() else -1
    if ns <= 0:
        return "not-ready", (f"halt_poll_ns {value.strip()}: polling off, every wake-up of a halted vCPU goes "
                             "through the host scheduler")
    return "ok", (f"halt_poll_ns {ns}: a halting vCPU's thread polls up to {ns / 1000:g} us (the window grows "
                  "from halt_poll_ns_grow_start on wake-ups it catches) before it sleeps")


def check(ctx: HostContext) -> list[Item]:
    status, found = halt_poll(ctx.one(HALT_POLL))
    items = [Item("kvm-halt-poll", FAMILY, "KVM polls briefly before halting an idle vCPU", status, found,
                  "> 0 for RT vCPUs on reserved cores, set as the vendor's RT-KVM guide says (200000 is the "
                  "kernel's default)",
                  "a vCPU that halts and is woken pays the host's wake-up path; polling first keeps short idle "
                  "periods cheap, at the cost of CPU time (harmless on a reserved core, stolen from others on a "
                  "shared one)", "echo N > /sys/module/kvm/parameters/halt_poll_ns (kvm.halt_poll_ns=N on the "
                  "command line to keep it); inside the guest, the haltpoll cpuidle driver polls guest-side",
                  "hypervisor", 100 * US)]
    if ctx.view.label != "local":
        return items  # the guests of a target's hypervisor are checked on it, not through us
    domains = libvirt_domains()
    for item_id, title, why, fix in LIBVIRT_ITEMS:
        if domains is None:
            items.append(Item(item_id, FAMILY, title, "unknown", "libvirtd not reachable (qemu:///system)", "-", why,
                              fix, "hypervisor", 100 * US))
            continue
        lacking = judge_domains(domains)[item_id]
        items.append(Item(item_id, FAMILY, title, "not-ready" if lacking else "ok",
                          f"{len(domains)} running domain(s)" + (f"; {'; '.join(lacking[:6])}" if lacking else ""),
                          title, why, fix, "hypervisor", 100 * US))
    vcpus = xen_vcpus()
    if vcpus is not None:
        floating = sorted({row["domain"] for row in vcpus if row["hard"] == "all" and row["domain"] != "Domain-0"})
        items.append(Item("xen-vcpu-affinity", FAMILY, "Xen guests' vCPUs with a hard affinity",
                          "not-ready" if floating else "ok",
                          f"floating: {', '.join(floating[:6])}" if floating else f"{len(vcpus)} vCPUs pinned",
                          "hard affinity (or a cpupool) for each real-time vCPU",
                          "a floating vCPU shares pCPUs with every other domain's", "xl vcpu-pin DOMAIN VCPU CPU, or a "
                          "cpupool of the real-time pCPUs", "hypervisor", 100 * US))
    return items


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return []  # guests are configured in their own definitions, not tuned behind the hypervisor's back
