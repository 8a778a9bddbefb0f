"""Where a KVM environment's guests run (``host``) and the machine of a KVM lab (``lab``): the fields the ``qemu``
and ``libvirt`` kinds share."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...units import duration_field

__all__ = ["HOST_PATTERN", "KvmLabConfig", "host_field", "lab_field"]

# "local" (this machine), "lab" (a KVM lab booted for the campaign) or user@host[:port] (a KVM host over SSH)
HOST_PATTERN = r"^(local|lab|[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}@[A-Za-z0-9_.%-]{1,253}(:[0-9]{1,5})?)$"


class KvmLabConfig(BaseModel):
    """The machine QEMU emulates for a KVM lab: its CPUs (each a pCPU of the lab's KVM), memory and accelerator.
    Its architecture is the environment's ``arch`` (the guests'), its machine that architecture's entry of
    ``arch.LAB_ARCHES``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pcpus: int = Field(2, ge=1, le=8, description="CPUs of the emulated machine (the lab's KVM's pCPUs)")
    memory: int = Field(3072, ge=1024, le=16384, description="memory of the emulated machine in MiB")
    accel: Literal["auto", "kvm", "tcg"] = Field("auto", description="QEMU accelerator of the lab itself "
                                                                    "(auto: KVM if it helps)")
    boot_timeout: duration_field("s") = Field(300_000_000_000, ge=10_000_000_000,  # type: ignore[valid-type]
                                              description="time the lab may take to come up (its sshd and "
                                                          "libvirtd answering)")

    def key(self, arch: str) -> str:
        """Environments of one architecture whose lab tables are equal share one boot (SharedResources)."""
        return f"kvm-lab:{arch}:" + json.dumps(self.model_dump(mode="json"), sort_keys=True)


def host_field() -> Any:
    return Field("local", pattern=HOST_PATTERN, max_length=330,
                 description='where the guests run: "local" (this machine), "lab" (a KVM lab booted in QEMU '
                             'for the campaign) or "user@host[:port]" (a KVM host over SSH)')


def lab_field() -> Any:
    return Field(default_factory=lambda: KvmLabConfig.model_validate({}),
                 description='the emulated machine of the KVM lab (host = "lab")')
