"""qemu: the workload in a QEMU guest (KVM, or TCG where KVM does not really accelerate).

The guest boots our initramfs (guest_image.py) and runs the agent as its main job; the agent's stream
leaves the guest through a virtio-serial port whose host side is a chardev file: the run's stream file
itself, so samples land on the host disk as they are taken. QEMU starts paused (-S): over QMP we find
each vCPU's thread (query-cpus-fast), pin it to its host CPU and give it its policy, pin every other
QEMU thread (the emulator) to ``emulator_cpus``, and only then let the guest run.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from ..errors import RunError
from ..explain.clocksync import CLOCK_PORT, ClockExchange
from ..explain.guest_channel import GUEST_TRACE_FILE, GUEST_TRACE_PORT
from ..explain.vcpus import forget_vcpus, register_vcpus
from ..fileio import write_atomically
from ..host.checks.base import cpu_list
from ..host.ledger import process_holder
from ..params import CpuList
from ..units import duration_field
from . import baremetal
from .base import Environment, EnvironmentConfig, Launched
from .console_log import bound_console_file
from .guest_image import (
    COPY_DISK,
    COPY_DISK_BYTES,
    GUEST_AGENT_DIR,
    READY_MARK,
    GuestImage,
    GuestJob,
    GuestKind,
    agent_failure,
    beside_job,
    cache_dir,
    delivery_said,
    guest_description,
    guest_field,
    guest_image,
    guest_port_device,
    guest_port_path,
    job_archive,
    stream_copy_field,
)
from .sched import SchedPolicy, apply_policy, thread_ids

if TYPE_CHECKING:
    from ..explain.config import ExplainConfig
    from ..explain.model import TraceSource
    from ..explain.vm import VmSource

__all__ = ["QemuConfig", "QemuEnvironment", "choose_accel", "QEMU"]

QEMU = "qemu-system-x86_64"
OUTPUT_PORT = "rtvirt.out"
ACK_PORT = "rtvirt.ack"  # host to guest: the end-of-stream confirmation the agent waits for
ACK_CONNECT_TIMEOUT_S = 5.0
CONSOLE_LIMIT = 1 << 16  # bytes of the guest console we read back (it is untrusted)
KVM_CALIBRATION_TIMEOUT_S = 20.0
TCG_WARNING = ("the QEMU guest ran under TCG (software emulation, KVM does not accelerate here): its timings "
               "do not represent real hardware")


class QemuConfig(EnvironmentConfig):
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

    @model_validator(mode="after")
    def _baremetal_has_one_vcpu(self) -> QemuConfig:
        if self.guest == "baremetal" and self.vcpus != 1:
            raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
        return self


def _apply_once_moved(tid: int, policy: SchedPolicy, timeout_s: float = 5.0) -> None:
    """SCHED_DEADLINE for a vCPU thread just moved into its exclusive cpuset: the kernel checks the root domain of
    the CPU the thread last ran on, so the policy is refused (EPERM) until the thread has run on its new CPU."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            apply_policy(tid, policy)
            return
        except RunError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _qemu_version() -> str:
    try:
        out = subprocess.run([QEMU, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0][:200] if out else "unknown"


def _boot_once(image: GuestImage, accel: str, workdir: Path, timeout_s: float) -> float | None:
    """Boot a guest with no job; seconds until it reported ready, or None if it did not within the timeout."""
    from ..procs import Supervisor

    workdir.mkdir(parents=True, exist_ok=True)
    console = workdir / f"calibrate-{accel}.log"
    initrd = image.initramfs_with_jobs(job_archive(None), workdir)
    argv = [QEMU, "-accel", accel, "-m", "256", "-smp", "1", "-display", "none", "-nodefaults", "-no-reboot",
            "-kernel", str(image.boot_kernel(accel)), "-initrd", str(initrd),
            "-append", "console=ttyS0 quiet panic=-1",
            "-serial", f"file:{console}"]
    started = time.monotonic()
    with Supervisor() as supervisor:
        proc = supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while time.monotonic() - started < timeout_s:
            if console.exists() and READY_MARK in _read_console(console):
                return time.monotonic() - started
            if proc.poll() is not None:
                return None
            time.sleep(0.1)
    return None


def choose_accel(requested: str = "auto") -> dict[str, Any]:
    """Which accelerator to use, and why: a calibration boot under KVM decides (cached per host setup).

    /dev/kvm can exist where KVM only emulates (nested without hardware support): a guest that does not
    come up under KVM within the calibration timeout means TCG is the faster choice.
    """
    override = os.environ.get("RTVIRT_ACCEL")
    if override in ("kvm", "tcg"):
        requested = override
    if requested == "tcg":
        return {"accel": "tcg", "reason": "requested"}
    kvm_usable = os.access("/dev/kvm", os.R_OK | os.W_OK)
    if requested == "kvm":
        if not kvm_usable:
            raise RunError("qemu: accel 'kvm' requested but /dev/kvm is missing or not accessible")
        return {"accel": "kvm", "reason": "requested"}
    if not kvm_usable:
        return {"accel": "tcg", "reason": "/dev/kvm is missing or not accessible"}
    key = f"{platform.release()}|{_qemu_version()}|{_cpu_model()}"
    cache_file = cache_dir() / "accel.json"
    try:
        cached = json.loads(cache_file.read_text())
        if isinstance(cached, dict) and cached.get("key") == key and cached.get("accel") in ("kvm", "tcg"):
            return {"accel": cached["accel"], "reason": str(cached.get("reason", ""))[:300]}
    except (OSError, ValueError):
        pass
    workdir = cache_dir() / "calibration"
    seconds = _boot_once(guest_image(), "kvm", workdir, KVM_CALIBRATION_TIMEOUT_S)
    if seconds is None:
        decision = {"accel": "tcg", "reason": f"a calibration guest did not boot under KVM within "
                                              f"{KVM_CALIBRATION_TIMEOUT_S:.0f}s (KVM does not accelerate here)"}
    else:
        decision = {"accel": "kvm", "reason": f"a calibration guest booted under KVM in {seconds:.1f}s"}
    shutil.rmtree(workdir, ignore_errors=True)
    write_atomically(cache_file, json.dumps({"key": key, **decision}))
    return decision


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text()[:65536].splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()[:200]
    except OSError:
        pass
    return "unknown"


def _read_console(path: Path) -> str:
    with path.open("rb") as f:
        return f.read(CONSOLE_LIMIT).decode("utf-8", errors="replace")


def default_emulator_cpus(vcpu_cpus: Iterable[int], online: Iterable[int]) -> tuple[int, ...]:
    """Where QEMU's threads other than the vCPUs go unless emulator_cpus says: the online CPUs no vCPU is pinned
    to, so that no device emulation or I/O thread preempts any vCPU; if every CPU carries a vCPU, the vCPUs' own.
    The qemu and libvirt environments share this rule (docs/scenarios.md)."""
    pinned = set(vcpu_cpus)
    return tuple(c for c in sorted(online) if c not in pinned) or tuple(sorted(pinned))


def qemu_stressor_guest(env: Environment, index: int, host_cpus: tuple[int, ...] | None,
                        guest: str = "linux") -> Environment:
    """A QEMU guest disturbing ``env`` from beside it ("other-vm" of the kinds on this host: host, partition,
    qemu), placed on ``host_cpus`` (None: unpinned), running ``guest``."""
    # as large as the measured guest: a load the study ran in it (64 MB blocks) must fit in them too
    memory = getattr(env.config, "memory", None)
    config = QemuConfig.model_validate({"kind": "qemu", "name": f"stress-vm-{index}",
                                        "pin": host_cpus is not None, "cpus": host_cpus, "guest": guest,
                                        **({"memory": memory} if isinstance(memory, int) else {})})
    return QemuEnvironment(config, env.supervisor, env.workdir / f"stress-vm-{index}", env.shared)


class QemuEnvironment(Environment):
    kind = "qemu"
    config_model = QemuConfig
    on_host = False
    pausable = True
    config: QemuConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accel: dict[str, Any] | None = None
        self._proc: subprocess.Popen[Any] | None = None
        self._console = self.workdir / "console.log"
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._placement: dict[str, Any] = {}
        self._vcpu_cpuset: tuple[list[Any], Any] | None = None  # ([Cgroup], Exclusive): pinned deadline vCPUs
        self._socket_dir: Path | None = None
        self._image: GuestImage | None = None
        self._beside: list[GuestJob] = []  # "inside" stressors: background jobs beside the workload
        self._vcpu_cpu_s: float | None = None
        self._boot_cpu_s: float | None = None  # the vCPUs' CPU time when the guest said it had booted
        self._ack: socket.socket | None = None  # the confirmation's connection to the guest's ack port
        self._copy_path = self.workdir / "stream-copy.img"
        self._guest_trace_files: dict[str, bytes] | None = None  # an explained Linux guest traces itself
        self._out: Path | None = None
        self._vm_source: VmSource | None = None  # the VM layer of an explained run (trace_sources)
        self._vcpu_threads: dict[int, int] = {}

    @staticmethod
    def available() -> str | None:
        return None if shutil.which(QEMU) else f"{QEMU} is not installed (apt-get install qemu-system-x86)"

    def _host_cpus(self) -> tuple[int, ...]:
        """Host CPUs for vCPU i = the i-th of these (cycling); default: the last CPU first, then downwards."""
        allowed = sorted(os.sched_getaffinity(0), reverse=True)
        if not self.config.pin:
            return tuple(sorted(allowed))
        return tuple(self.config.cpus) if self.config.cpus else tuple(allowed[:self.config.vcpus])

    def measured_cpus(self) -> tuple[int, ...]:
        # the workload runs on vCPU 0 (other vCPUs serve helpers such as the wakeup probe's sender)
        return self._host_cpus() if not self.config.pin else self._host_cpus()[:1]

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def emulator_cpus(self) -> tuple[int, ...]:
        if self.config.emulator_cpus:
            return tuple(self.config.emulator_cpus)
        return default_emulator_cpus(self._host_cpus()[:self.config.vcpus], os.sched_getaffinity(0))

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        self._beside.append(beside_job(self.config.label, self.config.guest, self._proc is not None, agent, args))

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        return qemu_stressor_guest(self, index, host_cpus, guest)

    def start(self) -> None:
        if self._accel is None:
            self._accel = choose_accel(self.config.accel)

    def trace_sources(self, config: ExplainConfig) -> list[Any]:
        """The VM layer on the vCPUs' host CPUs (explain.vm; the run's guest then also exchanges clock readings
        with the host over an rtvirt.clock port, explain.clocksync) and the guest layer (explain.guest), those
        the scenario asks for."""
        from ..explain.sources import vm_source  # numpy and the tracer: only for an explained run

        guest = self._guest_trace_sources(config)
        if "vm" not in config.layers:
            return guest
        self.start()
        assert self._accel is not None
        vcpu_cpus = tuple(sorted(set(self._host_cpus()[:self.config.vcpus]))) if self.config.pin else None
        self._vm_source = vm_source(self.config.label, vcpu_cpus, self._accel["accel"], config,
                                    no_clock="the bare-metal guest takes no part in the clock exchange"
                                    if self.config.guest == "baremetal" else None)
        return [self._vm_source, *guest]

    def _guest_trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The guest layer (explain.guest): a Linux guest traces its measuring vCPU itself and sends the trace
        to the host after its main job; the bare-metal guest's timer probe times its own interrupts."""
        from ..explain.guest import guest_layer

        sources, self._guest_trace_files = guest_layer(self.config.guest, config, self.workdir, self.config.memory,
                                                       self.config.vcpus, lambda: self._out)
        return sources

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        self.start()
        self._out = out
        assert self._accel is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
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
            if self._vm_source is not None:
                devices.append(guest_port_device(CLOCK_PORT))
        trace_files = self._guest_trace_files if out is not None else None  # no stream, no run to explain
        if trace_files is not None:
            devices.append(guest_port_device(GUEST_TRACE_PORT))
        initrd = image.initramfs_with_jobs(job_archive(GuestJob(argv), self._beside, devices, trace_files),
                                           self.workdir)
        # a unix socket path must fit in 108 bytes: run directories can be deeper than that
        self._socket_dir = Path(tempfile.mkdtemp(prefix="rtvirt-qmp-"))
        qmp_socket = self._socket_dir / "qmp.sock"
        accel = self._accel["accel"]
        command = [QEMU, "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
                   "-smp", str(self.config.vcpus), "-m", str(self.config.memory),
                   "-display", "none", "-nodefaults", "-no-reboot", "-S",
                   # threads named after their role ("CPU 0/TCG", "worker"): what an explanation names
                   "-name", f"{self.config.label},debug-threads=on",
                   "-kernel", str(image.boot_kernel(accel)), "-initrd", str(initrd),
                   # no_timer_check: a vCPU starved while booting under TCG fails the IO-APIC timer
                   # check and panics ("IO-APIC + timer doesn't work"), seen here under load
                   "-append", "console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check",
                   "-serial", f"file:{self._console}",
                   "-qmp", f"unix:{qmp_socket},server=on,wait=off",
                   "-device", "virtio-serial-pci"]
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            # the samples go straight to the run's file (they are on disk even if rtvirt is killed); the
            # confirmation comes back on a second port, whose host side rtvirt connects to once it holds END
            command += ["-chardev", f"file,id=rtvirtout,path={out}",
                        "-device", f"virtserialport,chardev=rtvirtout,name={OUTPUT_PORT}",
                        "-chardev", f"socket,id=rtvirtack,path={self._socket_dir / 'ack.sock'},server=on,wait=off",
                        "-device", f"virtserialport,chardev=rtvirtack,name={ACK_PORT}"]
            if self._vm_source is not None:
                command += ["-chardev", f"socket,id=rtvirtclock,path={self._socket_dir / 'clock.sock'},server=on,"
                            "wait=off", "-device", f"virtserialport,chardev=rtvirtclock,name={CLOCK_PORT}"]
            if trace_files is not None:
                command += ["-chardev", f"file,id=rtvirttrace,path={self.workdir / GUEST_TRACE_FILE}",
                            "-device", f"virtserialport,chardev=rtvirttrace,name={GUEST_TRACE_PORT}"]
            if self.config.stream_copy:
                with self._copy_path.open("wb") as disk:
                    disk.truncate(COPY_DISK_BYTES)
                command += ["-drive", f"file={self._copy_path},if=none,id=rtvirtcopy,format=raw",
                            "-device", "virtio-blk-pci,drive=rtvirtcopy"]
        self._proc = self.supervisor.start(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._launched_at = time.monotonic()
        self._place_and_continue(qmp_socket)
        return Launched(self._proc, out, confirm=self._confirm_delivery if out is not None else None)

    def _confirm_delivery(self, records: int) -> str:
        """Tell the guest's agent how many data records the host holds (it powers off once told); returns
        what happened, for the manifest. The connection stays open until the guest is gone."""
        assert self._socket_dir is not None
        self._ack = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._ack.settimeout(ACK_CONNECT_TIMEOUT_S)
            self._ack.connect(str(self._socket_dir / "ack.sock"))
            self._ack.sendall(f"RTVIRT-ACK {int(records)}\n".encode())
        except OSError as exc:
            return f"not sent: {exc.strerror or exc}"
        return "sent"

    def _launch_baremetal(self, agent: str, args: list[str], out: Path | None) -> Launched:
        """Our own kernel: the probe's argv is its command line, the stream leaves by the debug console."""
        assert self._accel is not None
        command_line = baremetal.command_line(agent, args)
        self._socket_dir = Path(tempfile.mkdtemp(prefix="rtvirt-qmp-"))
        qmp_socket = self._socket_dir / "qmp.sock"
        accel = self._accel["accel"]
        # the guest needs a stream channel even as a disturbing guest (out None): its statistics go here
        channel = out if out is not None else self.workdir / "stressor.rtvs"
        channel.parent.mkdir(parents=True, exist_ok=True)
        command = [QEMU, "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
                   "-smp", "1", "-m", str(self.config.memory), "-display", "none", "-nodefaults", "-no-reboot", "-S",
                   "-name", f"{self.config.label},debug-threads=on",
                   "-kernel", str(baremetal.kernel_path()), "-append", command_line,
                   "-qmp", f"unix:{qmp_socket},server=on,wait=off", *baremetal.qemu_devices(self._console, channel)]
        self._proc = self.supervisor.start(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._launched_at = time.monotonic()
        self._place_and_continue(qmp_socket)
        return Launched(baremetal.DebugExitProcess(self._proc, self._console), out)

    def _place_and_continue(self, qmp_socket: Path) -> None:
        from qemu.qmp import ConnectError
        from qemu.qmp.legacy import QEMUMonitorProtocol

        assert self._proc is not None
        deadline = time.monotonic() + 30
        while True:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RunError(f"qemu did not start: {self._stderr_tail()}")
            if qmp_socket.exists():
                monitor = QEMUMonitorProtocol(str(qmp_socket))
                try:
                    monitor.connect()
                    break
                except ConnectError:  # bound a moment before QEMU listens on it (seen under load)
                    monitor.close()
            time.sleep(0.05)
        try:
            cpus: list[dict[str, Any]] = list(monitor.cmd("query-cpus-fast"))  # type: ignore[call-overload]
            host_cpus = self._host_cpus()
            vcpu_threads: dict[int, int] = {int(c["cpu-index"]): int(c["thread-id"]) for c in cpus}
            emulator = [t for t in thread_ids(self._proc.pid) if t not in vcpu_threads.values()]
            partitioned = self.config.pin and self.config.vcpu_sched.policy == "deadline"
            if partitioned:
                self._vcpu_partition(sorted({host_cpus[i % len(host_cpus)] for i in vcpu_threads}),
                                     list(vcpu_threads.values()))
            for index, tid in vcpu_threads.items():
                if self.config.pin:
                    os.sched_setaffinity(tid, {host_cpus[index % len(host_cpus)]})
                if not partitioned:
                    apply_policy(tid, self.config.vcpu_sched)
            if self.config.pin:
                for tid in emulator:
                    os.sched_setaffinity(tid, set(self.emulator_cpus()))
            self._placement = {
                "vcpu_threads": {str(i): {"tid": t, "host_cpu": host_cpus[i % len(host_cpus)] if self.config.pin
                                          else None} for i, t in vcpu_threads.items()},
                "emulator_threads": len(emulator), "emulator_cpus": list(self.emulator_cpus()),
                "vcpu_sched": self.config.vcpu_sched.describe(),
                **({"exclusive_cpuset": self._vcpu_cpuset[1].notes} if self._vcpu_cpuset else {}),
            }
            self._vcpu_threads = vcpu_threads
            register_vcpus(self.config.label, vcpu_threads)
            if self._vm_source is not None:
                self._vm_source.attach(self._proc.pid, vcpu_threads, self._clock_exchange())
            monitor.cmd("cont")
            if partitioned:
                for tid in vcpu_threads.values():
                    _apply_once_moved(tid, self.config.vcpu_sched)
        except OSError as exc:
            raise RunError(f"qemu: QMP failed ({exc}): {self._stderr_tail()}") from None
        finally:
            monitor.close()

    def _clock_exchange(self) -> ClockExchange | None:
        """The host side of the guest's rtvirt.clock port, connected before the guest runs (a Linux guest
        with a stream only: the ports come with it)."""
        assert self._socket_dir is not None
        path = self._socket_dir / "clock.sock"
        if not path.exists():
            return None

        def connect() -> socket.socket:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.connect(str(path))
            return connection

        exchange = ClockExchange(connect)
        exchange.start()
        return exchange

    def after_launch(self, launched: Launched) -> None:
        # the vCPU threads' CPU time so far (read while QEMU lives): how busy the guest kept its vCPUs
        if self._proc is None:
            return
        ticks = 0
        for entry in self._placement.get("vcpu_threads", {}).values():
            try:
                stat = Path(f"/proc/{self._proc.pid}/task/{entry['tid']}/stat").read_text()
            except OSError:  # QEMU has ended: keep the last reading
                return
            fields = stat.rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
        self._vcpu_cpu_s = ticks / os.sysconf("SC_CLK_TCK")
        if self._boot_cpu_s is None and self._ready_at is not None:
            self._boot_cpu_s = self._vcpu_cpu_s

    def set_paused(self, paused: bool) -> None:
        from qemu.qmp.legacy import QEMUMonitorProtocol

        if self._proc is None or self._proc.poll() is not None or self._socket_dir is None:
            raise RunError(f"{self.config.label}: the guest is not running")
        monitor = QEMUMonitorProtocol(str(self._socket_dir / "qmp.sock"))
        try:
            monitor.connect()
            monitor.cmd("stop" if paused else "cont")
        except OSError as exc:
            raise RunError(f"qemu: QMP {'stop' if paused else 'cont'} failed ({exc})") from None
        finally:
            monitor.close()

    def _stderr_tail(self) -> str:
        if self._proc is None or self._proc.stderr is None or self._proc.poll() is None:
            return "no error output"
        text = self._proc.stderr.read(4096).decode(errors="replace").strip()
        return (text.splitlines() or ["no error output"])[-1][:300]

    def console_text(self) -> str:
        return _read_console(self._console) if self._console.exists() else ""

    def check(self) -> str | None:
        if self._proc is None:
            return None
        console = self.console_text()
        if self._ready_at is None and READY_MARK in console:
            self._ready_at = time.monotonic()
        if self._ready_at is None:
            if self._proc.poll() is not None:
                return f"qemu exited before the guest booted: {self._stderr_tail()}"
            if time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
                return f"the guest did not boot within {self.config.boot_timeout / 1e9:.0f}s"
            return None
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
        return {**super().describe(), "acceleration": (self._accel or {}).get("accel"),
                "acceleration_reason": (self._accel or {}).get("reason"), "qemu": _qemu_version(),
                "boot_seconds": boot_s, **guest_description(self.config.guest, self._image), **self._placement,
                "vcpu_cpu_seconds": self._vcpu_cpu_s, "jobs_beside": [" ".join(job.argv) for job in self._beside],
                "vcpu_cpu_seconds_after_boot": None if self._vcpu_cpu_s is None or self._boot_cpu_s is None
                else round(self._vcpu_cpu_s - self._boot_cpu_s, 2)}

    def stream_copy(self) -> Path | None:
        return self._copy_path if self._copy_path.exists() else None

    def delivery(self) -> dict[str, Any]:
        if self.config.guest == "baremetal":  # each buffer is consumed by QEMU before the guest writes the next
            return {"channel": "virtio-console", "handshake": "the device consumed every buffer"}
        return {"channel": "virtio-serial", "handshake": "RTVIRT-ACK", **delivery_said(self.console_text())}

    def warnings(self) -> list[str]:
        return [TCG_WARNING] if self._accel and self._accel["accel"] == "tcg" else []

    def _vcpu_partition(self, cpus: list[int], vcpu_threads: list[int]) -> None:
        """Pinned SCHED_DEADLINE vCPUs: their host CPUs become an exclusive cpuset, a root domain of their own
        (the kernel admits a pinned deadline thread only then), and the vCPU threads move into it, one by one.

        cgroup v1: a cpuset of the vCPUs' CPUs, exclusive, with the root's load balancing off. cgroup v2 moves
        threads only within a threaded subtree, and (before Linux 6.7) a partition root's parent must be one too:
        QEMU's process goes into a partition root of its emulator and vCPU CPUs, its vCPU threads into a threaded
        partition root below it, and the emulator threads keep the rest."""
        from .cgroups import CgroupTree, Exclusive

        tree = CgroupTree()
        holder = process_holder(f"qemu-{secrets.token_hex(3)}")
        name = f"rtvirt-{os.getpid()}-{secrets.token_hex(3)}"
        exclusive = Exclusive(tree, holder)
        self._vcpu_cpuset = ([], exclusive)
        if tree.version == 1:
            vcpus = tree.create(f"{name}-vcpus", tuple(cpus), None, 0)
            self._vcpu_cpuset[0].append(vcpus)
        else:
            assert self._proc is not None
            emulator = self.emulator_cpus()
            host = tree.host_cpus()
            if set(emulator) & set(cpus) or not set(host) - set(emulator) - set(cpus):
                raise RunError(
                    f"{self.config.label}: pinned SCHED_DEADLINE vCPUs on cgroup v2 need a partition of QEMU's CPUs "
                    f"(vCPUs {cpu_list(cpus)}, emulator_cpus {cpu_list(emulator)}, which must differ) that leaves "
                    f"the host CPUs of its own (host: {cpu_list(host)}); choose cpus and emulator_cpus so, "
                    "or use pin = false")
            owned = tuple(sorted({*emulator, *cpus}))
            process = tree.create(f"{name}-qemu", owned, None, 0, holder=holder)
            self._vcpu_cpuset[0].append(process)
            exclusive.apply(process, owned)
            exclusive.notes["process_partition"] = exclusive.notes.pop("partition")
            try:
                process.join(self._proc.pid)
            except OSError as exc:
                raise RunError(f"{self.config.label}: cannot move QEMU into {process.directories[0]}: "
                               f"{exc.strerror}") from None
            vcpus = tree.create_threaded(process, "vcpus", tuple(cpus))
            self._vcpu_cpuset[0].append(vcpus)
        exclusive.apply(vcpus, tuple(cpus))
        try:
            for tid in vcpu_threads:
                vcpus.join_thread(tid)
        except OSError as exc:
            raise RunError(f"{self.config.label}: cannot move the vCPU threads into {vcpus.directories[0]}: "
                           f"{exc.strerror}") from None

    @classmethod
    def reclaim(cls, config: Any, shared: Any) -> list[str]:
        """The vCPU cpusets of a killed rtvirt, and the host settings it left changed (root load balancing)."""
        from .cgroups import reclaim_leftovers

        return reclaim_leftovers()

    def close(self) -> None:
        if self._proc is not None:
            if self.config.guest == "baremetal" and self._socket_dir is not None:
                baremetal.request_stop(self._proc, self._socket_dir / "qmp.sock")
            self.supervisor.stop(self._proc, grace=5.0)
            self._proc = None
            bound_console_file(self._console)  # kept in the run, bounded (its writer has gone)
        if self._ack is not None:
            self._ack.close()
            self._ack = None
        forget_vcpus(self._vcpu_threads)
        if self._vcpu_cpuset is not None:
            (cgroups, exclusive), self._vcpu_cpuset = self._vcpu_cpuset, None
            try:
                for cgroup in reversed(cgroups):  # a v2 vCPU cgroup lies inside the process's
                    cgroup.remove()
            finally:
                exclusive.undo()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        super().close()
