"""The lab's dom0 initramfs: busybox, the Debian kernel's Xen modules, the ``xl`` toolstack and OpenSSH's
``sshd`` with every library they link, our static agents and the domUs' files; and, on first use, what HVM
domUs need in it (the device model and firmware)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ...errors import RunError
from ...fileio import mark_used, prune_cache, write_atomically
from ..guest_image import BUSYBOX, Cpio, _fetch_kernel, _modules_in_load_order, cache_dir, kernel_elf
from ..lab_machine import sshd_config
from .files import A653_TOOL, VIF_HOTPLUG, VIF_SCRIPT, _domu_base, _run, a653_tool

__all__ = ["DOM0_MODULES", "DOM0_PATH", "DOM0_SERVICES", "DOMU_INITRAMFS", "DOMU_KERNEL", "dom0_image", "hvm_archive"]


TOOLSTACK = ("/usr/lib/xen-4.17/bin/xl", "/usr/lib/xen-4.17/bin/xenstored", "/usr/lib/xen-4.17/bin/xen-init-dom0",
             "/usr/lib/xen-4.17/bin/xenconsoled", "/usr/lib/xen-4.17/bin/libxl-save-helper",
             "/usr/lib/xen-4.17/bin/xenconsole", "/usr/lib/xen-4.17/bin/xentrace",
             "/usr/bin/xenstore-read", "/usr/bin/xenstore-write",
             "/usr/bin/xenstore-rm", "/usr/sbin/sshd")
# xl dlopens libgcc_s for pthread_cancel; ldd does not name it
EXTRA_LIBRARIES = ("/lib/x86_64-linux-gnu/libgcc_s.so.1",)
DOM0_MODULES = ("xen_evtchn", "xen_privcmd", "xen_gntdev", "xen_gntalloc", "xenfs", "xen_netback",
                "virtio_pci", "virtio_net")
DOM0_READY_MARK = "RTVIRT-DOM0-READY"
DOM0_PATH = "/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DOM0_LIBRARY_PATH = "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"
DOMU_KERNEL = "/rtvirt/domu/vmlinux"  # its ELF (guest_image.kernel_elf), for PV and PVH domUs
DOMU_INITRAMFS = "/rtvirt/domu/base.cpio"


# What every lab's dom0 starts once its file systems and modules are there (its own init's last lines; also the
# arm64 lab's dom0 root's: dom0_root.py): xenstored, xenconsoled, the network QEMU's user mode gives, sshd.
DOM0_SERVICES = rf"""mount -t xenfs xenfs /proc/xen
xenstored --pid-file /var/run/xen/xenstored.pid
n=0; until [ -s /var/run/xen/xenstored.pid ] || [ $n -gt 100 ]; do n=$((n+1)); sleep 0.1; done
xen-init-dom0
xenconsoled --log=guest --log-dir=/var/log/xen
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
chmod 600 /etc/ssh/ssh_host_ed25519_key
/usr/sbin/sshd -f /etc/ssh/sshd_config -E /var/log/sshd.log
echo "{DOM0_READY_MARK} $(cat /proc/uptime)"
while :; do sleep 3600; done
"""

DOM0_INIT = rf"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH={DOM0_PATH} LD_LIBRARY_PATH={DOM0_LIBRARY_PATH}
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /var/run/xen /var/lib/xen /var/lib/xenstored /var/log/xen /run/rtvirt /run/sshd
mount -t devpts devpts /dev/pts
for m in $(cat /rtvirt/modules); do insmod "/rtvirt/modules.d/$m" || echo "rtvirt: insmod $m failed"; done
""" + DOM0_SERVICES


SSHD_CONFIG = sshd_config(f"PATH={DOM0_PATH} LD_LIBRARY_PATH={DOM0_LIBRARY_PATH}")


def _libraries(binaries: tuple[str, ...]) -> list[str]:
    """Every shared library the binaries load, as ldd names them (their paths kept in dom0)."""
    found: set[str] = set(EXTRA_LIBRARIES)
    for binary in binaries:
        output = _run(["ldd", binary], Path("/"), f"ldd {binary}", timeout=60)
        for line in output.splitlines():
            match = re.search(r"(/\S+)\s+\(0x", line)
            if match:
                found.add(match.group(1))
    return sorted(found)


# HVM domUs' device model and firmware (Debian's qemu-system-xen and seabios); the lab's dom0 gets them on first
# use. -vnc none still reads the default keymap.
DEVICE_MODEL = "/usr/libexec/xen-qemu-system-i386"
HVM_FIRMWARE = ("/usr/lib/xen-4.17/boot/hvmloader", "/usr/share/seabios/bios-256k.bin")
QEMU_DATA = Path("/usr/share/qemu")
QEMU_KEYMAPS = ("en-us",)
QEMU_DATA_LIMIT = 600_000  # option ROMs (linuxboot_dma.bin, ...) are small; the big firmware images are not needed


def hvm_archive() -> bytes:
    """A tar of what HVM domUs need in a lab's dom0 beyond its image: the device model, the libraries it adds,
    hvmloader, SeaBIOS and QEMU's option ROMs and keymap (about 30 MB), paths kept."""
    import io
    import tarfile

    missing = [path for path in (DEVICE_MODEL, *HVM_FIRMWARE) if not Path(path).exists()]
    if missing:
        raise RunError(f"xen: HVM domUs need {missing[0]} (apt-get install qemu-system-xen seabios; "
                       "scripts/setup.sh does)")
    in_image = set(_libraries(TOOLSTACK))
    data = [path for path in QEMU_DATA.iterdir() if path.is_file() and path.stat().st_size < QEMU_DATA_LIMIT]
    files = [Path(DEVICE_MODEL), *map(Path, HVM_FIRMWARE), *sorted(data),
             *(QEMU_DATA / "keymaps" / name for name in QEMU_KEYMAPS),
             *(Path(lib) for lib in _libraries((DEVICE_MODEL,)) if lib not in in_image)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in files:
            tar.add(path.resolve(), arcname=str(path).lstrip("/"))  # symlinks (ROMs) as the files they name
    return buffer.getvalue()

def dom0_image() -> tuple[Path, Path]:
    """(dom0 kernel, dom0 base initramfs), the initramfs rebuilt when anything it holds changed. The kernel is
    the ELF inside Debian's bzImage, for dom0 (Xen loads it without decompressing) and its domUs alike."""
    missing = [path for path in (*TOOLSTACK, *EXTRA_LIBRARIES, str(BUSYBOX)) if not Path(path).exists()]
    if missing:
        raise RunError(f"xen lab: {missing[0]} is missing (scripts/setup.sh installs xen-utils-4.17, "
                       "openssh-server and busybox-static)")
    cache = cache_dir()
    vmlinuz, modules_dir = _fetch_kernel(cache)
    domu = _domu_base(modules_dir)
    elf = kernel_elf(vmlinuz)
    modules = _modules_in_load_order(modules_dir, DOM0_MODULES)
    a653 = a653_tool()
    libraries = _libraries((*TOOLSTACK, str(a653)))
    files = [*TOOLSTACK, *libraries, str(BUSYBOX), *map(str, modules), str(a653)]
    digest = hashlib.sha256(DOM0_INIT.encode() + VIF_HOTPLUG.encode() + SSHD_CONFIG.encode() + domu)
    for path in [*files, str(vmlinuz)]:
        digest.update(path.encode())
        digest.update(Path(path).read_bytes())
    target = cache / "xen" / f"dom0-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        mark_used(target)
        return elf, target
    archive = Cpio()
    directories = {"bin", "sbin", "proc", "sys", "dev", "tmp", "run", "var", "var/log", "var/run", "var/lib",
                   "etc", "etc/ssh", "etc/xen", "etc/xen/scripts", "root", "root/.ssh", "rtvirt",
                   "rtvirt/modules.d", "rtvirt/domu", "var/empty"}
    for path in [*TOOLSTACK, *libraries]:
        parts = Path(path).parent.parts[1:]
        directories.update("/".join(parts[:i + 1]) for i in range(len(parts)))
    for directory in sorted(directories, key=lambda d: d.count("/")):
        archive.directory(directory)
    archive.file("bin/busybox", BUSYBOX.read_bytes(), executable=True)
    archive.file("init", DOM0_INIT.encode(), executable=True)
    for path in [*TOOLSTACK, *libraries]:
        archive.file(path.lstrip("/"), Path(path).read_bytes(), executable=True)
    archive.file(f"usr/lib/xen-4.17/bin/{A653_TOOL}", a653.read_bytes(), executable=True)
    for module in modules:
        archive.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    archive.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    archive.file(DOMU_KERNEL.lstrip("/"), elf.read_bytes())
    archive.file(DOMU_INITRAMFS.lstrip("/"), domu)
    archive.file(VIF_SCRIPT.lstrip("/"), VIF_HOTPLUG.encode(), executable=True)
    archive.file("etc/xen/xl.conf", b'autoballoon="off"\n')
    archive.file("etc/ssh/sshd_config", SSHD_CONFIG.encode())
    archive.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n")
    archive.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, archive.to_bytes())
    prune_cache(target.parent, "dom0-*.cpio", target)
    return elf, target
