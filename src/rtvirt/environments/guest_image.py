"""The Linux guest image of the qemu, libvirt and xen environments: a Debian kernel and an initramfs we build
ourselves (xen adds its netfront overlay, xen/files.py).

Built once and cached under $RTVIRT_CACHE (default ~/.cache/rtvirt): the kernel comes from Debian's
``linux-image-amd64`` package, or ``linux-image-rt-amd64`` (PREEMPT_RT) for the ``linux-rt`` guest
(fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x``; nothing is installed on the host);
the initramfs holds busybox-static, the static agents, the virtio modules and ``/init``. Each run appends
a small second archive with its jobs: argv files of NUL-separated arguments that the guest hands to
``xargs -0``, so no argument ever passes through a shell.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..agents import AGENTS, BAREMETAL_KERNEL, agent_path, native_arch
from ..errors import InputError, RunError
from ..explain.clocksync import GUEST_CLOCK_SYNC
from ..explain.guest_channel import GUEST_TRACE_SHELL
from ..fileio import mark_used, prune_cache, write_atomically

__all__ = ["GuestImage", "GuestJob", "cache_dir", "guest_image", "job_archive", "Cpio", "LINUX_COMMAND_LINE",
           "READY_MARK", "EXIT_MARK",
           "GUEST_AGENT_DIR", "guest_port_path", "guest_port_device", "agent_failure", "GuestKind", "guest_field",
           "guest_description", "delivery_said", "stream_copy_field", "COPY_DISK", "COPY_DISK_BYTES", "beside_job",
           "kernel_elf", "GuestArch", "DEBIAN_ARCHES", "arch_field", "arch_cache", "apt_name", "busybox"]

# Guest kernel flavour -> Debian meta-package (of the guest's Debian architecture), and the cache directory its
# unpacked tree lives in.
KERNEL_PACKAGES = {"linux": "linux-image-{debian_arch}", "linux-rt": "linux-image-rt-{debian_arch}"}
KERNEL_CACHE_DIRS = {"linux": "kernel", "linux-rt": "kernel-rt"}
BUSYBOX = Path("/usr/bin/busybox")
# A guest's architecture as rtvirt names it (agents, ``arch`` fields) -> Debian's name for it
GuestArch = Literal["x86_64", "aarch64"]
DEBIAN_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
# Modules the guest loads (their dependencies are found from each module's own modinfo).
GUEST_MODULES = ("virtio_pci", "virtio_console", "virtio_blk")  # virtio_blk: the disk of the stream's copy
GUEST_AGENT_DIR = "/rtvirt/bin"
READY_MARK = "RTVIRT-READY"
EXIT_MARK = "RTVIRT-EXIT"
DELIVERY_MARK = "RTVIRT-DELIVERY"  # the agent's word on the end-of-stream handshake (agents/common/rtv.c)
COPY_DISK = "vda"  # the Linux guest's only disk: the copy of its stream (raw, no file system)
COPY_DISK_BYTES = 64 << 30  # sparse: only what the guest writes takes room
# a device the guest's jobs use, as a path under /dev (a name, or a directory and a name): no "..", no shell words
DEVICE_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}(/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63})?")
PORTS_WAITED_MARK = "RTVIRT-PORTS-WAITED"  # /init waited this many tenths of a second for its devices
# The Linux guest's kernel command line under QEMU (the qemu and libvirt kinds). no_timer_check: a vCPU starved under
# TCG fails the kernel's IO-APIC timer check and panics at boot. pci=noearly: before its PCI subsystem is up, the
# kernel's early quirks and (on AMD CPUs) its GART aperture search read the class of every slot of all 256 PCI buses
# through ports 0xcf8/0xcfc; a VM has one bus, and under KVM each access is an exit to QEMU in user space: 35,000
# exits, 14-18 s of a 22-26 s boot in the KVM lab (nested), a few tenths of a second under TCG. The quirks they
# serve are those of real chipsets (GART apertures, Intel graphics' stolen memory), none of QEMU's.
LINUX_COMMAND_LINE = "console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check pci=noearly"

# The guest's /init. Jobs come from /rtvirt/jobs (written by job_archive): bg-* run in the background,
# each after its own delay and for its own time limit; "main" runs in the foreground and its end powers
# the guest off. Only numbers we wrote ourselves are expanded by the shell; argv goes through xargs -0
# to env, which executes its first argument (an absolute path, so env never reads it as an option).
# clock_sync (explain.clocksync) answers the host's clock exchange before the jobs and after the main job,
# when the host gave the guest an rtvirt.clock port (an explained run); guest_trace (explain.guest) traces the
# guest's measuring vCPU around the jobs of an explained run.
INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
""" + GUEST_CLOCK_SYNC + GUEST_TRACE_SHELL + r"""
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /rtvirt/modules); do insmod "/rtvirt/modules.d/$m" || echo "rtvirt: insmod $m failed"; done
mkdir -p /dev/virtio-ports
# A port's name reaches the guest after insmod returns (a control message the driver handles in its own
# time, late on a loaded host): link the ports as they come, and wait for those the jobs write to. An agent
# started before its port would write into a plain file under /dev and the host would receive nothing.
waited=0
while :; do
  for p in /sys/class/virtio-ports/*; do
    [ -e "$p/name" ] || continue
    name=$(cat "$p/name")
    [ -n "$name" ] && [ ! -e "/dev/virtio-ports/$name" ] && ln -s "/dev/${p##*/}" "/dev/virtio-ports/$name"
  done
  missing=""
  for device in $(cat /rtvirt/jobs/devices 2>/dev/null); do
    [ -e "/dev/$device" ] || missing="$missing $device"
  done
  [ -z "$missing" ] && break
  [ $waited -eq 0 ] && late=$missing
  waited=$((waited+1))
  [ $waited -ge 600 ] && break
  sleep 0.1
done
[ $waited -gt 0 ] && echo "RTVIRT-PORTS-WAITED $waited$late"
guest_trace start
echo "RTVIRT-READY $(cat /proc/uptime)"
clock_sync start
for job in /rtvirt/jobs/bg-*.argv; do
  [ -e "$job" ] || continue
  base="${job%.argv}"
  ( sleep "$(cat "$base.delay")"; timeout "$(cat "$base.limit")" xargs -0 env < "$job" ) >/dev/null 2>&1 &
done
status=0
if [ -n "$missing" ]; then
  echo "rtvirt: the host's device(s)$missing did not appear within 60s"
  status=71
elif [ -e /rtvirt/jobs/main.argv ]; then
  xargs -0 env < /rtvirt/jobs/main.argv
  status=$?
fi
guest_trace end
echo "RTVIRT-EXIT $status"
clock_sync end
sync
poweroff -f
"""


# The guest kernel of a VM environment (qemu, libvirt, xen): one field, one meaning everywhere.
GuestKind = Literal["linux", "linux-rt", "baremetal"]


def arch_field() -> Any:
    """The ``arch`` field of a VM environment: its guests' architecture, and its lab's (``host``/``where`` = lab)."""
    from pydantic import Field

    return Field("x86_64", description="the guests' CPU architecture: x86_64, or aarch64 (Debian's arm64 kernel "
                 "and our aarch64 agents; a lab is then an emulated Cortex-A72 board with a GICv2)")


def guest_field() -> Any:
    """The ``guest`` field of a VM environment's config."""
    from pydantic import Field

    return Field("linux", description="guest kernel: linux (Debian's linux-image-amd64), linux-rt (Debian's "
                 "PREEMPT_RT linux-image-rt-amd64) or baremetal (rtvirt's own kernel, docs/baremetal.md)")


def stream_copy_field() -> Any:
    """The ``stream_copy`` field of a VM environment whose Linux guest can keep a copy of its stream."""
    from pydantic import Field

    return Field(True, description="the Linux guest also writes its stream to a disk of its own (a sparse image, "
                 "removed after the run): if the live stream fails, the run is recovered from that copy, and its "
                 "manifest says so")


def guest_description(kind: str, image: GuestImage | None) -> dict[str, Any]:
    """What a manifest records about the guest kernel that ran."""
    if kind == "baremetal":
        return {"guest": kind, "guest_kernel": BAREMETAL_KERNEL, "preempt_rt": False}
    return {"guest": kind, "guest_kernel": image.kernel_release if image else None,
            "preempt_rt": image.preempt_rt if image else None}


def cache_dir() -> Path:
    path = Path(os.environ.get("RTVIRT_CACHE") or Path.home() / ".cache" / "rtvirt")
    path.mkdir(parents=True, exist_ok=True)
    return path


# The virtio-serial ports a Linux guest's bus has room for: its own four (the stream, the confirmation, the clock, the
# guest's trace) and spare. QEMU's default of 31 has the guest's driver set up 64 virtqueues as it boots, each a few
# writes that exit to QEMU: in the KVM lab under TCG, 1,000 of the 1,500 userspace MMIO exits of a guest's boot
# (kvm:kvm_userspace_exit counted in the lab); QEMU's start to READY there took 4.7 s with 31 ports, 4.4 s with 8
# (means of 8 boots each, interleaved, each between 3.4 and 5.6 s)
LINUX_GUEST_PORTS = 8


def guest_port_path(port: str) -> str:
    """Where the guest sees the virtio-serial port named ``port``."""
    return f"/dev/{guest_port_device(port)}"


def guest_port_device(port: str) -> str:
    """The virtio-serial port named ``port`` as a device path under /dev (what /init waits for)."""
    return f"virtio-ports/{port}"


def agent_failure(console: str) -> str | None:
    """Why the guest's main job failed, read from the console of a guest that stopped; None if it exited 0."""
    for line in console.splitlines():
        if line.startswith(EXIT_MARK):
            status = line.removeprefix(EXIT_MARK).strip()
            if status == "0":
                return None
            said = [x for x in console.splitlines() if x.strip() and not x.startswith(("RTVIRT-", "["))]
            detail = f": {said[-1].strip()[:200]}" if said else ""
            return f"the guest's agent failed (status {status[:20]}){detail}"
    return "the guest stopped before its agent finished"


def delivery_said(console: str) -> dict[str, Any]:
    """What the guest's console says of the stream's delivery: the agent's handshake line (how many records it
    wrote, how many the host confirmed) and how long /init waited for its ports. Untrusted text: only numbers
    and one of the agent's own words are kept."""
    said: dict[str, Any] = {}
    lines = console.splitlines()
    for index, line in enumerate(lines):
        words = line.split()
        if len(words) >= 2 and words[0] == PORTS_WAITED_MARK and words[1].isdigit():
            said["ports_waited_s"] = int(words[1][:9]) / 10
            said["ports_late"] = [w for w in words[2:6] if DEVICE_PATTERN.fullmatch(w)]
        elif len(words) >= 3 and words[0] == DELIVERY_MARK and words[2].isdigit():
            outcome = words[1] if words[1] in ("confirmed", "short", "unconfirmed", "unreadable") else "unreadable"
            said["guest_said"] = outcome
            said["guest_records"] = int(words[2][:20])
            if outcome == "short" and len(words) >= 4 and words[3].isdigit():
                said["host_confirmed_records"] = int(words[3][:20])
            if outcome != "confirmed":  # for the diagnosis: what the guest said around it, printable and bounded
                said["console_around"] = [re.sub(r"[^ -~]", "?", x)[:200] for x in lines[max(0, index - 3):index + 4]]
    return said


class Cpio:
    """Writer of the 'newc' cpio format the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._inode = 1

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        encoded = name.encode() + b"\0"
        fields = (self._inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._inode += 1
        self._parts += [header, encoded, b"\0" * (-(len(header) + len(encoded)) % 4), data, b"\0" * (-len(data) % 4)]

    def directory(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, executable: bool = False) -> None:
        self._entry(name, 0o100755 if executable else 0o100644, data)

    def to_bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        archive = b"".join(self._parts)
        return archive + b"\0" * (-len(archive) % 512)


@dataclass(frozen=True)
class GuestJob:
    """One command the guest runs: ``main`` (its end stops the guest) or a background job."""

    argv: Sequence[str]
    delay_s: int = 0
    limit_s: int = 0  # background jobs only; 0 = until the guest stops


def beside_job(label: str, guest: str, started: bool, agent: str, args: list[str]) -> GuestJob:
    """A job the measured Linux guest runs beside its workload ("inside" stressors), checked: only a Linux
    guest runs jobs, and only from its start (they are in its initramfs)."""
    if guest == "baremetal":
        raise InputError(f"environment {label!r}: the bare-metal guest runs its probe alone; stressors with "
                         "where = 'inside' need guest = 'linux' or 'linux-rt'")
    if started:
        raise RunError(f"{label}: a stressor inside the guest starts with it: give its disturbance "
                       "start_order = ['stress-first'] and no events")
    return GuestJob([f"{GUEST_AGENT_DIR}/{agent}", *args])


def job_archive(main: GuestJob | None, background: Iterable[GuestJob] = (), devices: Iterable[str] = (),
                files: Mapping[str, bytes] | None = None) -> bytes:
    """The per-run archive appended to the base initramfs; ``devices``: paths under /dev the jobs use (their
    virtio-serial ports, the disk of the stream's copy), which /init waits for before it starts them;
    ``files``: more files of rtvirt's own under /rtvirt/jobs (the guest's tracing: explain.guest)."""
    archive = Cpio()
    archive.directory("rtvirt/jobs")
    for name, data in (files or {}).items():
        if not re.fullmatch(r"[a-z_.]{1,32}", name):
            raise ValueError(f"a guest job file is a plain name: {name!r}")
        archive.file(f"rtvirt/jobs/{name}", data)
    names = list(devices)
    for name in names:
        if not DEVICE_PATTERN.fullmatch(name):
            raise ValueError(f"a guest device must be a path under /dev of letters, digits, '_', '.' or '-': {name!r}")
    archive.file("rtvirt/jobs/devices", "".join(f"{name}\n" for name in names).encode())
    if main is not None:
        archive.file("rtvirt/jobs/main.argv", _argv_file(main.argv))
    for index, job in enumerate(background):
        base = f"rtvirt/jobs/bg-{index}"
        archive.file(f"{base}.argv", _argv_file(job.argv))
        archive.file(f"{base}.delay", f"{int(job.delay_s)}\n".encode())
        # busybox timeout needs a number; a week stands for "until the guest stops"
        archive.file(f"{base}.limit", f"{int(job.limit_s) or 604800}\n".encode())
    return archive.to_bytes()


def _argv_file(argv: Sequence[str]) -> bytes:
    if not argv or not argv[0].startswith("/") or "=" in argv[0]:
        raise ValueError("a guest job's command must be an absolute path without '='")
    for arg in argv:
        if "\0" in arg:
            raise ValueError("guest job arguments cannot contain NUL bytes")
    return b"".join(arg.encode() + b"\0" for arg in argv)


@dataclass(frozen=True)
class GuestImage:
    kernel: Path
    initramfs: Path
    kernel_release: str
    flavour: str = "linux"
    preempt_rt: bool = False  # the kernel's own config says CONFIG_PREEMPT_RT=y
    arch: str = "x86_64"

    def boot_kernel(self, accel: str) -> Path:
        """The kernel file QEMU boots: under TCG its ELF, entered through the PVH entry point, since the bzImage's
        decompressor is emulated instruction by instruction there (6.8 s to power-off against 2.7 s here);
        under KVM the bzImage, which decompresses in a tenth of a second and is 8x smaller to send."""
        return kernel_elf(self.kernel) if accel == "tcg" else self.kernel

    def initramfs_with_jobs(self, jobs: bytes, directory: Path) -> Path:
        """A run's initramfs: the cached base followed by its job archive (the kernel unpacks both)."""
        path = directory / "initramfs.cpio"
        with path.open("wb") as out, self.initramfs.open("rb") as base:
            shutil.copyfileobj(base, out, 1 << 20)
            out.write(jobs)
        return path


def _run(argv: list[str], cwd: Path, what: str) -> None:
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunError(f"guest image: {what} failed: {exc}") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RunError(f"guest image: {what} failed: {tail[0][:300]}")


def _bzimage_payload(image: bytes) -> bytes | None:
    """The compressed kernel inside a bzImage (boot protocol 2.08 or later), None if ``image`` is not one."""
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS" or int.from_bytes(image[0x206:0x208], "little") < 0x208:
        return None
    start = ((image[0x1F1] or 4) + 1) * 512 + int.from_bytes(image[0x248:0x24C], "little")
    return image[start:start + int.from_bytes(image[0x24C:0x250], "little")]


def _decompressed(payload: bytes) -> bytes | None:
    try:
        if payload.startswith(b"\xfd7zXZ\x00"):
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        if payload.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(wbits=31).decompress(payload)
    except (lzma.LZMAError, zlib.error):
        return None
    return None  # another compression: whoever boots the bzImage reads it, at its own pace


def kernel_elf(vmlinuz: Path) -> Path:
    """The ELF kernel inside ``vmlinuz``, unpacked once and cached; ``vmlinuz`` itself when it holds none we
    read. Booting the ELF skips the decompression an emulated CPU pays at every boot (GuestImage.boot_kernel)
    and that libxenguest would pay in dom0 at every domain build: in the lab, `xl create` of a PV domU took
    5.6 s with Debian's xz-packed vmlinuz and 0.7 s with the ELF (docs/environments-xen.md)."""
    image = vmlinuz.read_bytes()
    target = cache_dir() / f"vmlinux-{hashlib.sha256(image).hexdigest()[:16]}.elf"
    if not target.exists():
        payload = _bzimage_payload(image)
        elf = _decompressed(payload) if payload is not None else None
        if elf is None or not elf.startswith(b"\x7fELF"):
            return vmlinuz
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, elf)
        prune_cache(target.parent, "vmlinux-*.elf", target)
    mark_used(target)
    return target


def arch_cache(arch: str = "x86_64") -> Path:
    """Where what is built for guests of ``arch`` is cached: the cache itself for x86_64, a directory of its own
    for another architecture (its kernels, busybox and initramfs never replace x86_64's, nor are pruned by them)."""
    path = cache_dir() if arch == "x86_64" else cache_dir() / arch
    path.mkdir(parents=True, exist_ok=True)
    return path


def apt_name(package: str, arch: str) -> str:
    """How apt here names ``package`` of ``arch``: qualified (``busybox-static:arm64``) when it is foreign."""
    return package if arch == native_arch() else f"{package}:{DEBIAN_ARCHES[arch]}"


def _foreign_hint(arch: str) -> str:
    if arch == native_arch():
        return "run apt-get update"
    return f"dpkg --add-architecture {DEBIAN_ARCHES[arch]} && apt-get update; scripts/setup.sh arm does"


def _unpacked_package(home: Path, package: str, arch: str, wanted: str) -> Path:
    """Debian's ``package`` of ``arch``, downloaded (``apt-get download``) and unpacked (``dpkg-deb -x``) once
    under ``home``: the tree, which holds ``wanted`` (a glob). Nothing is installed on this machine."""
    tree = home / "tree"
    if any(tree.glob(wanted)):
        return tree
    downloads = home / "deb"
    downloads.mkdir(parents=True, exist_ok=True)
    for stale in downloads.glob("*.deb"):
        stale.unlink()
    _run(["apt-get", "download", package], downloads, f"apt-get download {package} ({_foreign_hint(arch)})")
    debs = sorted(downloads.glob("*.deb"))
    if not debs:
        raise RunError(f"guest image: apt-get download {package} left no package")
    staging = Path(tempfile.mkdtemp(dir=home))
    _run(["dpkg-deb", "-x", str(debs[0]), str(staging)], home, "dpkg-deb -x")
    try:
        staging.rename(tree)
    except OSError:  # another rtvirt unpacked it meanwhile: use theirs
        shutil.rmtree(staging, ignore_errors=True)
    if not any(tree.glob(wanted)):
        raise RunError(f"guest image: {package} holds no {wanted}")
    return tree


def busybox(arch: str = "x86_64") -> Path:
    """busybox-static for ``arch``: this machine's own for its architecture, else Debian's package of that
    architecture, unpacked once into the cache."""
    if arch == native_arch():
        if not BUSYBOX.exists():
            raise RunError("guest image: /usr/bin/busybox is missing (apt-get install busybox-static)")
        return BUSYBOX
    home = arch_cache(arch) / "busybox"
    return _unpacked_package(home, apt_name("busybox-static", arch), arch, "bin/busybox") / "bin" / "busybox"


def _fetch_kernel(cache: Path, flavour: str = "linux", arch: str = "x86_64") -> tuple[Path, Path]:
    """Download and unpack the flavour's Debian kernel package for ``arch`` once (under ``cache``, which is
    ``arch_cache(arch)`` for a foreign one); return (vmlinuz, modules dir)."""
    package = apt_name(KERNEL_PACKAGES[flavour].format(debian_arch=DEBIAN_ARCHES[arch]), arch)
    home = cache / KERNEL_CACHE_DIRS[flavour]
    found = sorted((home / "tree").glob("boot/vmlinuz-*"))
    if not found:
        home.mkdir(parents=True, exist_ok=True)
        # The meta-package only depends on the versioned one; ask apt which it is.
        depends = subprocess.run(["apt-cache", "depends", package], capture_output=True, text=True)
        match = re.search(r"Depends:\s*(linux-image-[0-9][^\s]*)", depends.stdout)
        if not match:
            raise RunError(f"guest image: apt cannot resolve {package} ({_foreign_hint(arch)})")
        found = sorted(_unpacked_package(home, match.group(1), arch, "boot/vmlinuz-*").glob("boot/vmlinuz-*"))
    vmlinuz = found[-1]
    release = vmlinuz.name.removeprefix("vmlinuz-")
    return vmlinuz, vmlinuz.parent.parent / "lib" / "modules" / release


def _module_depends(path: Path) -> list[str]:
    match = re.search(rb"depends=([^\0]*)\0", path.read_bytes())
    return [d for d in match.group(1).decode().split(",") if d] if match else []


def _module_index(modules_dir: Path) -> dict[str, Path]:
    """Module name -> file, kept beside the unpacked tree: walking its thousands of files is slow where the
    cache is read over a network file system (a Xen lab's dom0 running rtvirt from a 9p share of the host)."""
    saved = modules_dir / "rtvirt-module-index.json"
    with contextlib.suppress(OSError, ValueError):
        return {name: modules_dir / relative for name, relative in json.loads(saved.read_text()).items()}
    index = {p.name.removesuffix(".ko").replace("-", "_"): p for p in modules_dir.rglob("*.ko")}
    with contextlib.suppress(OSError):
        write_atomically(saved, json.dumps({n: str(p.relative_to(modules_dir)) for n, p in index.items()}).encode())
    return index


def _modules_in_load_order(modules_dir: Path, names: Iterable[str] = GUEST_MODULES) -> list[Path]:
    """Modules ``names`` and their dependencies, each after what it depends on."""
    index = _module_index(modules_dir)
    ordered: list[Path] = []

    def visit(name: str) -> None:
        path = index.get(name.replace("-", "_"))
        if path is None:
            raise RunError(f"guest image: kernel module {name} not found in {modules_dir}")
        if path in ordered:
            return
        for dependency in _module_depends(path):
            visit(dependency)
        ordered.append(path)

    for module in names:
        visit(module)
    return ordered


def _base_archive(modules: list[Path], agents: dict[str, Path], busybox_binary: Path) -> bytes:
    archive = Cpio()
    for directory in ("bin", "sbin", "proc", "sys", "dev", "tmp", "rtvirt", "rtvirt/bin", "rtvirt/modules.d"):
        archive.directory(directory)
    archive.file("bin/busybox", busybox_binary.read_bytes(), executable=True)
    archive.file("init", INIT_SCRIPT.encode(), executable=True)
    for module in modules:
        archive.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    archive.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    for name, path in agents.items():
        archive.file(f"{GUEST_AGENT_DIR.lstrip('/')}/{name}", path.read_bytes(), executable=True)
    return archive.to_bytes()


def _preempt_rt(vmlinuz: Path) -> bool:
    config = vmlinuz.parent / vmlinuz.name.replace("vmlinuz-", "config-", 1)
    try:
        return "\nCONFIG_PREEMPT_RT=y\n" in config.read_text(errors="replace")
    except OSError:
        return False


def guest_image(flavour: str = "linux", arch: str = "x86_64") -> GuestImage:
    """The cached guest image of a kernel flavour (``linux`` or ``linux-rt``) for guests of ``arch``: Debian's
    kernel of that architecture, its busybox and our agents built for it; (re)built when the agents, busybox or
    init script changed."""
    if flavour not in KERNEL_PACKAGES:
        raise ValueError(f"unknown guest kernel flavour {flavour!r}")
    cache = arch_cache(arch)
    shell = busybox(arch)
    vmlinuz, modules_dir = _fetch_kernel(cache, flavour, arch)
    modules = _modules_in_load_order(modules_dir)
    agents: dict[str, Path] = {}
    for name in AGENTS:
        try:
            agents[name] = agent_path(name, arch)
        except RunError:
            if name == "rtvirt-probe":
                raise
    digest = hashlib.sha256(INIT_SCRIPT.encode())
    for path in [shell, *modules, *agents.values()]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    # one cached initramfs per flavour (their modules differ): "initramfs-<hash>" and "initramfs-rt-<hash>"
    prefix = "initramfs-rt-" if flavour == "linux-rt" else "initramfs-"
    initramfs = cache / f"{prefix}{digest.hexdigest()[:16]}.cpio"
    if not initramfs.exists():
        write_atomically(initramfs, _base_archive(modules, agents, shell))
        prune_cache(cache, f"{prefix}*.cpio", initramfs,
                    lambda old: flavour == "linux-rt" or not old.name.startswith("initramfs-rt-"))
    mark_used(initramfs)
    return GuestImage(vmlinuz, initramfs, modules_dir.name, flavour, _preempt_rt(vmlinuz), arch)
