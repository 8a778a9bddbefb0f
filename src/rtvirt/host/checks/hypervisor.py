"""The hypervisor side: KVM halt polling, and the pinning and policy of running libvirt / Xen guests' vCPUs.

Read through their own interfaces: libvirt-python (read-only connection) and ``xl`` (argv, never a shell). Neither
being there is not an error: the items say so.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from .base import US, HostContext, Item, Step

FAMILY = "hypervisor"

HALT_POLL = "/sys/module/kvm/parameters/halt_poll_ns"
LIBVIRT_URI = "qemu:///system"


def libvirt_domains(uri: str = LIBVIRT_URI) -> list[dict[str, Any]] | None:
    """Each running libvirt domain's vCPU pinning, vCPU scheduling and emulator pinning; None without libvirtd."""
    try:
        import libvirt
    except ImportError:
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
                xml = ElementTree.fromstring(domain.XMLDesc(0))
            except (libvirt.libvirtError, ElementTree.ParseError):
                continue
            tune, vcpu = xml.find("cputune"), xml.find("vcpu")
            pins = [] if tune is None else [p.get("cpuset") for p in tune.findall("vcpupin")]
            policies = [] if tune is None else [s.get("scheduler") for s in tune.findall("vcpusched")]
            pin = None if tune is None else tune.find("emulatorpin")
            count = (vcpu.text or "1").strip() if vcpu is not None else "1"
            found.append({"name": (xml.findtext("name") or "?")[:64], "vcpus": int(count) if count.isdigit() else 1,
                          "vcpupin": pins, "vcpusched": policies, "emulatorpin": None if pin is None else
                          pin.get("cpuset")})
    except libvirt.libvirtError:
        return None
    finally:
        connection.close()
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


def check(ctx: HostContext) -> list[Item]:
    halt = ctx.one(HALT_POLL)
    items = [Item("kvm-halt-poll", FAMILY, "KVM polls briefly before halting an idle vCPU",
                  "unknown" if halt is None else ("ok" if halt.strip() not in ("", "0") else "not-ready"),
                  f"halt_poll_ns {halt}" if halt else "kvm not loaded", "> 0 (e.g. 200000) for RT vCPUs on reserved "
                  "cores", "a vCPU that halts and is woken pays the host's wake-up path; polling first keeps short "
                  "idle periods cheap (at the cost of CPU time on a reserved core)",
                  "echo 200000 > /sys/module/kvm/parameters/halt_poll_ns (or libvirt <haltpoll> / the guest's "
                  "haltpoll cpuidle driver)", "hypervisor", 100 * US)]
    if ctx.view.label != "local":
        return items  # the guests of a target's hypervisor are checked on it, not through us
    domains = libvirt_domains()
    if domains is None:
        items.append(Item("libvirt-vcpu-pinning", FAMILY, "libvirt guests' vCPUs pinned, real-time policy, "
                          "emulator threads apart", "unknown", "libvirtd not reachable (qemu:///system)", "-",
                          "an unpinned vCPU migrates and shares its CPU; emulator threads on a vCPU's CPU preempt it",
                          "<cputune> with <vcpupin>, <vcpusched scheduler='fifo'>, <emulatorpin> (libvirt's "
                          "kvm-realtime page)", "hypervisor", 100 * US))
    else:
        loose = [d["name"] for d in domains if len(d["vcpupin"]) < d["vcpus"] or not d["emulatorpin"]]
        items.append(Item("libvirt-vcpu-pinning", FAMILY, "libvirt guests' vCPUs pinned, emulator threads apart",
                          "not-ready" if loose else "ok",
                          f"{len(domains)} running domain(s)" + (f"; not fully pinned: {', '.join(loose[:6])}"
                                                                 if loose else ""),
                          "every vCPU pinned, emulator pinned to housekeeping CPUs",
                          "an unpinned vCPU migrates and shares its CPU; emulator threads on a vCPU's CPU preempt it",
                          "virsh vcpupin / emulatorpin, or <cputune> in the domain XML", "hypervisor", 100 * US))
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
