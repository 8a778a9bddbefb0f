"""Where a KVM environment's guests run (``host``) and the machine of a KVM lab (``lab``): the fields the ``qemu``
and ``libvirt`` kinds share, defined once (:class:`KvmHostFields`)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ...errors import InputError
from ...remote.target import SshOptions
from ...units import duration_field

__all__ = ["LAB_HOST", "LOCAL_HOST", "KvmHost", "KvmHostFields", "KvmLabConfig"]

LOCAL_HOST = "local"  # this machine
LAB_HOST = "lab"  # a KVM lab booted for the campaign


def _a_kvm_host(value: str) -> str:
    """``local``, ``lab``, or a KVM host over SSH as a target names one: user@host[:port] or an ~/.ssh/config
    alias (remote.target.parse_target's rules: nothing a shell would care about)."""
    if value in (LOCAL_HOST, LAB_HOST):
        return value
    from ...remote.labgrid import is_labgrid
    from ...remote.target import parse_target

    if is_labgrid(value):
        raise ValueError("a KVM host is local, lab, user@host[:port] or an ~/.ssh/config alias (labgrid places are "
                         "for ssh targets)")
    try:
        parse_target(value, option="host")
    except InputError as exc:
        raise ValueError(str(exc).removeprefix("option host: ")) from None
    return value


KvmHost = Annotated[str, StringConstraints(max_length=330), AfterValidator(_a_kvm_host)]


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


class KvmHostFields(BaseModel):
    """Where the guests run: this machine, the KVM lab, or a KVM host over SSH; and the lab's machine."""

    host: KvmHost = Field(LOCAL_HOST, description='where the guests run: "local" (this machine), "lab" (a KVM lab '
                                                  'booted in QEMU for the campaign) or "user@host[:port]" / an '
                                                  '~/.ssh/config alias (a KVM host over SSH, its host key verified '
                                                  'against known_hosts)')
    lab: KvmLabConfig = Field(default_factory=lambda: KvmLabConfig.model_validate({}),
                              description='the emulated machine of the KVM lab (host = "lab")')
    ssh: SshOptions = Field(default_factory=SshOptions,  # type: ignore[arg-type]
                            description="how to reach a KVM host over SSH (identity_file, known_hosts, ssh_config, "
                                        "proxy_jump, connect_timeout)")

    @model_validator(mode="after")
    def _lab_table_needs_the_lab(self) -> Any:
        if self.host != LAB_HOST and "lab" in self.model_fields_set:
            raise ValueError('lab: the lab table sets up a KVM lab, which host = "lab" boots; add host = "lab"')
        return self

    @model_validator(mode="after")
    def _ssh_needs_a_host_over_ssh(self) -> Any:
        if self.host in (LOCAL_HOST, LAB_HOST) and "ssh" in self.model_fields_set:
            raise ValueError(f"ssh: host = {self.host!r} is not reached over SSH by your options (the lab's own key "
                             "and pinned host key reach it); ssh is for host = \"user@host[:port]\"")
        return self

    @property
    def remote(self) -> bool:
        """The guests run on another machine (the lab or a KVM host over SSH)."""
        return self.host != LOCAL_HOST
