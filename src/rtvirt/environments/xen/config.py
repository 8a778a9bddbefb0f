"""The xen environment's scenario fields: the domUs, the cpupool and its scheduler's parameters, the lab's machine."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...agents import native_arch
from ...params import CpuList
from ...units import duration_field
from ..base import EnvironmentConfig
from ..guest_image import GuestArch, GuestKind, arch_field, guest_field

__all__ = ["DEFAULT_A653", "Arinc653Params", "CreditParams", "RtdsParams", "XenConfig", "XenLabConfig"]


def _us(ns: int) -> int:
    return ns // 1000

class RtdsParams(BaseModel):
    """One vCPU's RTDS reservation: ``budget`` of CPU time every ``period``."""

    model_config = ConfigDict(extra="forbid")
    period: duration_field("us") = Field(10_000_000, ge=100_000, le=10_000_000_000,  # type: ignore[valid-type]
                                         description="replenishment period (bare numbers in us)")
    budget: duration_field("us") = Field(4_000_000, ge=100_000,  # type: ignore[valid-type]
                                         description="CPU time per period (bare numbers in us)")
    extratime: bool = Field(False, description="let the vCPU run beyond its budget when the pCPU is idle")

    @model_validator(mode="after")
    def _budget_fits(self) -> RtdsParams:
        if self.budget > self.period:
            raise ValueError("budget must not exceed period")
        if self.budget % 1000 or self.period % 1000:
            raise ValueError("budget and period are whole microseconds (xl sched-rtds takes us)")
        return self

    def xl_args(self) -> list[str]:
        return ["-p", str(_us(self.period)), "-b", str(_us(self.budget)), "-e", "1" if self.extratime else "0"]

class CreditParams(BaseModel):
    """credit/credit2 share of a domain: ``weight`` relative to others, ``cap`` in % of one pCPU (0: none)."""

    model_config = ConfigDict(extra="forbid")
    weight: int = Field(256, ge=1, le=65535)
    cap: int = Field(0, ge=0, le=6400)

class Arinc653Params(BaseModel):
    """An ARINC 653 major frame: the measuring domU's window(s) first, then the disturbing domUs' windows."""

    model_config = ConfigDict(extra="forbid")
    major_frame: duration_field("ms") = Field(10_000_000, ge=100_000, le=10_000_000_000,  # type: ignore[valid-type]
                                              description="length of the repeating major frame (bare numbers in ms)")
    window: duration_field("ms") = Field(5_000_000, ge=10_000,  # type: ignore[valid-type]
                                         description="the measuring domU's window per vCPU in each major frame; "
                                                     "disturbing domUs in the pool share the rest equally")

    @model_validator(mode="after")
    def _window_fits(self) -> Arinc653Params:
        if self.window > self.major_frame:
            raise ValueError("window must not exceed major_frame")
        return self

DEFAULT_A653 = Arinc653Params.model_validate({})


class XenLabConfig(BaseModel):
    """The machine QEMU emulates for the lab and how Xen shares it with dom0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pcpus: int = Field(2, ge=1, le=8, description="physical CPUs of the emulated machine (Xen's pCPUs)")
    memory: int = Field(2048, ge=512, le=16384, description="memory of the emulated machine in MiB")
    dom0_memory: int = Field(768, ge=256, le=8192, description="dom0's memory in MiB")
    accel: Literal["auto", "kvm", "tcg"] = Field("auto", description="QEMU accelerator (auto: KVM if it helps)")
    boot_timeout: duration_field("s") = Field(240_000_000_000, ge=10_000_000_000,  # type: ignore[valid-type]
                                              description="time Xen and dom0 may take to come up")

    def key(self, dom0_vcpus: int, arch: str = "x86_64") -> str:
        """Environments of one architecture whose lab tables and dom0 vCPUs are equal share one boot."""
        return f"xen-lab:{arch}:{dom0_vcpus}:" + json.dumps(self.model_dump(mode="json"), sort_keys=True)


class XenConfig(EnvironmentConfig):
    kind: Literal["xen"] = "xen"
    where: Literal["auto", "dom0", "lab"] = Field(
        "auto", description="dom0: rtvirt runs in a Xen host's dom0; lab: Xen booted in QEMU here; "
                            "auto: dom0 when this is a Xen dom0, else lab")
    mode: Literal["pv", "pvh", "hvm"] = Field("pv", description="domU type (PVH and HVM need hvm and hap or "
                                                                "shadow in `xl info` virt_caps; HVM a device model)")
    vcpus: int = Field(1, ge=1, le=64, description="the measuring domU's vCPUs")
    memory: int = Field(256, ge=64, le=65536, description="the measuring domU's memory in MiB")
    affinity: list[CpuList] | None = Field(None, description="hard affinity of each vCPU (pCPU lists); default: "
                                                             "vCPU i on the i-th of cpus (cycling) when pin")
    dom0_vcpus: int = Field(1, ge=1, le=64, description="dom0's vCPUs (lab: dom0_max_vcpus, pinned to pCPUs "
                                                        "0..n-1; dom0: xl vcpu-set, restored at the end)")
    scheduler: Literal["default", "credit", "credit2", "rtds", "arinc653", "null"] = Field(
        "default", description="default: the domU stays in Pool-0; otherwise a cpupool of this scheduler is made")
    pool_cpus: CpuList | None = Field(None, description="pCPUs moved into the cpupool (default: cpus, else the "
                                                        "last pCPU)")
    rtds: RtdsParams | None = Field(None, description="the reservation of every vCPU (scheduler rtds)")
    rtds_vcpus: list[RtdsParams] | None = Field(None, description="one reservation per vCPU instead (scheduler rtds)")
    credit: CreditParams | None = Field(None, description="weight and cap (scheduler credit or credit2)")
    arinc653: Arinc653Params | None = Field(None, description="major frame and windows (scheduler arinc653; "
                                                              "default: 10 ms frame, 5 ms window)")
    stressor_cpus: CpuList | None = Field(None, description="pCPUs of 'other-vm' disturbing domUs (default: the "
                                                            "measuring domU's; unpinned when pin = false)")
    stressor_memory: int = Field(128, ge=64, le=65536, description="memory of each disturbing domU in MiB")
    stressor_rtds: RtdsParams | None = Field(None, description="RTDS reservation of disturbing domUs in the "
                                                               "cpupool (default: Xen's)")
    lab: XenLabConfig = Field(default_factory=lambda: XenLabConfig.model_validate({}),
                              description="the emulated machine of a Xen lab")
    boot_timeout: duration_field("s") = Field(180_000_000_000, ge=1_000_000_000,  # type: ignore[valid-type]
                                              description="time a domU may take to boot (bare numbers in s)")
    guest: GuestKind = guest_field()
    arch: GuestArch = arch_field()

    @model_validator(mode="before")
    @classmethod
    def _arm_domus_are_pvh(cls, data: Any) -> Any:
        """Xen on Arm has one kind of domU (PVH-like: no PV, no device model): its default mode."""
        if isinstance(data, dict) and data.get("arch") == "aarch64" and "mode" not in data:
            return {**data, "mode": "pvh"}
        return data

    @model_validator(mode="after")
    def _arch_this_xen_runs(self) -> XenConfig:
        if self.arch == "x86_64":
            return self
        if self.mode != "pvh":
            raise ValueError(f"mode: Xen on Arm runs every domU as PVH (mode = 'pvh'), not {self.mode!r}")
        if self.where == "dom0" and self.arch != native_arch():
            raise ValueError(f"where: this machine's dom0 runs {native_arch()} domUs; an {self.arch} Xen is a lab "
                             "(where = 'lab' or 'auto')")
        if self.where != "dom0" and self.lab.accel == "kvm" and self.arch != native_arch():
            raise ValueError(f"lab.accel: this machine's KVM runs {native_arch()} labs; an {self.arch} lab is "
                             "emulated (accel = 'tcg' or 'auto')")
        if self.scheduler == "arinc653":
            raise ValueError("scheduler: the arm64 lab's dom0 has no rtvirt-a653 (xl sets no ARINC 653 schedule); "
                             "credit, credit2, rtds and null run there")
        return self

    @model_validator(mode="after")
    def _guest_the_lab_boots(self) -> XenConfig:
        if self.guest == "baremetal":  # our own kernel, booted as a PVH domU (docs/baremetal.md)
            if self.vcpus != 1:
                raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
            if "mode" in self.model_fields_set and self.mode != "pvh":
                raise ValueError("mode: the bare-metal guest boots as a PVH domU (mode = 'pvh')")
        return self  # linux and linux-rt: our guest image with that Debian kernel (Dom0.domu_files)

    @model_validator(mode="after")
    def _consistent(self) -> XenConfig:
        if self.affinity is not None and len(self.affinity) != self.vcpus:
            raise ValueError(f"affinity names {len(self.affinity)} vCPUs but vcpus is {self.vcpus}")
        if (self.rtds is not None or self.rtds_vcpus is not None) and self.scheduler != "rtds":
            raise ValueError("rtds parameters need scheduler = 'rtds'")
        if self.rtds is not None and self.rtds_vcpus is not None:
            raise ValueError("give rtds (every vCPU) or rtds_vcpus (one per vCPU), not both")
        if self.rtds_vcpus is not None and len(self.rtds_vcpus) != self.vcpus:
            raise ValueError(f"rtds_vcpus lists {len(self.rtds_vcpus)} reservations but vcpus is {self.vcpus}")
        if self.stressor_rtds is not None and self.scheduler != "rtds":
            raise ValueError("stressor_rtds needs scheduler = 'rtds'")
        if self.arinc653 is not None and self.scheduler != "arinc653":
            raise ValueError("arinc653 parameters need scheduler = 'arinc653'")
        if self.scheduler == "arinc653" and self.vcpus * (self.arinc653 or DEFAULT_A653).window > \
                (self.arinc653 or DEFAULT_A653).major_frame:
            raise ValueError("arinc653: vcpus x window exceeds major_frame")
        if self.where == "lab" and self.dom0_vcpus >= self.lab.pcpus:
            raise ValueError(f"dom0_vcpus ({self.dom0_vcpus}) leaves no pCPU of the lab's {self.lab.pcpus} for domUs")
        if self.credit is not None and self.scheduler not in ("credit", "credit2", "default"):
            raise ValueError("credit parameters need scheduler 'credit', 'credit2' or 'default'")
        return self
