"""The bare-metal guest (``guest = "baremetal"``): rtvirt's own kernel (agents/baremetal, docs/baremetal.md).

Booted directly by the hypervisor (QEMU ``-kernel``: multiboot on x86_64, an arm64 Image on aarch64; Xen: a PVH
domU); the probe and its options travel on the kernel command line exactly as the Linux agent's argv; the sample
stream leaves through a virtio-console (the guest's own driver: legacy virtio-pci on x86_64, virtio-mmio on
aarch64; its x86 fallbacks, QEMU's debug console and COM2, are for platforms without one), the console text
(READY/EXIT marks, errors) through the first UART (COM1, the PL011), and the guest ends the VM with its status
(x86: QEMU's isa-debug-exit device; aarch64: PSCI SYSTEM_OFF, the status on the console's EXIT line). An explained
run adds a second virtio-console for the clock exchange (explain.clocksync). Under Xen PVH there is no UART and
no virtio: text and stream share the domain's PV console, the stream in frames (ConsoleDemux splits dom0's log).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ..agents import BAREMETAL_KERNEL, agent_path
from ..errors import InputError, RunError
from .guest_image import EXIT_MARK

__all__ = ["kernel_path", "command_line", "qemu_devices", "machine_args", "guest_cpu", "console_args", "qemu_binary",
           "installed_qemu", "QEMU_BINARIES", "GuestProcess",
           "guest_error", "failure_exception", "request_stop", "unsupported", "stressor_unsupported", "DEBUG_EXIT_PORT",
           "ConsoleDemux", "XenConsoleRelay", "xen_domain_lines", "xen_request_stop", "emulated_machine"]

DEBUG_EXIT_PORT = 0xF4
MAX_COMMAND_LINE = 1023  # the guest's buffer (agents/baremetal/main.c)
ERROR_PREFIX = "rtvirt-baremetal: "
STOP_TIMEOUT_S = 10.0  # time a stopped guest gets to write out what it holds


def kernel_path(arch: str = "x86_64") -> Path:
    return agent_path(BAREMETAL_KERNEL, arch)


# The QEMU that boots the guest of each architecture (Debian: qemu-system-x86, qemu-system-arm).
QEMU_BINARIES = {"x86_64": "qemu-system-x86_64", "aarch64": "qemu-system-aarch64"}
# aarch64: QEMU's virt board with the study's CPU (a Raspberry Pi 4's Cortex-A72); its power button (the stop
# request) reaches the guest through a PL061 GPIO line only without ACPI
ARM_CPU = "cortex-a72"


def qemu_binary(arch: str) -> str:
    return QEMU_BINARIES[arch]


def installed_qemu(arch: str) -> str:
    binary = qemu_binary(arch)
    if shutil.which(binary) is None:
        package = "qemu-system-arm (scripts/setup.sh arm)" if arch == "aarch64" else "qemu-system-x86"
        raise RunError(f"{binary} is not installed: apt-get install {package}")
    return binary


# Stressor programs of the guest (agents/baremetal/stress.c), and the stressor agent's options they take
# only at the value they honour (one CPU: one worker).
BAREMETAL_STRESSORS = ("cpu", "cache")
_STRESSOR_FIXED = {"workers": "1"}


def stressor_unsupported(stressor: str, params: dict[str, Any], workers: int) -> str | None:
    """Why a bare-metal disturbing guest cannot run this stressor, or None (checked when a scenario is read)."""
    if stressor not in BAREMETAL_STRESSORS:
        return f"a bare-metal disturbing guest runs the {' and '.join(BAREMETAL_STRESSORS)} stressors, not {stressor}"
    if workers != 1:
        return "workers: a bare-metal disturbing guest has one CPU and one worker"
    return None


def _stressor_args(args: list[str]) -> list[str]:
    """The stressor agent's argv as the guest takes it: options it honours only at one value are dropped."""
    if not args or args[0] not in BAREMETAL_STRESSORS:
        raise InputError(f"guest 'baremetal': it runs the {', '.join(BAREMETAL_STRESSORS)} stressors only, not "
                         f"{(args or ['nothing'])[0][:40]!r} (use a linux guest for other-vm stressors)")
    kept = [args[0]]
    for arg in args[1:]:
        name, _, value = arg.removeprefix("--").partition("=")
        if name in _STRESSOR_FIXED:
            if value != _STRESSOR_FIXED[name]:
                raise InputError(f"guest 'baremetal': option --{name} can only be {_STRESSOR_FIXED[name]} "
                                 "in a bare-metal disturbing guest (one CPU)")
            continue
        kept.append(arg)
    return kept


def command_line(agent: str, args: list[str]) -> str:
    """The kernel command line for ``agent args`` ("PROBE --name=value ..."): a probe, or one of the
    guest's stressor programs for a disturbing guest."""
    if agent == "rtvirt-stress":
        args = _stressor_args(args)
    elif agent != "rtvirt-probe":
        raise InputError(f"guest 'baremetal': it runs probes and the {', '.join(BAREMETAL_STRESSORS)} stressors, "
                         f"not {agent}")
    for arg in args:
        if not arg or any(c.isspace() or not c.isprintable() for c in arg):
            raise InputError(f"guest 'baremetal': argument {arg[:80]!r} cannot travel on a kernel command line")
    line = " ".join(args)
    if len(line) > MAX_COMMAND_LINE:
        raise InputError(f"guest 'baremetal': the probe's options take {len(line)} bytes, the guest accepts "
                         f"{MAX_COMMAND_LINE}")
    return line


def machine_args(arch: str, accel: str, gic_version: int = 2) -> list[str]:
    """The board QEMU emulates for the guest beyond its CPU: aarch64 QEMU's virt board with the chosen GIC
    (without ACPI: the power button, the stop request, reaches the guest as a PL061 GPIO line); x86 the default
    PC."""
    return ["-machine", f"virt,gic-version={gic_version},acpi=off"] if arch == "aarch64" else []


def guest_cpu(arch: str, accel: str) -> str | None:
    """The CPU model an aarch64 guest gets (the host's under KVM, else the study's Cortex-A72); None: x86,
    whose CPU the qemu kind's real-time options choose."""
    if arch != "aarch64":
        return None
    return "host" if accel == "kvm" else ARM_CPU


def console_args(arch: str, chardev: str) -> list[str]:
    """The guest's first UART on chardev ``chardev`` (defined by the caller): COM1 on x86, the virt board's
    PL011 on aarch64."""
    return ["-serial", f"chardev:{chardev}"] if arch == "aarch64" else ["-device", f"isa-serial,chardev={chardev}"]


def qemu_devices(arch: str, out: str | None, clock: str | None = None) -> list[str]:
    """QEMU arguments for the guest's exit device (x86) and its virtio consoles, given as chardev options (the
    caller's: files here, pipes or sockets on a KVM host over SSH): ``out`` the stream's (id ``rtvirtout``; None:
    no channel), ``clock`` the clock exchange's (id ``rtvirtclock``). The guest takes the consoles in this order
    (x86: PCI slots in command-line order; aarch64: virtio-mmio transports from the highest address down, where
    QEMU puts the first -device)."""
    bus_device = "virtio-serial-device" if arch == "aarch64" else "virtio-serial-pci"
    devices = [] if arch == "aarch64" else ["-device", f"isa-debug-exit,iobase={DEBUG_EXIT_PORT:#x},iosize=4"]
    for name, chardev in (("rtvirtout", out), ("rtvirtclock", clock)):
        if chardev is None:
            continue
        # port 1 of its own multiport bus, a virtserialport: QEMU holds the guest's buffer while the chardev is
        # full (a pipe to a KVM host's follower), where a virtconsole on port 0 would drop what it refused
        devices += ["-device", f"{bus_device},max_ports=2,id={name}-bus", "-chardev", chardev,
                    "-device", f"virtserialport,chardev={name},bus={name}-bus.0,nr=1"]
    return devices


def emulated_machine(arch: str, accel: str, gic_version: int = 2) -> str | None:
    """What QEMU emulated for the guest, for the manifest: None where nothing of the CPU was (KVM on x86)."""
    if arch == "aarch64":
        cpu = "the host's CPU (KVM)" if accel == "kvm" else f"an emulated {ARM_CPU} (TCG)"
        return f"QEMU's virt board with a GICv{gic_version}, the generic timer and {cpu}"
    return None if accel == "kvm" else "an x86_64 CPU emulated by TCG (-cpu max)"


def guest_error(console: str) -> tuple[int, str] | None:
    """(status, message) of a guest that ended badly, from its console; None when it ended with 0.

    The console is untrusted: only the guest's own error line is quoted, bounded.
    """
    status: int | None = None
    for line in console.splitlines():
        if line.startswith(EXIT_MARK):
            word = line.removeprefix(EXIT_MARK).strip()
            status = int(word) if word.isdigit() and len(word) < 4 else 1
    if status == 0:
        return None
    said = [x.removeprefix(ERROR_PREFIX).strip() for x in console.splitlines() if x.startswith(ERROR_PREFIX)]
    message = said[-1][:300] if said else "the bare-metal guest stopped without saying why"
    return (1 if status is None else status), message


def request_stop(proc: Any, qmp_socket: str, timeout_s: float = STOP_TIMEOUT_S, arch: str = "x86_64") -> None:
    """Stop a running guest as SIGTERM stops an agent: a stop request (x86: an NMI, QMP inject-nmi; aarch64: the
    power button, QMP system_powerdown) makes it write out every sample it holds and end its stream with reason
    'signal'; we wait for it to leave the VM. ``proc``: QEMU wherever it runs (poll and wait), ``qmp_socket``: a
    path here that reaches its QMP."""
    from qemu.qmp.legacy import QEMUMonitorProtocol

    if proc.poll() is not None:
        return
    from qemu.qmp import QMPError

    monitor = QEMUMonitorProtocol(qmp_socket)
    try:
        monitor.connect()
        monitor.cmd("system_powerdown" if arch == "aarch64" else "inject-nmi")
    except (OSError, EOFError, QMPError):
        return  # QEMU is going anyway: the caller stops it
    finally:
        # a guest that leaves at once ends QEMU, which hangs up: close() re-raises that EOFError (seen with
        # bare-metal stressor guests; escaping here it aborted whole campaigns)
        with contextlib.suppress(OSError, EOFError, QMPError):
            monitor.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)


BAREMETAL_PROBES = ("timer", "gap", "kops", "threadmetric", "workload")


def unsupported(probe: str, params: dict[str, Any]) -> str | None:
    """Why the bare-metal guest cannot run this workload (what only a Linux agent does), or None.

    The guest refuses these itself (status 2); saying so while the scenario is read fails before any boot.
    """
    if probe not in BAREMETAL_PROBES:
        return f"the bare-metal guest runs {', '.join(BAREMETAL_PROBES)}, not {probe}"
    if params.get("threads", 1) != 1:
        return "threads: the bare-metal guest has one CPU and one measuring thread"
    if probe == "timer" and params.get("engine", "cyclictest") != "cyclictest":
        return "engine: timerlat is a Linux tracer; the bare-metal timer probe measures the LAPIC timer itself"
    if probe == "gap" and params.get("work"):
        return "work: the bare-metal gap probe spins on the TSC only"
    return None


class GuestProcess:
    """QEMU running the bare-metal guest, seen as the agent: its status is the guest's.

    x86: isa-debug-exit ends QEMU with ``(status << 1) | 1``; any other end (a triple fault under -no-reboot,
    QEMU's own error) is a failure. aarch64: PSCI SYSTEM_OFF ends QEMU with 0 and the status is the console's
    EXIT line (none: a failure). ``proc``: QEMU here (a Popen) or wherever it runs (poll/returncode/wait).
    """

    def __init__(self, proc: Any, console: Path, exit_device: bool = True) -> None:
        self._proc = proc
        self._console = console
        self._exit_device = exit_device

    @property
    def returncode(self) -> int | None:
        code = self._proc.returncode
        if code is None:
            return None
        if not self._exit_device:
            return (guest_error(self._console_text()) or (0, ""))[0] if code == 0 else code
        return code >> 1 if code > 0 and code & 1 else (code or 1)

    def poll(self) -> int | None:
        self._proc.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.wait(timeout)
        code = self.returncode
        assert code is not None
        return code

    def _console_text(self) -> str:
        try:
            with self._console.open("rb") as f:
                return f.read(1 << 16).decode("utf-8", errors="replace")
        except OSError:
            return ""

    def error_tail(self) -> str:
        failure = guest_error(self._console_text())
        return failure[1] if failure else ""


def failure_exception(console: str) -> InputError | RunError | None:
    """The error a finished bare-metal guest stands for: status 2 is bad input (exit 2), else a failure."""
    failure = guest_error(console)
    if failure is None:
        return None
    status, message = failure
    if status == 2:
        return InputError(f"the bare-metal guest rejected its parameters: {message}")
    return RunError(f"the bare-metal guest failed (status {status}): {message}")


# ---- Xen PVH: the guest's console carries its text and, in frames, its sample stream (agents/baremetal/xen.c)

FRAME_MAGIC = b"\0RVS"
FRAME_HEADER = 6  # magic, then the payload's length as 16-bit little-endian
CONSOLE_TEXT_LIMIT = 1 << 16  # console text kept (the guest's lines: READY, EXIT, errors)
# dom0 side of the relay: copy xenconsoled's log of the domain by offset, from its first byte, for as long as the
# domain exists and once more after it has gone: every byte the log holds at the end is copied (a `tail -f` killed
# a moment after the domain went could miss its last second under load). Only paths we chose reach it, as $1, $2.
RELAY_SCRIPT = r"""log=$1 name=$2
id=$(xl domid "$name") || exit 1
n=0
until [ -e "$log" ]; do
  n=$((n+1)); [ $n -gt 300 ] && { echo "rtvirt: no console log $log" >&2; exit 1; }; sleep 0.1
done
sent=0 last=0
while [ $last -eq 0 ]; do
  xenstore-read "/local/domain/$id/name" >/dev/null 2>&1 || last=1
  size=$(stat -c %s "$log")
  if [ "$size" -gt "$sent" ]; then
    tail -c +$((sent + 1)) "$log" | head -c $((size - sent))
    sent=$size
  fi
  [ $last -eq 0 ] && sleep 0.2
done
"""
RELAY_POLL_S = 0.05
XEN_MEMORY_MIB = 64  # a PVH domU's memory unless the scenario says: the kernel, its 32 MiB ring, probe data


def xen_domain_lines(kernel: str, line: str, memory: int, arch: str = "x86_64") -> list[str]:
    """The xl configuration lines that boot the guest as a PVH domU: our kernel (x86: its ELF; aarch64: its
    Image), its probe on the command line (start info's cmdline; Arm: the device tree's), no ramdisk, no device
    model."""
    bad = next((c for c in line if c in "\"'\\"), None)
    if bad is not None:
        raise InputError(f"guest 'baremetal' in xen: the probe's options cannot contain {bad!r} (an xl "
                         "configuration string)")
    # tsc_mode native: the guest reads the TSC itself (Xen otherwise traps every RDTSC where the host TSC is
    # not invariant, as under TCG here: 28 us per read, which the gap probe would take for its own loop)
    lines = ['type = "pvh"', f'kernel = "{kernel}"', f'cmdline = "{line}"', f"memory = {memory}"]
    return [*lines, 'tsc_mode = "native"'] if arch == "x86_64" else lines  # Arm's generic timer is never trapped


class ConsoleDemux:
    """Splits the guest's Xen console into the sample stream (the payload of its frames) and console text.

    The console is untrusted: a frame header that is not ours ends the stream there (the stream reader keeps
    its valid prefix) and the rest is read as text; the text kept is bounded.
    """

    def __init__(self, out: Path | None) -> None:
        self._out = out.open("wb") if out is not None else None
        self._pending = bytearray()
        self._frame_left = 0
        self._text = bytearray()
        self.stream_bytes = 0
        self.corrupt: str | None = None

    def feed(self, data: bytes) -> None:
        self._pending += data
        while self._pending:
            if self._frame_left:
                part = bytes(self._pending[:self._frame_left])
                del self._pending[:len(part)]
                self._frame_left -= len(part)
                self._stream(part)
                continue
            start = self._pending.find(0)
            self._keep_text(self._pending[:len(self._pending) if start < 0 else start])
            if start < 0:
                self._pending.clear()
                return
            del self._pending[:start]
            if len(self._pending) < FRAME_HEADER:
                return  # the rest of the header is still on its way
            length = int.from_bytes(self._pending[4:FRAME_HEADER], "little")
            if self._pending[:4] != FRAME_MAGIC or length == 0:
                if self.corrupt is None:
                    self.corrupt = f"a malformed stream frame after {self.stream_bytes} stream bytes"
                del self._pending[:1]
                continue
            del self._pending[:FRAME_HEADER]
            self._frame_left = length

    def _stream(self, part: bytes) -> None:
        if self._out is not None and self.corrupt is None:
            self._out.write(part)
            self._out.flush()  # the run's reader follows the file live
            self.stream_bytes += len(part)

    def _keep_text(self, part: bytes | bytearray) -> None:
        self._text += part
        del self._text[:-CONSOLE_TEXT_LIMIT]

    def text(self) -> str:
        return self._text.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class XenConsoleRelay:
    """dom0's log of the guest's console followed live over the dom0 transport (a process shaped like an agent:
    ``poll`` is None until the domain has gone and every byte of its log has been split)."""

    def __init__(self, transport: Any, log: str, domain: str, raw: Path, out: Path | None) -> None:
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.unlink(missing_ok=True)
        self._raw = raw
        self._demux = ConsoleDemux(out)
        self._finished = threading.Event()
        self._proc = transport.spawn(["sh", "-c", RELAY_SCRIPT, "rtvirt-console", log, domain], stream_to=raw)
        self._thread = threading.Thread(target=self._follow, name=f"xen-console-{domain}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._raw.exists():
                if self._proc.poll() is not None:
                    return
                time.sleep(RELAY_POLL_S)
            with self._raw.open("rb") as raw:
                while True:
                    ended = self._proc.poll() is not None  # before the read: nothing comes after it
                    chunk = raw.read(1 << 16)
                    if chunk:
                        self._demux.feed(chunk)
                    elif ended:
                        return
                    else:
                        time.sleep(RELAY_POLL_S)
        finally:
            self._demux.close()
            self._finished.set()

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._finished.is_set() else None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float) -> bool:
        return self._finished.wait(timeout)

    def text(self) -> str:
        return self._demux.text()

    @property
    def corrupt(self) -> str | None:
        return self._demux.corrupt

    def error_tail(self) -> str:
        return str(self._proc.error_tail())

    def stop(self, grace: float = 5.0) -> int | None:
        self._proc.stop(grace)
        self._finished.wait(grace + 5.0)
        return self.returncode


def xen_request_stop(dom0: Any, domain: str, relay: XenConsoleRelay, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a running PVH guest as SIGTERM stops an agent: an NMI (``xl trigger nmi``) makes it write out every
    sample it holds, end its stream with reason 'signal' and power its domain off; we wait for its console."""
    if relay.poll() is not None:
        return
    if dom0.run(["xl", "trigger", domain, "nmi", "0"], timeout=30).returncode == 0:
        relay.wait(timeout_s)
