"""The libvirt environment: a domain defined from our XML, started paused, its streams opened, then resumed."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError, RunError
from ...explain.clocksync import CLOCK_PORT
from ...explain.guest_channel import GUEST_TRACE_FILE, GUEST_TRACE_PORT
from ...explain.vcpus import forget_vcpus, register_vcpus
from ...procs import process_start_time
from .. import baremetal
from ..base import Environment, EnvironmentConfig, Launched, SharedResources
from ..guest_image import (
    COPY_DISK,
    COPY_DISK_BYTES,
    GUEST_AGENT_DIR,
    GuestJob,
    beside_job,
    guest_description,
    guest_image,
    guest_port_device,
    guest_port_path,
    job_archive,
)
from ..kvmlab.config import LAB_HOST, LOCAL_HOST
from ..qemu import ACK_PORT, OUTPUT_PORT, TCG_WARNING, choose_accel
from .config import LibvirtConfig
from .connection import DOMAIN_PREFIX, LibvirtConnection, _connection, _error_text, _libvirt, _version
from .domain_xml import BAREMETAL_CHANNEL, OWNER_NS, XML_LIMIT
from .host import MEMLOCK_OVERHEAD_MIB, _v1_cpu_controller, hugepage_problem
from .reach import host_link, libvirtd_address
from .rt_throttling import RT_REFUSED, RtThrottlingLifted, _rt_refusal_diagnosis
from .streams import RunningDomain
from .teardown import LibvirtTeardown, _destroy_and_undefine

if TYPE_CHECKING:
    from ...explain.config import ExplainConfig
    from ...explain.model import TraceSource
    from ...remote.connection import SshConnection

VOLUME_SUFFIXES = (".initrd", ".copy")  # a domain's own volumes in the pool: its initramfs, its stream's copy
MEMLOCK_REFUSED = "cannot limit locked memory"  # libvirt's message when QEMU's RLIMIT_MEMLOCK cannot be raised


class LibvirtEnvironment(LibvirtTeardown):
    kind = "libvirt"

    config_model = LibvirtConfig

    on_host = False
    setup_part = "libvirt"

    config: LibvirtConfig

    @staticmethod
    def available() -> str | None:
        if importlib.util.find_spec("libvirt") is None:
            return "libvirt-python is not installed (run scripts/setup.sh)"
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        assert isinstance(config, LibvirtConfig)
        if config.host == LAB_HOST:
            from ..kvmlab import reclaim_kvm_labs

            return reclaim_kvm_labs()  # a lab's domains died with its QEMU
        libvirt = _libvirt()
        uri, place = libvirtd_address(config, shared)
        connection = _connection(shared, uri, place)
        removed = []
        me = socket.gethostname()[:64]
        for domain in connection.conn.listAllDomains(0):
            name = str(domain.name())
            if not name.startswith(DOMAIN_PREFIX):
                continue
            try:
                owner = ET.fromstring(domain.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, OWNER_NS, 0))
                host, pid, started = owner.get("host"), int(owner.get("pid", "0")), owner.get("started", "")
            except (libvirt.libvirtError, ET.ParseError, ValueError):
                continue  # not ours to judge: no owner record
            if host != me or (started and process_start_time(pid) == started):
                continue  # another machine's campaign, or one still running
            _destroy_and_undefine(domain, uri)
            for suffix in VOLUME_SUFFIXES:
                connection.delete_volume(f"{name}{suffix}")
            removed.append(f"libvirt domain {name} ({place})")
        # an initrd or stream copy whose domain is gone (its run lost libvirtd): a domain is defined before its
        # volumes exist, so a running campaign's volumes always have their domain
        defined = {str(domain.name()) for domain in connection.conn.listAllDomains(0)}
        for volume in connection.pool().listVolumes():
            of_domain = next((volume.removesuffix(s) for s in VOLUME_SUFFIXES if volume.endswith(s)), None)
            if volume.startswith(DOMAIN_PREFIX) and of_domain is not None and of_domain not in defined and \
                    connection.delete_volume(volume):
                removed.append(f"libvirt volume {volume} ({place})")
        if config.local and os.geteuid() == 0:
            restored = RtThrottlingLifted.restore_after_kill()
            if restored:
                removed.append(restored)
        return removed

    def start(self) -> None:
        if self.config.host == LAB_HOST:
            self.kvm_lab().ensure_alive()
        try:
            self._start()
        except RunError as exc:
            raise self._lab_failure(exc) from None

    def platform_lost(self, failure: str) -> str | None:
        return self._lab.lost(failure, self.workdir) if self._lab is not None else None

    def _lab_failure(self, exc: RunError) -> RunError:
        return exc if self._lab is None else self._lab.blamed(exc, self.workdir)

    def _start(self) -> None:
        connection = self._conn()
        if not self._versions:
            with contextlib.suppress(Exception):
                # libvirtd's library, and the client library this process talks to it with
                self._versions = {"libvirt": _version(connection.conn.getLibVersion()),
                                  "libvirt_client": _version(_libvirt().getVersion()),
                                  "hypervisor": _version(connection.conn.getVersion())}
        if not self._type:
            self._type = self._choose_type(connection)
        if (self._rt is None and self._realtime_vcpus() and self.config.rt_throttling == "lift"
                and self.config.local and os.geteuid() == 0 and _v1_cpu_controller() is not None):
            self._rt = self.shared.get("libvirt:rt-throttling", RtThrottlingLifted)

    def _cpu_behind(self) -> str:
        """What really executes the guest's instructions: in a KVM lab under TCG, TCG (its KVM is nested in an
        emulated CPU), so the guest boots the kernel's ELF as under TCG (a bzImage's decompressor is emulated
        instruction by instruction); otherwise the domain's own accelerator."""
        if self._lab is not None and self._lab.accel.get("accel") == "tcg":
            return "tcg"
        return self._accel()

    def _choose_type(self, connection: LibvirtConnection) -> dict[str, str]:
        requested = self.config.domain_type
        if requested != "auto":
            return {"type": requested, "reason": "requested"}
        if self.config.local:
            decision = choose_accel("auto")
            return {"type": "kvm" if decision["accel"] == "kvm" else "qemu", "reason": str(decision["reason"])}
        capabilities = ET.fromstring(connection.conn.getCapabilities())
        offered = {d.get("type") for d in capabilities.iter("domain")}
        if "kvm" in offered:
            where = "the KVM lab" if self.config.host == "lab" else "the remote host"
            return {"type": "kvm", "reason": f"{where} offers KVM"}
        return {"type": "qemu", "reason": "the remote host offers no KVM"}

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        try:
            # (the domain's start can block in libvirt until its keepalive gives up: a silent lab is stopped)
            watch = self._lab.watched(f"starting a domain of {self.config.label}") if self._lab else None
            with watch or contextlib.nullcontext():
                return self._launch(agent, args, out)
        except RunError as exc:
            raise self._lab_failure(exc) from None
        except _libvirt().libvirtError as exc:  # the connection failed midway: libvirtd, or the lab it runs in, died
            what = f"starting {self._name or self.config.label}"
            failed = (self._connection.failure(what, exc) if self._connection is not None
                      else RunError(f"libvirt ({self.libvirtd}): {what}: {_error_text(exc)}"))
            raise self._lab_failure(failed) from None

    def _launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        self.start()
        self._out = out
        connection = self._conn()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.config.hugepages and self.config.local:
            problem = hugepage_problem(self.config.memory)
            if problem:
                raise RunError(f"libvirt: {problem}")
        self._name = f"{DOMAIN_PREFIX}{self.config.label}-{uuid.uuid4().hex[:8]}"
        if self.config.guest == "baremetal":
            channel, definition, initrd = self._baremetal_definition(connection, agent, args, out)
        else:
            channel, definition, initrd = self._linux_definition(connection, agent, args, out)
        self._define_and_start(connection, definition, initrd)
        self._watch_qemu_shutdown()
        self._place_for_tracing()
        self._open_stream(None, self._console_file, self._console)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._channel_reader = self._open_stream(channel, out, None)
            if self._guest_trace_files is not None:
                self._open_stream(GUEST_TRACE_PORT, self.workdir / GUEST_TRACE_FILE, None)
        self._domain.resume()
        self._launched_at = time.monotonic()
        return Launched(RunningDomain(self), out, confirm=self._confirm_delivery if out is not None else None)

    def _baremetal_definition(self, connection: LibvirtConnection, agent: str, args: list[str],
                              out: Path | None) -> tuple[str, str, None]:
        """Our own kernel (multiboot): no initrd, the probe's argv on <cmdline>. The output channel, the XML."""
        # a probe waits for the host's confirmation on its console before it leaves the VM (with it the pty
        # that holds what libvirt has not read yet)
        confirm = ["--confirm=virtio"] if out is not None and agent == "rtvirt-probe" else []
        self._baremetal_cmdline = baremetal.command_line(agent, [*args, *confirm])
        definition = self._domain_xml(connection.kernel(baremetal.kernel_path(self.config.arch)), None,
                                      out is not None)
        return BAREMETAL_CHANNEL, definition, None

    def _linux_definition(self, connection: LibvirtConnection, agent: str, args: list[str],
                          out: Path | None) -> tuple[str, str, Path]:
        """A Linux guest whose initramfs runs the agent, its output on virtio ports: the channel, the XML, the
        initramfs to upload."""
        image = self._image = guest_image(self.config.guest, self.config.arch)
        argv = [f"{GUEST_AGENT_DIR}/{agent}", *args]
        devices = []
        if out is not None:
            argv += [f"--out={guest_port_path(OUTPUT_PORT)}", f"--confirm={guest_port_path(ACK_PORT)}"]
            devices = [guest_port_device(OUTPUT_PORT), guest_port_device(ACK_PORT)]
            if self.config.stream_copy:
                argv.append(f"--tee=/dev/{COPY_DISK}")
                devices.append(COPY_DISK)
                self._copy_volume = f"{self._name}.copy"
            if self._vm_source is not None:
                devices.append(guest_port_device(CLOCK_PORT))
            if self._guest_trace_files is not None:
                devices.append(guest_port_device(GUEST_TRACE_PORT))
        else:
            self._guest_trace_files = None  # no stream, no run to explain
        initrd = image.initramfs_with_jobs(job_archive(GuestJob(argv), self._beside, devices, self._guest_trace_files),
                                           self.workdir)
        self._initrd_volume = f"{self._name}.initrd"
        definition = self._domain_xml(connection.kernel(image.boot_kernel(self._cpu_behind())),
                                      connection.volume_path(self._initrd_volume), out is not None)
        return OUTPUT_PORT, definition, initrd

    def _define_and_start(self, connection: LibvirtConnection, definition: str, initrd: Path | None) -> None:
        """Define the domain, give it its volumes and start it paused (streams open before the guest runs)."""
        libvirt = _libvirt()
        try:
            # defined before its initrd exists, so that reclaim never sees a volume without its domain
            self._domain = connection.conn.defineXML(definition)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt ({self.libvirtd}) rejected the domain: {_error_text(exc)}") from None
        self._applied_xml = str(self._domain.XMLDesc(0))[:XML_LIMIT]
        if initrd is not None:
            connection.upload(self._initrd_volume, initrd)
        if self._copy_volume:
            connection.sparse_volume(self._copy_volume, COPY_DISK_BYTES)
        try:
            self._domain.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
        except libvirt.libvirtError as exc:
            raise self._start_refused(exc) from None
        self._applied_xml = str(self._domain.XMLDesc(0))[:XML_LIMIT]

    def _start_refused(self, exc: Exception) -> RunError:
        """Why libvirtd could not start the domain, with what to change where the cause is known."""
        if RT_REFUSED in str(exc):
            return RunError(_rt_refusal_diagnosis(self.libvirtd, self.config.local))
        if MEMLOCK_REFUSED in str(exc):
            return RunError(
                f"libvirt ({self.libvirtd}) could not lock guest memory (memory_locked = true): raising QEMU's "
                f"RLIMIT_MEMLOCK to {self.config.memory + MEMLOCK_OVERHEAD_MIB} MiB needs CAP_SYS_RESOURCE, "
                "which libvirtd lacks there (a container or a restricted capability bounding set: see CapBnd "
                "in /proc/<libvirtd pid>/status); give libvirtd that capability or set memory_locked = "
                f"false ({_error_text(exc)})")
        return RunError(f"libvirt ({self.libvirtd}) could not start {self._name}: {_error_text(exc)}")

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        self._beside.append(beside_job(self.config.label, self.config.guest, self._domain is not None, agent, args))

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The VM layer (explain.vm) on the domain's host CPUs, under KVM the KVM layer there (explain.kvm), and
        the guest layer (explain.guest), which comes on a channel of the domain's wherever it runs. A remote host's
        CPUs are traced through an SSH connection to it: the lab's, or one to ``host = "user@host"`` (a raw
        ``qemu+ssh://`` URI names no target of ours to connect to: the guest layer only)."""
        from ...explain.remote import RemoteTracefs
        from ...explain.sources import kvm_source, vm_source  # numpy and the tracer: only for an explained run
        from .tracing import make_clock_pipes

        guest = self._guest_trace_sources(config)
        if "vm" not in config.layers or (not self.config.local and self.config.host == LOCAL_HOST):
            return guest
        self.start()
        host = self._kvm_host()
        access = None if host is None else RemoteTracefs(host, host.label)
        vcpu_cpus = tuple(sorted(set(self._host_cpus()[:self.config.vcpus]))) if self.config.pin \
            else tuple(self._online_cpus())
        kvm = "kvm" in config.layers and self._accel() == "kvm"
        no_clock = "the bare-metal guest takes no part in the clock exchange" if self.config.guest == "baremetal" \
            else None
        self._vm_source = vm_source(self.config.label, vcpu_cpus, self._accel(), config, no_clock, access=access,
                                    exits=False if kvm else None)
        self._kvm_source = kvm_source(self.config.label, vcpu_cpus, config, no_clock, access=access) if kvm else None
        if host is not None and no_clock is None:
            self._clock_pipes = make_clock_pipes(host)
        return [self._vm_source, *([self._kvm_source] if self._kvm_source else []), *guest]

    def _kvm_host(self) -> SshConnection | None:
        """The connection to the domain's host for tracing it: None for this host (reach.host_link)."""
        link = host_link(self.config, self.shared)
        return None if link is None else link.connection()

    def start_stressor(self, stressor: str, params: dict[str, Any], engine: str) -> Any:
        """Same-core/other-core stressors run where the vCPUs' pCPUs are: on the domain's host (over SSH for the
        lab or a remote host, as the qemu kind runs them on a KVM host)."""
        if self.config.local:
            return super().start_stressor(stressor, params, engine)
        link = host_link(self.config, self.shared)
        if link is None:
            raise InputError(f"environment {self.config.label}: a stressor beside a domain at {self.config.uri} "
                             "would run on this machine, not its host; give the host as host = \"user@host\"")
        from ...remote.stressor import start_over_link

        running = start_over_link(link, stressor, params, engine, f"the KVM host {link.target.label}")
        self._stressors.append(running)
        return running

    def _guest_trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The guest layer (explain.guest), as in the qemu environment; the trace comes on a channel of its own."""
        from ...explain.guest import guest_layer

        sources, self._guest_trace_files = guest_layer(self.config.guest, config, self.workdir, self.config.memory,
                                                       self.config.vcpus, lambda: self._out)
        return sources

    def _place_for_tracing(self) -> None:
        """The started (paused) domain's vCPU threads, named for every explanation on this host, and the VM and
        KVM layers told them and the clock exchange before the guest runs."""
        if not self.config.local and self._vm_source is None:
            return  # (another machine's threads are named only where its trace is read)
        from .tracing import clock_exchange, qemu_pid, vcpu_threads

        try:
            self._vcpu_threads = vcpu_threads(self._domain)
        except RunError:
            if self._vm_source is None:
                return  # naming another domain's vCPUs is a courtesy; tracing this one needs them
            raise
        register_vcpus(self.config.label, self._vcpu_threads)
        if self._vm_source is None or not self._vcpu_threads:
            return
        host = self._kvm_host()
        pid = qemu_pid(next(iter(self._vcpu_threads.values())), host)
        if host is None:
            exchange: Any = clock_exchange(self._applied_xml)
        elif self._clock_pipes:
            from ...explain.clocksync import ScriptedClockExchange

            exchange = ScriptedClockExchange(host, self._clock_pipes)
            exchange.start()  # before the guest runs: its first clock line waits for it
        else:
            exchange = None
        for source in (self._vm_source, self._kvm_source):
            if source is not None:
                source.attach(pid, self._vcpu_threads, exchange)

    def close(self) -> None:
        forget_vcpus(self._vcpu_threads)
        if self._stressors:  # (on a remote host over SSH; the SSH modules are imported only then)
            from ...remote.stressor import stop_left_running

            stop_left_running(self._stressors)
        super().close()
        stem, self._clock_pipes = self._clock_pipes, ""
        if stem:  # (the domain is gone: nothing holds its FIFOs open)
            from .tracing import remove_clock_pipes

            with contextlib.suppress(RunError):
                host = self._kvm_host()
                if host is not None:
                    remove_clock_pipes(host, stem)

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        # on the measured domain's host: its lab as the scenario file says it (a duration dumped as a Python int
        # reads back as seconds, which made another lab, booted beside it, for the disturbing domains)
        where = ({"uri": self.config.uri} if self.config.host == "local" else
                 {"host": self.config.host, "lab": self.config.lab.model_dump(mode="json")}
                 if self.config.host == "lab" else {"host": self.config.host})
        config = LibvirtConfig.model_validate({
            "kind": "libvirt", "name": f"stress-vm-{index}", **where,
            "domain_type": self._type.get("type", self.config.domain_type),
            "pin": host_cpus is not None, "cpus": host_cpus, "guest": guest, "arch": self.config.arch,
            # as large as the measured guest: a load the study ran in it (64 MB blocks) must fit in them too
            "memory": self.config.memory})
        return LibvirtEnvironment(config, self.supervisor, self.workdir / f"stress-vm-{index}", self.shared)

    def describe(self) -> dict[str, Any]:
        boot_s = None if self._ready_at is None else round(self._ready_at - self._launched_at, 2)
        lab = {"kvm_lab": self._lab.facts} if self._lab is not None else {}
        # a remote host's libvirtd is where ``libvirtd`` says: the configuration's unused default URI is not
        return {**super().describe(), **lab, "uri": self.config.uri if self.config.host == LOCAL_HOST else None,
                "libvirtd": self.libvirtd, "domain": self._name or None,
                "domain_type": self._type.get("type"), "domain_type_reason": self._type.get("reason"),
                **self._versions, "boot_seconds": boot_s,
                **guest_description(self.config.guest, self._image),
                "vcpu_cpus": list(self._host_cpus()[:self.config.vcpus]) if self.config.pin else None,
                "channel_bytes": self._channel_reader.received if self._channel_reader else None,
                "channel_end": self._channel_reader.ended or None if self._channel_reader else None,
                "rt_throttling_lifted": self._rt.describe() if self._rt is not None and self._rt.changed else None,
                "jobs_beside": [" ".join(job.argv) for job in self._beside], "domain_xml": self._applied_xml or None}

    def warnings(self) -> list[str]:
        found = []
        if self._type.get("type") == "qemu":
            found.append(TCG_WARNING.replace("the QEMU guest", "the libvirt domain (type qemu)"))
        if self._lab is not None:
            found.append(self._lab.warning())
        dropped = self._dropped_tuning()
        if dropped:
            found.append(f"libvirt dropped {', '.join(dropped)} of the requested <cputune> (see domain_xml)")
        if self._rt is not None and self._rt.changed:
            found.append(f"kernel.sched_rt_runtime_us was set to -1 (from {self._rt.was}) while real-time vCPUs "
                         "ran: cgroup v1 RT group scheduling refuses them otherwise; restored afterwards")
        return found
