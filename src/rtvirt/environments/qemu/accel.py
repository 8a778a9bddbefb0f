"""Which accelerator a QEMU guest runs under, KVM or TCG, and why: here a calibration boot decides, on a KVM host
over SSH what its CPU and KVM modules say (host.kvm)."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...agents import native_arch
from ...errors import RunError
from ...fileio import write_atomically
from ..guest_image import READY_MARK, GuestImage, cache_dir, guest_image, job_archive

if TYPE_CHECKING:
    from ...remote.transport import HostTransport

__all__ = ["QEMU", "TCG_WARNING", "CONSOLE_LIMIT", "choose_accel", "probe_kvm_host", "remote_accel", "qemu_version",
           "read_console"]

QEMU = "qemu-system-x86_64"
CONSOLE_LIMIT = 1 << 16  # bytes of the guest console we read back (it is untrusted)
KVM_CALIBRATION_TIMEOUT_S = 20.0
TCG_WARNING = ("the QEMU guest ran under TCG (software emulation, KVM does not accelerate here): its timings "
               "do not represent real hardware")
# one round trip: can this login open /dev/kvm, and which QEMU is there (the first line of its --version)
_KVM_PROBE = ('[ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] && echo kvm=yes || echo kvm=no; '
              'if command -v "$1" > /dev/null; then "$1" --version | head -n 1; else echo qemu=missing; fi; uname -m')


def qemu_version(binary: str = QEMU) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0][:200] if out else "unknown"


def _boot_once(image: GuestImage, accel: str, workdir: Path, timeout_s: float) -> float | None:
    """Boot a guest with no job; seconds until it reported ready, or None if it did not within the timeout."""
    from ...procs import Supervisor

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
            if console.exists() and READY_MARK in read_console(console):
                return time.monotonic() - started
            if proc.poll() is not None:
                return None
            time.sleep(0.1)
    return None


ARCH_CAPABILITIES_REFUSED = "failed to set MSR 0x10a"  # QEMU's words when KVM refuses the host CPU's value


def choose_accel(requested: str = "auto", arch: str | None = None) -> dict[str, Any]:
    """Which accelerator to use, and why: a calibration boot under KVM decides (cached per host setup).

    /dev/kvm can exist where KVM only emulates (nested without hardware support): a guest that does not
    come up under KVM within the calibration timeout means TCG is the faster choice. A guest of another
    architecture than this machine's is always emulated.
    """
    if arch is not None and arch != native_arch():
        return {"accel": "tcg", "reason": f"an {arch} guest on an {native_arch()} host is emulated"}
    override = os.environ.get("RTVIRT_ACCEL")
    if override in ("kvm", "tcg"):
        requested = override
    if requested == "tcg":
        return {"accel": "tcg", "reason": "requested"}
    kvm_usable = os.access("/dev/kvm", os.R_OK | os.W_OK)
    if requested == "kvm":
        if not kvm_usable:
            raise RunError("qemu: accel 'kvm' requested but /dev/kvm is missing or not accessible")
        return {"accel": "kvm", "reason": "requested", **_host_cpu_refusal()}
    if not kvm_usable:
        return {"accel": "tcg", "reason": "/dev/kvm is missing or not accessible"}
    key = f"{platform.release()}|{qemu_version()}|{_cpu_model()}"
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


@functools.cache  # (this machine's kernel and QEMU do not change under a running rtvirt: probed once)
def _host_cpu_refusal() -> dict[str, str]:
    """The CPU model a KVM guest of this machine gets when its KVM refuses the host's (``cpu``, and why), else
    nothing. Seen here: a 6.18 host kernel whose KVM refuses the IA32_ARCH_CAPABILITIES value it reports (MSR
    0x10a), so QEMU 7.2 aborts at start with ``-cpu host``; without that MSR the host's model starts."""
    if native_arch() != "x86_64":
        return {}
    try:
        probe = subprocess.run([QEMU, "-accel", "kvm", "-cpu", "host", "-S", "-m", "64", "-machine", "q35",
                                "-display", "none", "-nodefaults", "-qmp", "stdio"], capture_output=True, text=True,
                               input='{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n', timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}  # (the run's own start then says what is wrong)
    if probe.returncode == 0 or ARCH_CAPABILITIES_REFUSED not in probe.stderr:
        return {}
    return {"cpu": "host,-arch-capabilities",
            "cpu_reason": "this machine's KVM refuses the host CPU's IA32_ARCH_CAPABILITIES (MSR 0x10a), so QEMU "
                          "cannot start -cpu host: the guest gets the host's CPU model without that MSR"}


def probe_kvm_host(transport: HostTransport, binary: str = QEMU) -> dict[str, Any]:
    """Whether this login can open /dev/kvm on the machine behind ``transport``, the version of its QEMU
    ``binary`` (None: no such QEMU there) and the machine's architecture."""
    lines = transport.run(["sh", "-c", _KVM_PROBE, "rtvirt-kvm-probe", binary], timeout=60).stdout.splitlines()
    version = lines[1].strip()[:200] if len(lines) > 1 and lines[1].strip() != "qemu=missing" else None
    return {"dev_kvm_usable": bool(lines) and lines[0].strip() == "kvm=yes", "qemu": version,
            "arch": lines[2].strip()[:32] if len(lines) > 2 else None}


def remote_accel(label: str, requested: str, probed: dict[str, Any], settings: dict[str, Any],
                 arch: str = "x86_64") -> dict[str, Any]:
    """The accelerator on the KVM host ``label`` for an ``arch`` guest: KVM where this login can open /dev/kvm
    (``probed``: probe_kvm_host), the host is of the guest's architecture and KVM really accelerates there
    (``settings``: host.kvm.kvm_settings of it), else TCG, with the reason. ``kvm`` requested where it cannot be
    had is an error naming why."""
    override = os.environ.get("RTVIRT_ACCEL")
    if override in ("kvm", "tcg"):
        requested = override
    if requested == "tcg":
        return {"accel": "tcg", "reason": "requested"}
    if probed.get("arch") and probed["arch"] != arch:
        why = f"an {arch} guest on {label}, an {probed['arch']} host, is emulated"
        if requested == "kvm":
            raise RunError(f"qemu: accel 'kvm' requested but {why}")
        return {"accel": "tcg", "reason": why}
    if not probed["dev_kvm_usable"]:
        why = f"/dev/kvm is missing or not accessible on {label}"
        if requested == "kvm":
            raise RunError(f"qemu: accel 'kvm' requested but {why}")
        return {"accel": "tcg", "reason": why}
    if requested == "kvm":
        return {"accel": "kvm", "reason": f"requested ({settings.get('accelerates_why', 'unknown')})"}
    if not settings.get("accelerates"):
        return {"accel": "tcg", "reason": f"KVM does not accelerate on {label}: "
                                          f"{settings.get('accelerates_why', 'unknown')}"}
    return {"accel": "kvm", "reason": str(settings.get("accelerates_why"))}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text()[:65536].splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()[:200]
    except OSError:
        pass
    return "unknown"


def read_console(path: Path) -> str:
    with path.open("rb") as f:
        return f.read(CONSOLE_LIMIT).decode("utf-8", errors="replace")


