"""The qemu environment: a guest booted paused, its threads placed, then let run; here or on a KVM host.

The guest boots our initramfs (guest_image.py) and runs the agent as its main job; the agent's stream leaves the
guest through a virtio-serial port whose host side reaches the run's stream file as the samples are taken (here
the chardev file is that file; on a KVM host over SSH a FIFO copied live over the connection: where.py). QEMU
starts paused (-S): over QMP we find each vCPU's thread (query-cpus-fast), pin it to its host CPU and give it its
policy, pin every other QEMU thread (the emulator, the I/O threads) to their CPUs, read back what the guest's CPU
got (realtime.py), and only then let the guest run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import RunError
from ...explain.clocksync import CLOCK_PORT
from ...explain.guest_channel import GUEST_TRACE_FILE, GUEST_TRACE_PORT
from ...explain.vcpus import forget_vcpus, register_vcpus
from .. import baremetal
from ..base import Environment, Launched, SharedResources
from ..console_log import bound_console_file
from ..guest_image import (
    COPY_DISK,
    COPY_DISK_BYTES,
    GUEST_AGENT_DIR,
    LINUX_COMMAND_LINE,
    LINUX_GUEST_PORTS,
    READY_MARK,
    GuestImage,
    GuestJob,
    agent_failure,
    beside_job,
    delivery_said,
    guest_description,
    guest_image,
    guest_port_device,
    guest_port_path,
    job_archive,
)
from ..kvmlab.config import LAB_HOST, LOCAL_HOST
from ..tcg_clock import clock_failure, tsc_kernel_args
from .accel import QEMU, TCG_WARNING, read_console
from .config import QemuConfig
from .deadline import DeadlineCpuset, apply_once_moved
from .realtime import RealtimeOptions, cpu_readback, realtime_options
from .where import LocalQemuHost, QemuHost, QemuProcess, RemoteQemuHost, ThreadPlace, Workspace

if TYPE_CHECKING:
    from ...explain.config import ExplainConfig
    from ...explain.kvm import KvmSource
    from ...explain.model import TraceSource
    from ...explain.vm import VmSource
    from ...procs import Supervisor
    from ...remote.target import SshTarget
    from ..kvmlab.lab import KvmLab

__all__ = ["ACK_PORT", "OUTPUT_PORT", "QemuEnvironment", "default_emulator_cpus", "open_qemu_host",
           "qemu_stressor_guest"]

OUTPUT_PORT = "rtvirt.out"
ACK_PORT = "rtvirt.ack"  # host to guest: the end-of-stream confirmation the agent waits for
ACK_CONNECT_TIMEOUT_S = 5.0
LOST_NOTICE_S = 5.0  # time QEMU's SSH session gets to notice its connection went (asyncssh: at once)
QBOOT = "/usr/share/qemu/qboot.rom"  # Debian's qemu-system-data (in the KVM lab's root)
QMP_CONNECT_TIMEOUT_S = 90.0  # QEMU loads the kernel and initramfs before QMP answers: seen past 30 s at load 18


def default_emulator_cpus(vcpu_cpus: Iterable[int], online: Iterable[int]) -> tuple[int, ...]:
    """Where QEMU's threads other than the vCPUs go unless emulator_cpus says: the online CPUs no vCPU is pinned
    to, so that no device emulation or I/O thread preempts any vCPU; if every CPU carries a vCPU, the vCPUs' own.
    The qemu and libvirt environments share this rule (docs/scenarios.md)."""
    pinned = set(vcpu_cpus)
    return tuple(c for c in sorted(online) if c not in pinned) or tuple(sorted(pinned))


def qemu_stressor_guest(env: Environment, index: int, host_cpus: tuple[int, ...] | None,
                        guest: str = "linux") -> Environment:
    """A QEMU guest disturbing ``env`` from beside it ("other-vm" of the kinds on this host: host, partition,
    qemu; a qemu guest's on its own KVM host), placed on ``host_cpus`` (None: unpinned), running ``guest``."""
    # as large as the measured guest: a load the study ran in it (64 MB blocks) must fit in them too
    memory = getattr(env.config, "memory", None)
    where: dict[str, Any] = {}
    if isinstance(env.config, QemuConfig):  # on the KVM host (the lab) of the measured guest
        # (as the scenario file says them: a duration dumped as a Python int reads back as seconds, which made
        # another lab, booted beside the measured guest's, for its disturbing guests)
        where = env.config.model_dump(mode="json", include={"host", "remote_dir", "lab" if env.config.host == LAB_HOST
                                                            else "ssh"} if env.config.host != LOCAL_HOST else {"host"})
    # a bare-metal stressor guest is of the measured guest's architecture (an aarch64 study's competing domains)
    board = {"arch": env.config.arch, "gic_version": env.config.gic_version} \
        if guest == "baremetal" and isinstance(env.config, QemuConfig) else {}
    config = QemuConfig.model_validate({"kind": "qemu", "name": f"stress-vm-{index}",
                                        "pin": host_cpus is not None, "cpus": host_cpus, "guest": guest,
                                        **({"memory": memory} if isinstance(memory, int) else {}), **where,
                                        **board})
    return QemuEnvironment(config, env.supervisor, env.workdir / f"stress-vm-{index}", env.shared)


def open_qemu_host(config: QemuConfig, shared: SharedResources, supervisor: Supervisor) -> QemuHost:
    """Where ``config``'s QEMU runs: this machine, or the KVM host it names (one connection per campaign)."""
    if not config.remote:
        return LocalQemuHost(supervisor)
    from ...remote.agents import TargetLink  # asyncssh and the stream code: only once a KVM host is reached
    from ...remote.target import parse_target

    if config.host == LAB_HOST:
        target = _lab_target(config, shared)
    else:
        target = parse_target(config.host, option=f"environment {config.label}: host",
                              **config.ssh.model_dump(exclude_none=True))
    return shared.get(f"kvm-host:{target.model_dump_json()}:{config.remote_dir}",
                      lambda: RemoteQemuHost(TargetLink(target, config.remote_dir)))


def _lab_target(config: QemuConfig, shared: SharedResources) -> SshTarget:
    """The KVM lab booted for this campaign, reached like any KVM host over SSH (its host key pinned)."""
    from ..kvmlab.lab import open_kvm_lab

    return open_kvm_lab(config.lab, config.arch, shared).ssh_target


class QemuEnvironment(Environment):
    kind = "qemu"
    config_model = QemuConfig
    on_host = False
    pausable = True
    config: QemuConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accel: dict[str, Any] | None = None
        self._where: QemuHost | None = None
        self._workspace: Workspace | None = None
        self._proc: QemuProcess | None = None
        self._console = self.workdir / "console.log"
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._placement: dict[str, Any] = {}
        self._realtime: dict[str, Any] = {}  # KVM's real-time settings as applied and read back
        self._options: RealtimeOptions | None = None
        self._vcpu_cpuset: DeadlineCpuset | None = None  # pinned SCHED_DEADLINE vCPUs' exclusive cpuset
        self._qmp: str | None = None  # the path here that reaches QEMU's QMP
        self._ack_path: str | None = None
        self._clock: Any = None  # the clock exchange's host half, started once QEMU is placed
        self._image: GuestImage | None = None
        self._beside: list[GuestJob] = []  # "inside" stressors: background jobs beside the workload
        self._vcpu_cpu_s: float | None = None
        self._boot_cpu_s: float | None = None  # the vCPUs' CPU time when the guest said it had booted
        self._ack: socket.socket | None = None  # the confirmation's connection to the guest's ack port
        self._copy_path = self.workdir / "stream-copy.img"
        self._copy_disk = False
        self._guest_trace_files: dict[str, bytes] | None = None  # an explained Linux guest traces itself
        self._out: Path | None = None
        self._vm_source: VmSource | None = None  # the VM layer of an explained run (trace_sources)
        self._kvm_source: KvmSource | None = None  # its KVM layer, under KVM
        self._vcpu_threads: dict[int, int] = {}
        self._stressors: list[Any] = []  # same-core/other-core stressors on a KVM host over SSH
        self._lab: KvmLab | None = None  # the campaign's KVM lab (host = "lab")

    @staticmethod
    def available() -> str | None:
        import shutil

        return None if shutil.which(QEMU) else f"{QEMU} is not installed (apt-get install qemu-system-x86)"

    @property
    def where(self) -> QemuHost:
        """The machine QEMU runs on (opened on first use; the KVM lab booted first, once per campaign)."""
        if self._where is None:
            if self.config.host == LAB_HOST:
                from ..kvmlab.lab import open_kvm_lab

                self._lab = open_kvm_lab(self.config.lab, self.config.arch, self.shared)
            self._where = open_qemu_host(self.config, self.shared, self.supervisor)
        return self._where

    def _host_cpus(self) -> tuple[int, ...]:
        """Host CPUs for vCPU i = the i-th of these (cycling); default: the last CPU first, then downwards."""
        allowed = sorted(self.where.online_cpus(), reverse=True)
        if not self.config.pin:
            return tuple(sorted(allowed))
        return tuple(self.config.cpus) if self.config.cpus else tuple(allowed[:self.config.vcpus])

    def measured_cpus(self) -> tuple[int, ...]:
        # the workload runs on vCPU 0 (other vCPUs serve helpers such as the wakeup probe's sender)
        return self._host_cpus() if not self.config.pin else self._host_cpus()[:1]

    def platform_cpus(self) -> tuple[int, ...]:
        return self.where.online_cpus()

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def emulator_cpus(self) -> tuple[int, ...]:
        if self.config.emulator_cpus:
            return tuple(self.config.emulator_cpus)
        return default_emulator_cpus(self._host_cpus()[:self.config.vcpus], self.where.online_cpus())

    def iothread_cpus(self) -> tuple[int, ...]:
        return tuple(self.config.iothread_cpus) if self.config.iothread_cpus else self.emulator_cpus()

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        self._beside.append(beside_job(self.config.label, self.config.guest, self._proc is not None, agent, args))

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        return qemu_stressor_guest(self, index, host_cpus, guest)

    def start_stressor(self, stressor: str, params: dict[str, Any], engine: str) -> Any:
        """Same-core/other-core stressors run where the vCPUs' pCPUs are: on a KVM host over SSH, as the ssh
        kind runs them on its target (our native agents, copied there)."""
        if not isinstance(self.where, RemoteQemuHost):
            return super().start_stressor(stressor, params, engine)
        from ...remote.stressor import start_over_link

        running = start_over_link(self.where.link, stressor, params, engine, f"the KVM host {self.where.label}")
        self._stressors.append(running)
        return running

    def start(self) -> None:
        where = self.where
        if self._lab is not None:
            self._lab.ensure_alive()
        if self._accel is None:
            try:
                self._accel = where.accel(self.config.accel, self.config.arch)
            except RunError as exc:
                raise self._failure(exc) from None

    def platform_lost(self, failure: str) -> str | None:
        return self._lab.lost(failure, self.workdir) if self._lab is not None else None

    def _failure(self, exc: RunError) -> RunError:
        """``exc``, or what it is a symptom of: the lab that died under it, or the KVM host's lost connection."""
        if self._lab is not None and (blamed := self._lab.blamed(exc, self.workdir)) is not exc:
            return blamed
        lost = self._connection_lost()
        return RunError(lost) if lost else exc

    def _connection_lost(self) -> str | None:
        """The run's reason once the connection to the KVM host went while QEMU ran there. A command run there
        at that moment fails first ("Connection lost", a symptom): QEMU's session, which says the connection went,
        is given LOST_NOTICE_S to see its channel close."""
        if self._proc is None or self._where is None or self._where.here:
            return None
        deadline = time.monotonic() + LOST_NOTICE_S
        while not self._proc.lost and self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self._proc.lost:
            return None
        return (f"the connection to the KVM host {self._where.label} was lost; QEMU there was ended by its "
                "watchdog; the samples received are kept")

    def trace_sources(self, config: ExplainConfig) -> list[Any]:
        """The VM layer on the vCPUs' host CPUs (explain.vm), under KVM the KVM layer there (explain.kvm), and the
        guest layer (explain.guest), those the scenario asks for; on a KVM host over SSH, its tracefs through the
        connection. With a VM or KVM layer the run's guest also exchanges clock readings with the KVM host over
        an rtvirt.clock port (explain.clocksync)."""
        from ...explain.sources import kvm_source, vm_source  # numpy and the tracer: only for an explained run

        sources: list[Any] = []
        self.start()
        assert self._accel is not None
        vcpu_cpus = tuple(sorted(set(self._host_cpus()[:self.config.vcpus]))) if self.config.pin \
            else self.where.online_cpus()
        kvm = "kvm" in config.layers and self._accel["accel"] == "kvm"
        if "vm" in config.layers:
            self._vm_source = vm_source(self.config.label, vcpu_cpus, self._accel["accel"], config,
                                        access=self._tracefs(), exits=False if kvm else None)
            sources.append(self._vm_source)
        if kvm:
            self._kvm_source = kvm_source(self.config.label, vcpu_cpus, config, access=self._tracefs())
            sources.append(self._kvm_source)
        return [*sources, *self._guest_trace_sources(config)]

    def _tracefs(self) -> Any:
        """The KVM host's tracefs: None here (this machine's), else through the campaign's connection."""
        if self.where.here:
            return None
        from ...explain.remote import RemoteTracefs

        assert isinstance(self.where, RemoteQemuHost)
        return RemoteTracefs(self.where.link.connection(), self.where.label)

    def _guest_trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The guest layer (explain.guest): a Linux guest traces its measuring vCPU itself and sends the trace
        to the host after its main job; the bare-metal guest's timer probe times its own interrupts."""
        from ...explain.guest import guest_layer

        sources, self._guest_trace_files = guest_layer(self.config.guest, config, self.workdir, self.config.memory,
                                                       self.config.vcpus, lambda: self._out)
        return sources

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        try:
            return self._launch(agent, args, out)
        except RunError as exc:
            raise self._failure(exc) from None

    def _launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        self.start()
        self._out = out
        assert self._accel is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._workspace = self.where.workspace(self.workdir, self.emulator_cpus() if self.config.pin else ())
        if self.config.guest == "baremetal":
            return self._launch_baremetal(agent, args, out)
        image = self._image = guest_image(self.config.guest)
        argv = [f"{GUEST_AGENT_DIR}/{agent}", *args]
        devices: list[str] = []
        if out is not None:
            argv += [f"--out={guest_port_path(OUTPUT_PORT)}", f"--confirm={guest_port_path(ACK_PORT)}"]
            devices += [guest_port_device(OUTPUT_PORT), guest_port_device(ACK_PORT)]
            if self.config.stream_copy:
                argv.append(f"--tee=/dev/{COPY_DISK}")
                devices.append(COPY_DISK)
            if self._vm_source is not None or self._kvm_source is not None:
                devices.append(guest_port_device(CLOCK_PORT))
        trace_files = self._guest_trace_files if out is not None else None  # no stream, no run to explain
        if trace_files is not None:
            devices.append(guest_port_device(GUEST_TRACE_PORT))
        jobs = job_archive(GuestJob(argv), self._beside, devices, trace_files)
        command = self._linux_command(image, jobs) + self._ports(out, trace_files is not None)
        self._start_qemu(command)
        return Launched(self._proc, out, confirm=self._confirm_delivery if out is not None else None)  # type: ignore[arg-type]

    def _common_command(self, smp: int) -> list[str]:
        """QEMU paused (-S), its console, QMP and KVM's real-time settings (realtime.py)."""
        assert self._accel is not None and self._workspace is not None
        options = self._options = realtime_options(self.config, self._accel)
        self._realtime = {"cpu_model": options.cpu, **options.record, "iothreads": options.iothreads}
        qmp, self._qmp = self._workspace.socket("qmp")
        arch, accel = self.config.arch, self._accel["accel"]
        return [baremetal.qemu_binary(arch), *baremetal.machine_args(arch, accel, self.config.gic_version),
                "-accel", accel, "-cpu", baremetal.guest_cpu(arch, accel) or options.cpu,
                "-smp", str(smp), "-m", str(self.config.memory), "-display", "none", "-nodefaults", "-no-reboot", "-S",
                # threads named after their role ("CPU 0/TCG", "worker"): what an explanation names
                "-name", f"{self.config.label},debug-threads=on",
                "-chardev", self._workspace.output("rtvirtcon", self._console),
                *baremetal.console_args(arch, "rtvirtcon"),
                "-qmp", f"unix:{qmp},server=on,wait=off", *options.argv]

    def _linux_command(self, image: GuestImage, jobs: bytes) -> list[str]:
        assert self._accel is not None and self._workspace is not None
        common = self._common_command(self.config.vcpus)
        assert self._options is not None
        return [*common, *self._firmware(),
                "-kernel", self._workspace.stage(image.boot_kernel(self._cpu_behind())),
                "-initrd", self._workspace.initramfs(image.initramfs, jobs, self.workdir),
                "-append", " ".join([LINUX_COMMAND_LINE, *self._options.kernel_args, *self._tsc_args()]),
                "-device", f"virtio-serial-pci,max_ports={LINUX_GUEST_PORTS}"]

    def _tsc_args(self) -> list[str]:
        """The guest kernel's TSC rate where it is this host's counter (tcg_clock), recorded."""
        assert self._accel is not None
        args = tsc_kernel_args(self.config.arch, self._accel["accel"], self.where.here)
        self._realtime["guest_tsc"] = args[0] if args else "the guest's own"
        return args

    def _firmware(self) -> list[str]:
        """The firmware a Linux guest boots through, recorded: QEMU's default (SeaBIOS), but in a KVM lab under TCG
        qboot, which loads the kernel without SeaBIOS's device probing, each of whose port accesses is a nested
        exit there (0.5-0.7 s less from QEMU's start to the kernel's, measured in the lab)."""
        if self._lab is None or self._lab.accel.get("accel") != "tcg" or self.config.arch != "x86_64":
            self._realtime["firmware"] = "QEMU's default"
            return []
        self._realtime["firmware"] = f"qboot ({QBOOT}): the KVM lab is nested under TCG"
        return ["-bios", QBOOT]

    def _cpu_behind(self) -> str:
        """What really executes the guest's instructions, whose kernel file the guest boots (GuestImage.boot_kernel:
        the ELF under TCG, the bzImage under KVM, 8 MB to copy to a KVM host against 66 MB), recorded as
        ``realtime.kernel_file``. In a KVM lab under TCG that is TCG (its KVM is nested in an emulated CPU): a
        bzImage's decompressor would be emulated instruction by instruction, so the guest boots the ELF."""
        assert self._accel is not None
        behind = "tcg" if self._lab is not None and self._lab.accel.get("accel") == "tcg" else self._accel["accel"]
        self._realtime["kernel_file"] = "ELF (PVH entry)" if behind == "tcg" else "bzImage"
        return str(behind)

    def _ports(self, out: Path | None, traced: bool) -> list[str]:
        """The stream's port, the confirmation's, the clock's and the guest trace's; the stream copy's disk."""
        assert self._workspace is not None
        if out is None:
            return []
        # the samples reach the run's file as they are taken; the confirmation comes back on a second port,
        # whose host side rtvirt connects to once it holds END
        ack, self._ack_path = self._workspace.socket("ack")
        command = ["-chardev", self._workspace.output("rtvirtout", out),
                   "-device", f"virtserialport,chardev=rtvirtout,name={OUTPUT_PORT}",
                   "-chardev", f"socket,id=rtvirtack,path={ack},server=on,wait=off",
                   "-device", f"virtserialport,chardev=rtvirtack,name={ACK_PORT}"]
        if self._vm_source is not None or self._kvm_source is not None:
            option, self._clock = self._workspace.clock("rtvirtclock")
            command += ["-chardev", option, "-device", f"virtserialport,chardev=rtvirtclock,name={CLOCK_PORT}"]
        if traced:
            command += ["-chardev", self._workspace.output("rtvirttrace", self.workdir / GUEST_TRACE_FILE),
                        "-device", f"virtserialport,chardev=rtvirttrace,name={GUEST_TRACE_PORT}"]
        if self.config.stream_copy:
            disk = self._workspace.disk(self._copy_path, COPY_DISK_BYTES)
            self._copy_disk = True
            iothread = f",iothread={self._realtime['iothreads'][0]}" if self._realtime.get("iothreads") else ""
            command += ["-drive", f"file={disk},if=none,id=rtvirtcopy,format=raw",
                        "-device", f"virtio-blk-pci,drive=rtvirtcopy{iothread}"]
        return command

    def _start_qemu(self, command: list[str]) -> None:
        assert self._workspace is not None
        self._proc = self.where.start(command, self._workspace)
        self._launched_at = time.monotonic()
        self._place_and_continue()

    def _confirm_delivery(self, records: int) -> str:
        """Tell the guest's agent how many data records the host holds (it powers off once told); returns
        what happened, for the manifest. The connection stays open until the guest is gone."""
        assert self._ack_path is not None
        self._ack = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._ack.settimeout(ACK_CONNECT_TIMEOUT_S)
            self._ack.connect(self._ack_path)
            self._ack.sendall(f"RTVIRT-ACK {int(records)}\n".encode())
        except OSError as exc:
            return f"not sent: {exc.strerror or exc}"
        return "sent"

    def _launch_baremetal(self, agent: str, args: list[str], out: Path | None) -> Launched:
        """Our own kernel: the probe's argv is its command line, the stream leaves by a virtio console (an
        explained run's clock exchange by a second one)."""
        assert self._workspace is not None
        arch = self.config.arch
        # the guest needs a stream channel even as a disturbing guest (out None): its statistics go here
        channel = out if out is not None else self.workdir / "stressor.rtvs"
        clock = None
        if out is not None and (self._vm_source is not None or self._kvm_source is not None):
            clock, self._clock = self._workspace.clock("rtvirtclock")
        command = [*self._common_command(1),
                   "-kernel", self._workspace.stage(baremetal.kernel_path(arch)),
                   "-append", baremetal.command_line(agent, args),
                   *baremetal.qemu_devices(arch, self._workspace.output("rtvirtout", channel), clock)]
        self._start_qemu(command)
        return Launched(baremetal.GuestProcess(self._proc, self._console, exit_device=arch == "x86_64"), out)

    def _monitor(self) -> Any:
        """A QMP connection to QEMU, retried while its socket comes up (or its forward is not yet usable)."""
        from qemu.qmp import ConnectError
        from qemu.qmp.legacy import QEMUMonitorProtocol

        assert self._proc is not None and self._qmp is not None
        deadline = time.monotonic() + QMP_CONNECT_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise RunError(f"qemu did not start: {self._stderr_tail()}")
            if time.monotonic() > deadline:
                raise RunError(f"qemu did not start: its QMP did not answer within {QMP_CONNECT_TIMEOUT_S:.0f} s")
            if os.path.exists(self._qmp):
                monitor = QEMUMonitorProtocol(self._qmp)
                try:
                    monitor.connect()
                    return monitor
                except (ConnectError, OSError, EOFError):  # bound a moment before QEMU listens on it (seen under load)
                    monitor.close()
            time.sleep(0.05)

    def _place_and_continue(self) -> None:
        monitor = self._monitor()
        assert self._proc is not None and self._proc.pid is not None
        try:
            cpus: list[dict[str, Any]] = list(monitor.cmd("query-cpus-fast"))  # type: ignore[call-overload]
            vcpu_threads: dict[int, int] = {int(c["cpu-index"]): int(c["thread-id"]) for c in cpus}
            iothreads = {str(t["id"]): int(t["thread-id"]) for t in monitor.cmd("query-iothreads")}  # type: ignore[union-attr]
            self._place(vcpu_threads, iothreads)
            if cpus:
                self._realtime["guest_cpu"] = cpu_readback(monitor, str(cpus[0].get("qom-path", "")))
            self._vcpu_threads = vcpu_threads
            register_vcpus(self.config.label, vcpu_threads)
            if self._clock is not None:
                self._clock.start()  # before the guest runs: its first clock line waits for it
            for source in (self._vm_source, self._kvm_source):
                if source is not None:
                    source.attach(self._proc.pid, vcpu_threads, self._clock)
            # (a guest that refuses its parameters quits at once: QEMU may be gone before it answers; how the guest
            # ended is read from its console)
            with contextlib.suppress(EOFError):
                monitor.cmd("cont")
            if self._accel and self._accel["accel"] == "kvm":
                self._realtime["tsc"] = self.where.tsc_offsets(self._proc.pid)
                if self._kvm_source is not None:
                    self._kvm_source.note_tsc(self._realtime["tsc"])
            if self.config.pin and self.config.vcpu_sched.policy == "deadline":
                for tid in vcpu_threads.values():
                    apply_once_moved(tid, self.config.vcpu_sched)
        except OSError as exc:
            raise RunError(f"qemu: QMP failed ({exc}): {self._stderr_tail()}") from None
        finally:
            with contextlib.suppress(EOFError, OSError):  # (QEMU already gone: see "cont")
                monitor.close()

    def _place(self, vcpu_threads: dict[int, int], iothreads: dict[str, int]) -> None:
        """vCPU threads on their pCPUs with their policy; I/O threads on theirs; every other thread of QEMU (the
        emulator) on emulator_cpus."""
        assert self._proc is not None and self._proc.pid is not None
        host_cpus = self._host_cpus()
        pin = self.config.pin
        partitioned = pin and self.config.vcpu_sched.policy == "deadline"
        if partitioned:  # SCHED_DEADLINE is given once the vCPUs are in their cpuset (apply_once_moved)
            self._vcpu_cpuset = DeadlineCpuset(self.config.label)
            self._vcpu_cpuset.partition(sorted({host_cpus[i % len(host_cpus)] for i in vcpu_threads}),
                                        list(vcpu_threads.values()), self._proc.pid, self.emulator_cpus())
        named = {tid: ThreadPlace((host_cpus[i % len(host_cpus)],) if pin else None,
                                  None if partitioned else self.config.vcpu_sched) for i, tid in vcpu_threads.items()}
        named.update({tid: ThreadPlace(self.iothread_cpus() if pin else None) for tid in iothreads.values()})
        emulator = self.where.place(self._proc.pid, named, self.emulator_cpus() if pin else None)
        self._placement = {
            "vcpu_threads": {str(i): {"tid": t, "host_cpu": host_cpus[i % len(host_cpus)] if self.config.pin
                                      else None} for i, t in vcpu_threads.items()},
            "emulator_threads": emulator, "emulator_cpus": list(self.emulator_cpus()),
            "iothread_threads": {name: {"tid": tid,
                                        "host_cpus": list(self.iothread_cpus()) if self.config.pin else None}
                                 for name, tid in iothreads.items()},
            "vcpu_sched": self.config.vcpu_sched.describe(),
            **({"exclusive_cpuset": self._vcpu_cpuset.notes} if self._vcpu_cpuset else {}),
        }

    def after_launch(self, launched: Launched) -> None:
        # the vCPU threads' CPU time so far (read while QEMU lives): how busy the guest kept its vCPUs
        if self._proc is None or self._proc.pid is None or self._proc.poll() is not None or self._workspace is None:
            return
        tids = [int(entry["tid"]) for entry in self._placement.get("vcpu_threads", {}).values()]
        try:
            seconds = self._workspace.cpu_seconds(self._proc.pid, tids)
        except RunError as exc:
            raise self._failure(exc) from None
        if seconds is None:  # QEMU has ended: keep the last reading
            return
        self._vcpu_cpu_s = seconds
        if self._boot_cpu_s is None and self._ready_at is not None:
            self._boot_cpu_s = self._vcpu_cpu_s

    def set_paused(self, paused: bool) -> None:
        if self._proc is None or self._proc.poll() is not None or self._qmp is None:
            raise RunError(f"{self.config.label}: the guest is not running")
        monitor = self._monitor()
        try:
            monitor.cmd("stop" if paused else "cont")
        except OSError as exc:
            raise RunError(f"qemu: QMP {'stop' if paused else 'cont'} failed ({exc})") from None
        finally:
            monitor.close()

    def _stderr_tail(self) -> str:
        if self._proc is None or self._proc.poll() is None:
            return "no error output"
        text = self._proc.error_tail()
        return (text.splitlines() or ["no error output"])[-1][:300]

    def console_text(self) -> str:
        return read_console(self._console) if self._console.exists() else ""

    def check(self) -> str | None:
        if self._proc is None:
            return None
        if self._lab is not None and not self._lab.alive():
            return f"the KVM lab stopped: {self._lab.why_stopped()}"
        if self._proc.lost:
            return self._connection_lost()
        console = self.console_text()
        if self._ready_at is None and READY_MARK in console:
            self._ready_at = time.monotonic()
        if self._ready_at is None:
            if self._proc.poll() is not None:
                return f"qemu exited before the guest booted: {self._stderr_tail()}"
            if time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
                return f"the guest did not boot within {self.config.boot_timeout / 1e9:.0f}s"
            return None
        if (clock := clock_failure(console, self._ready_at - self._launched_at)) is not None:
            return clock
        if self._proc.poll() is not None:
            if self.config.guest == "baremetal":
                failure = baremetal.failure_exception(console)
                if failure is not None:
                    raise failure  # status 2 (a parameter the guest refused) is bad input: exit 2
                return None
            return agent_failure(console)
        return None

    @property
    def booted(self) -> bool:
        return self._ready_at is not None

    def describe(self) -> dict[str, Any]:
        boot_s = None if self._ready_at is None else round(self._ready_at - self._launched_at, 2)
        where = self._where
        lab = {"kvm_lab": self._lab.facts} if self._lab is not None else {}
        return {**super().describe(), **lab, "acceleration": (self._accel or {}).get("accel"),
                "acceleration_reason": (self._accel or {}).get("reason"),
                "qemu": where.qemu_version(baremetal.qemu_binary(self.config.arch)) if where is not None else None,
                "arch": self.config.arch,
                "emulated": baremetal.emulated_machine(self.config.arch, (self._accel or {}).get("accel", "tcg"),
                                                       self.config.gic_version),
                "kvm_host": {"where": where.label, **where.settings()} if where is not None and self._accel else None,
                "realtime": self._realtime,
                "boot_seconds": boot_s, **guest_description(self.config.guest, self._image), **self._placement,
                "vcpu_cpu_seconds": self._vcpu_cpu_s, "jobs_beside": [" ".join(job.argv) for job in self._beside],
                "vcpu_cpu_seconds_after_boot": None if self._vcpu_cpu_s is None or self._boot_cpu_s is None
                else round(self._vcpu_cpu_s - self._boot_cpu_s, 2)}

    def stream_copy(self) -> Path | None:
        if not self._copy_disk or self._workspace is None:
            return None
        if self._ack is not None and not self.where.here:  # the host held END: nothing to fetch over SSH
            return None
        return self._workspace.fetch_disk(self._copy_path)

    def delivery(self) -> dict[str, Any]:
        via = {} if self._where is None or self._where.here else {
            "via": f"a FIFO on {self._where.label} copied live over SSH"}
        if self.config.guest == "baremetal":  # each buffer is consumed by QEMU before the guest writes the next
            return {"channel": "virtio-console", "handshake": "the device consumed every buffer", **via}
        return {"channel": "virtio-serial", "handshake": "RTVIRT-ACK", **via, **delivery_said(self.console_text())}

    def platform_audit(self) -> dict[str, Any]:
        if self._where is None or self._where.here:
            return {}
        try:
            return {"kind": "qemu", "kvm_host": self._where.audit()}
        except RunError as exc:
            return {"kind": "qemu", "kvm_host": {"error": str(exc)[:300]}}

    def warnings(self) -> list[str]:
        found = []
        if self._lab is not None:
            found.append(self._lab.warning())
        if not self._accel or self._accel["accel"] != "tcg":
            return found
        if self._where is None or self._where.here:
            return [*found, TCG_WARNING]
        return [*found, TCG_WARNING.replace("KVM does not accelerate here", f"on {self._where.label}: "
                                            f"{self._accel.get('reason', '')}"[:300])]

    @classmethod
    def reclaim(cls, config: Any, shared: Any) -> list[str]:
        """The vCPU cpusets of a killed rtvirt, and the host settings it left changed (root load balancing); on a
        KVM host over SSH, the QEMUs and directories a killed rtvirt left there."""
        from ..cgroups import reclaim_leftovers

        removed = reclaim_leftovers()
        if isinstance(config, QemuConfig) and config.host == LAB_HOST:
            from ..kvmlab.lab import reclaim_kvm_labs

            removed += reclaim_kvm_labs()  # a lab's QEMUs died with it
        elif isinstance(config, QemuConfig) and config.remote:
            removed += open_qemu_host(config, shared, shared.supervisor).reclaim()
        return removed

    def close(self) -> None:
        if self._proc is not None:
            if self.config.guest == "baremetal" and self._qmp is not None:
                baremetal.request_stop(self._proc, self._qmp, arch=self.config.arch)
            self._proc.stop(grace=5.0)
            self._proc = None
        if self._ack is not None:
            self._ack.close()
            self._ack = None
        if self._clock is not None:
            self._clock.close()  # (the VM layer closes it as soon as the agent ended)
        forget_vcpus(self._vcpu_threads)
        if self._vcpu_cpuset is not None:
            cpuset, self._vcpu_cpuset = self._vcpu_cpuset, None
            cpuset.remove()
        if self._stressors:  # (on a KVM host over SSH; the SSH modules are imported only then)
            from ...remote.stressor import stop_left_running

            stop_left_running(self._stressors)
        if self._workspace is not None:
            self._workspace.close()  # (a KVM host's relays of the console end here)
            self._workspace = None
        bound_console_file(self._console)  # kept in the run, bounded (its writers have gone)
        super().close()
