"""The qemu kind's scenario fields: the guest, its placement, where QEMU runs, and KVM's real-time settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...agents import native_arch
from ...params import CpuList
from ...remote.target import RemoteDir
from ...units import duration_field
from ..base import EnvironmentConfig
from ..guest_image import GuestKind, guest_field, stream_copy_field
from ..kvmlab.config import KvmHostFields
from ..sched import SchedPolicy

__all__ = ["GuestIdle", "QemuConfig"]

GuestIdle = Literal["default", "poll", "haltpoll"]


class QemuConfig(EnvironmentConfig, KvmHostFields):
    kind: Literal["qemu"] = "qemu"
    vcpus: int = Field(1, ge=1, le=64, description="virtual CPUs; vCPU i is pinned to the i-th of cpus (cycling)")
    memory: int = Field(256, ge=64, le=65536, description="guest memory in MiB")
    emulator_cpus: CpuList | None = Field(None, description="host CPUs for QEMU's other threads "
                                                            "(default: the CPUs no vCPU is pinned to, if any)")
    vcpu_sched: SchedPolicy = Field(default_factory=lambda: SchedPolicy.model_validate({}),
                                    description="policy of the vCPU threads")
    accel: Literal["auto", "kvm", "tcg"] = Field("auto", description="auto: KVM if it really accelerates, else TCG")
    boot_timeout: duration_field("s") = Field(90_000_000_000, ge=1_000_000_000,  # type: ignore[valid-type]
                                              description="time the guest may take to boot (bare numbers in s)")
    guest: GuestKind = guest_field()
    stream_copy: bool = stream_copy_field()
    # where QEMU runs (docs/environments-kvm.md): host, lab and ssh (KvmHostFields)
    remote_dir: RemoteDir = Field("/var/tmp/rtvirt",
                            description="directory on a KVM host for the guest images (cached by content) and each "
                                        "QEMU's sockets and disk")
    # KVM's real-time settings (docs/environments-kvm.md: what the guides prescribe)
    iothreads: int = Field(0, ge=0, le=8, description="QEMU I/O threads (-object iothread) serving the guest's "
                                                      "disk, placed on iothread_cpus")
    iothread_cpus: CpuList | None = Field(None, description="host CPUs of the I/O threads (default: emulator_cpus)")
    mem_lock: bool = Field(False, description="-overcommit mem-lock=on: the guest's memory locked in host RAM "
                                              "(no page faults to swap)")
    cpu_pm: bool = Field(False, description="-overcommit cpu-pm=on: the guest's HLT/MWAIT/PAUSE run without a VM "
                                            "exit (KVM only; for vCPUs that own their pCPU)")
    guest_idle: GuestIdle = Field("default", description="the Linux guest's idle loop: default, poll (idle=poll: "
                                                         "never halts, no wake-up exit) or haltpoll "
                                                         "(cpuidle-haltpoll: polls a while before it halts)")
    # the guest's architecture (docs/baremetal.md): aarch64 is QEMU's virt board, emulated unless the host is one
    arch: Literal["x86_64", "aarch64"] = Field("x86_64", description="the guest's CPU architecture")
    gic_version: Literal[2, 3] = Field(2, description="aarch64: the virt board's GIC (2: the study's GIC-400)")

    @model_validator(mode="after")
    def _guest_can_boot(self) -> QemuConfig:
        if self.guest == "baremetal" and self.vcpus != 1:
            raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
        if self.arch != "x86_64" and self.guest != "baremetal":
            raise ValueError(f"arch: an {self.arch} guest is the bare-metal one for now (guest = 'baremetal'); "
                             "the Linux guest images are x86_64")
        if self.arch != native_arch() and self.accel == "kvm" and not self.remote:
            raise ValueError(f"accel: KVM runs {native_arch()} guests here; an {self.arch} guest is emulated "
                             "(accel = 'tcg' or 'auto')")
        if self.remote and self.pin and self.vcpu_sched.policy == "deadline":
            raise ValueError("vcpu_sched: pinned SCHED_DEADLINE vCPUs need an exclusive cpuset on their host, which "
                             "rtvirt makes only on this machine; on a KVM host use policy \"fifo\" or pin = false")
        if self.guest == "baremetal" and self.guest_idle != "default":
            raise ValueError("guest_idle: the bare-metal guest has its own idle loop (guest_idle = \"default\")")
        return self
