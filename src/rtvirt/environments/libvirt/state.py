"""One libvirt domain's state and where its vCPUs and QEMU's other threads go: the base the libvirt
environment's parts (domain XML, streams, teardown, domain) build on, each in its own module."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...params import parse_cpulist
from ..base import Environment
from ..guest_image import GuestImage, GuestJob
from ..qemu import default_emulator_cpus
from .config import LibvirtConfig, parse_cputune
from .connection import LibvirtConnection, _libvirt
from .reach import libvirtd_address
from .rt_throttling import RtThrottlingLifted
from .stream_reader import _StreamToFile

if TYPE_CHECKING:
    from ..kvmlab import KvmLab


class LibvirtDomainState(Environment):
    """A domain of a libvirt environment: its connection, its streams and its host CPUs."""

    config: LibvirtConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection: LibvirtConnection | None = None
        self._domain: Any = None
        self._name = ""
        self._type: dict[str, str] = {}
        self._initrd_volume = ""
        self._copy_volume = ""  # the guest's disk with the copy of its stream (stream_copy)
        self._guest_trace_files: dict[str, bytes] | None = None  # an explained Linux guest traces itself
        self._out: Path | None = None  # the run's stream (the guest layer reads its samples' aux)
        self._beside: list[GuestJob] = []  # "inside" stressors: background jobs beside the workload
        self._baremetal_cmdline = ""
        self._readers: list[_StreamToFile] = []
        self._channel_reader: _StreamToFile | None = None
        self._ack_stream: Any = None  # the end-of-stream confirmation's way to the guest, once given
        self._console = bytearray()
        self._console_file = self.workdir / "console.log"
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._qemu_stop_watches: list[int] = []  # callbacks of QEMU's RESET and SHUTDOWN events (streams.py)
        self._qemu_stop: tuple[str, str] | None = None  # the first of those events QEMU sent, and its reason
        self._applied_xml = ""
        self._rt: RtThrottlingLifted | None = None
        self._versions: dict[str, str] = {}
        self._image: GuestImage | None = None
        self._vm_source: Any = None  # explain.vm.VmSource of an explained run (trace_sources)
        self._kvm_source: Any = None  # explain.kvm.KvmSource of an explained run under KVM
        self._clock_pipes = ""  # on a KVM host over SSH: the stem of the clock channel's FIFOs there
        self._stressors: list[Any] = []  # same-core/other-core stressors on a remote host, over SSH
        self._vcpu_threads: dict[int, int] = {}
        self._lab: KvmLab | None = None  # the campaign's KVM lab (host = "lab")
        self._online: list[int] | None = None  # the host's online CPUs (a remote host's, read once)
        self.libvirtd = self.config.uri  # where the domain's libvirtd is, for messages (a remote host's: ``uri``)

    @property
    def uri(self) -> str:
        """The URI of the libvirtd the domain lives in: the configuration's, or the remote host's forwarded over
        its SSH link (reach.py; a lab booted on first use)."""
        if self.config.host == "lab":
            self.kvm_lab()
        uri, self.libvirtd = libvirtd_address(self.config, self.shared)
        return uri

    def kvm_lab(self) -> KvmLab:
        """The campaign's boot of the KVM lab this environment names (host = "lab")."""
        if self._lab is None:
            from ..kvmlab import open_kvm_lab

            self._lab = open_kvm_lab(self.config.lab, self.config.arch, self.shared)
        return self._lab

    def _online_cpus(self) -> list[int]:
        if self.config.local:
            return sorted(os.sched_getaffinity(0))
        if self._online is None:  # read once: the domain's description after its run needs no live connection
            connection = self._conn()
            try:
                _, online, _ = connection.conn.getCPUMap(0)
            except _libvirt().libvirtError as exc:
                raise connection.failure("reading the host's CPUs", exc) from None
            self._online = [cpu for cpu, up in enumerate(online) if up]
        return self._online

    def platform_cpus(self) -> tuple[int, ...]:
        """Where same-core/other-core disturbing domains may run: the CPUs of the host whose libvirtd runs the
        domain (a KVM lab's, a remote host's), as its vcpupin numbers them."""
        return tuple(self._online_cpus())

    def _host_cpus(self) -> tuple[int, ...]:
        """Host CPUs for vCPU i = the i-th of these (cycling); default: the last CPU first, then downwards."""
        if self.config.cputune is not None:
            pins = {int(p.get("vcpu", "0")): parse_cpulist(p.get("cpuset", ""))[0]
                    for p in parse_cputune(self.config.cputune).findall("vcpupin")}
            if pins:
                return tuple(pins.get(i, pins[min(pins)]) for i in range(self.config.vcpus))
        allowed = sorted(self._online_cpus(), reverse=True)
        if not self.config.pin:
            return tuple(sorted(allowed))
        return tuple(self.config.cpus) if self.config.cpus else tuple(allowed[:self.config.vcpus])

    def measured_cpus(self) -> tuple[int, ...]:
        # the workload runs on vCPU 0 (other vCPUs serve helpers such as the wakeup probe's sender)
        return self._host_cpus()[:1] if self.config.pin else self._host_cpus()

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def emulator_cpus(self) -> tuple[int, ...]:
        if self.config.emulator_cpus:
            return tuple(self.config.emulator_cpus)
        return default_emulator_cpus(self._host_cpus()[:self.config.vcpus], self._online_cpus())

    def _realtime_vcpus(self) -> bool:
        if self.config.cputune is not None:
            return any(s.get("scheduler") in ("fifo", "rr")
                       for s in parse_cputune(self.config.cputune).findall("vcpusched"))
        return self.config.vcpu_sched.policy in ("fifo", "rr")

    def _conn(self) -> LibvirtConnection:
        # each domain has its own connection, closed with it: its streams never queue behind another
        # domain's on one client, and no connection (an SSH session for remote URIs) outlives its run
        if self._connection is None:
            uri = self.uri
            self._connection = LibvirtConnection(uri, lab=self.config.host == "lab", place=self.libvirtd)
        return self._connection
