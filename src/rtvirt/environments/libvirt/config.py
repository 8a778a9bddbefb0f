"""The libvirt environment's scenario fields: connection, vCPUs and their tuning, memory backing."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...agents import native_arch
from ...params import CpuList, parse_cpulist
from ...units import duration_field
from ..base import EnvironmentConfig
from ..guest_image import GuestArch, GuestKind, arch_field, guest_field, stream_copy_field
from ..kvmlab.config import LOCAL_HOST, KvmHostFields
from .host import memlock_problem, numa_problem, resctrl_problem

__all__ = ["LibvirtConfig", "VcpuSched", "parse_cputune"]


URI_PATTERN = r"^qemu(\+(ssh|libssh|libssh2|tcp|tls|unix))?://[^\s'\"\\]*/(system|session)(\?[^\s'\"\\]*)?$"
CPUTUNE_CHILDREN = {"vcpupin", "emulatorpin", "iothreadpin", "vcpusched", "emulatorsched", "iothreadsched",
                    "shares", "period", "quota", "vcpu_period", "vcpu_quota", "global_period", "global_quota",
                    "emulator_period", "emulator_quota", "iothread_period", "iothread_quota", "cachetune",
                    "memorytune"}


class VcpuSched(BaseModel):
    """The ``<vcpusched>`` of every vCPU: ``other`` (no element), or ``fifo`` / ``rr`` with a priority."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["other", "fifo", "rr"] = "other"
    priority: int = Field(1, ge=1, le=99, description="real-time priority of the vCPU threads")

    def describe(self) -> str:
        return "other" if self.policy == "other" else f"{self.policy}:{self.priority}"

class LibvirtConfig(EnvironmentConfig, KvmHostFields):
    kind: Literal["libvirt"] = "libvirt"
    uri: str = Field("qemu:///system", max_length=500, pattern=URI_PATTERN,
                     description="libvirt connection URI: qemu:///system, or qemu+ssh://user@host/system?keyfile=... "
                                 "(host = \"local\" only: the lab and user@host give their own)")
    domain_type: Literal["auto", "kvm", "qemu"] = Field(
        "auto", description="kvm, qemu (TCG), or auto: kvm where it really accelerates")
    vcpus: int = Field(1, ge=1, le=64, description="virtual CPUs; vCPU i is pinned to the i-th of cpus (cycling)")
    memory: int = Field(256, ge=64, le=65536, description="guest memory in MiB")
    emulator_cpus: CpuList | None = Field(None, description="host CPUs for QEMU's other threads (emulatorpin; "
                                                            "default: the CPUs not in cpus, if any)")
    vcpu_sched: VcpuSched = Field(default_factory=lambda: VcpuSched(policy="other", priority=1),
                                  description="vcpusched of every vCPU")
    cputune: str | None = Field(None, max_length=65536,
                                description="a whole <cputune> element (as `rtvirt design` writes it); it "
                                            "replaces cpus, emulator_cpus and vcpu_sched")
    memory_locked: bool = Field(False, description="lock guest memory in host RAM (<memoryBacking><locked/>)")
    hugepages: bool = Field(False, description="back guest memory with the host's reserved hugepages")
    numa_nodes: CpuList | None = Field(None, description="host NUMA nodes guest memory must come from (strict)")
    rt_throttling: Literal["lift", "keep"] = Field(
        "lift", description="lift: as root on a local URI, set kernel.sched_rt_runtime_us=-1 while real-time "
                            "vCPUs run where cgroup v1 RT group scheduling would refuse them; keep: never")
    boot_timeout: duration_field("s") = Field(90_000_000_000, ge=1_000_000_000,  # type: ignore[valid-type]
                                              description="time the guest may take to boot (bare numbers in s)")
    guest: GuestKind = guest_field()
    stream_copy: bool = stream_copy_field()
    arch: GuestArch = arch_field()

    @model_validator(mode="after")
    def _guest_this_environment_boots(self) -> LibvirtConfig:
        if self.guest == "baremetal" and self.vcpus != 1:
            raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
        if self.arch != native_arch():
            if self.host == "local":
                raise ValueError(f"arch: an {self.arch} guest runs under a KVM of its own architecture: "
                                 f'host = "lab" boots one (an emulated {self.arch} board), or name one with '
                                 'host = "user@host"')
            if self.host == "lab" and self.lab.accel == "kvm":
                raise ValueError(f"lab.accel: this machine's KVM runs {native_arch()} labs; an {self.arch} lab is "
                                 "emulated (accel = 'tcg' or 'auto')")
        return self

    @model_validator(mode="after")
    def _one_place(self) -> LibvirtConfig:
        if self.host != LOCAL_HOST and "uri" in self.model_fields_set:
            raise ValueError(f"uri: host = {self.host!r} gives the URI (qemu+ssh:// to that host's libvirtd); "
                             "give either host or uri")
        return self

    @model_validator(mode="after")
    def _this_host_has_it(self) -> LibvirtConfig:
        # a local URI's libvirtd is this host: refuse what it cannot give before any domain exists
        # (a remote host's refusals come from libvirt when the domain is defined or started)
        if not self.local:
            return self
        problem = ((self.memory_locked and memlock_problem(self.memory))
                   or (self.cputune is not None and resctrl_problem(parse_cputune(self.cputune)))
                   or (self.numa_nodes and numa_problem(self.numa_nodes)))
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("cputune")
    @classmethod
    def _cputune_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cputune(value)
        return value

    @model_validator(mode="after")
    def _cputune_is_whole(self) -> LibvirtConfig:
        if self.cputune is None:
            return self
        if self.cpus is not None or self.emulator_cpus is not None or self.vcpu_sched.policy != "other":
            raise ValueError("cputune replaces cpus, emulator_cpus and vcpu_sched: give either, not both")
        if not self.pin:
            raise ValueError("cputune pins the domain: remove pin = false")
        for pin in parse_cputune(self.cputune).findall("vcpupin"):
            if int(pin.get("vcpu", "0")) >= self.vcpus:
                raise ValueError(f"cputune pins vCPU {pin.get('vcpu')} but the domain has vcpus = {self.vcpus}")
        return self

    @property
    def local(self) -> bool:
        """Whether the URI names this machine's libvirtd (no host part)."""
        return self.host == LOCAL_HOST and not urlsplit(self.uri).netloc


def parse_cputune(text: str) -> ET.Element:
    """A ``<cputune>`` element from text, checked enough that libvirt's own errors are about values only."""
    if "<!DOCTYPE" in text.upper() or "<!ENTITY" in text.upper():
        raise ValueError("cputune: DOCTYPE and ENTITY declarations are not accepted")
    try:
        element = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"cputune is not well-formed XML: {exc}") from None
    if element.tag != "cputune":
        raise ValueError(f"cputune must be a <cputune> element, not <{element.tag[:40]}>")
    for child in element:
        if child.tag not in CPUTUNE_CHILDREN:
            raise ValueError(f"cputune: <{str(child.tag)[:40]}> is not a <cputune> child libvirt knows")
        if child.tag == "vcpupin":
            if not (child.get("vcpu") or "").isdigit():
                raise ValueError("cputune: every <vcpupin> needs a numeric vcpu attribute")
            parse_cpulist(child.get("cpuset", ""))
    return element
