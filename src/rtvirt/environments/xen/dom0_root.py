"""The dom0 of a Xen lab on another architecture than this machine's (aarch64): a Debian root of that architecture
with Debian's ``xl`` toolstack, xenstored, xenconsoled, OpenSSH's sshd and busybox, as Debian installs them
(debian_root.py, the KVM lab's recipe); and a small boot initramfs (Debian's kernel modules for the disk, network
and Xen's devices, our domUs' kernel and initramfs) that mounts the root and hands over to its init.

The x86_64 lab's dom0 copies this machine's toolstack and its ``ldd`` closure instead (dom0_image.py); a foreign
architecture's binaries have no ``ldd`` here, and Debian resolves their dependencies as it does on a real arm64 host.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...fileio import mark_used, prune_cache, write_atomically
from ..debian_root import DOC_FILES, debian_root, handover_init
from ..guest_image import Cpio, _fetch_kernel, _modules_in_load_order, arch_cache, busybox, kernel_elf
from ..lab_machine import sshd_config
from .dom0_image import DOM0_MODULES, DOM0_PATH, DOM0_SERVICES, DOMU_INITRAMFS, DOMU_KERNEL
from .files import VIF_HOTPLUG, VIF_SCRIPT, _domu_base

__all__ = ["DOM0_FAILED_MARK", "dom0_root_image"]


ROOT_PACKAGES = ("xen-utils-4.17", "xenstore-utils", "openssh-server", "busybox-static", "iproute2", "procps", "mount")
# the root's disk and file system, then Xen's devices (DOM0_MODULES without x86's virtio-pci network)
BOOT_MODULES = ("virtio_mmio", "virtio_blk", "crc32c_generic", "ext4", "virtio_net",
                *(m for m in DOM0_MODULES if m not in ("virtio_pci", "virtio_net")))
DOM0_FAILED_MARK = "RTVIRT-DOM0-FAILED"
DOM0_INIT_PATH = "/usr/local/sbin/rtvirt-dom0-init"

# the initramfs: modules, the root mounted, this lab's keys and the domUs' files put in it, then the root's init
BOOT_INIT = handover_init(DOM0_FAILED_MARK, "dom0's root file system", """\
mkdir -p /newroot/root/.ssh /newroot/rtvirt/domu
cp /etc/ssh/ssh_host_ed25519_key /newroot/etc/ssh/ssh_host_ed25519_key
cp /root/.ssh/authorized_keys /newroot/root/.ssh/authorized_keys
cp /rtvirt/domu/* /newroot/rtvirt/domu/
""", DOM0_INIT_PATH, wait_tenths=300)

# the root's init (no systemd): tmpfs, then what every lab's dom0 starts (xenstored, xenconsoled, network, sshd)
ROOT_INIT = rf"""#!/bin/sh
export PATH={DOM0_PATH}
fail() {{ echo "{DOM0_FAILED_MARK} $*"; sleep 2; poweroff -f; }}
for tool in mount ip xl xenstored xen-init-dom0 xenconsoled xenstore-read sshd busybox; do
  command -v $tool >/dev/null || fail "$tool is missing from dom0's root"
done
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm /run/xen /var/lib/xen /var/lib/xenstored /var/log/xen /run/rtvirt /run/sshd
mount -t devpts devpts /dev/pts
{DOM0_SERVICES}"""

SSHD_CONFIG = sshd_config(f"PATH={DOM0_PATH}")


def _customise(root: Path) -> None:
    """Our init, sshd and xl configuration and the vif hotplug script in the root; the host keys openssh-server's
    installation made go (every lab gets its own)."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "ssh" / "sshd_config").write_text(SSHD_CONFIG)
    (root / "etc" / "xen" / "xl.conf").write_text('autoballoon="off"\n')
    (root / "etc" / "hostname").write_text("rtvirt-xen-dom0\n")
    for path, text in ((VIF_SCRIPT, VIF_HOTPLUG), (DOM0_INIT_PATH, ROOT_INIT)):
        script = root / path.lstrip("/")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        script.chmod(0o755)


def dom0_root_image(arch: str) -> tuple[Path, Path, Path]:
    """(dom0's kernel, its boot initramfs, its root image) for an ``arch`` lab, each built on first use and cached:
    the root under ``$RTVIRT_CACHE/xen-dom0/``, the initramfs under ``$RTVIRT_CACHE/<arch>/xen/``."""
    recipe = "\n".join((arch, *ROOT_PACKAGES, *DOC_FILES, ROOT_INIT, SSHD_CONFIG, VIF_HOTPLUG))
    root = debian_root("xen-dom0", f"dom0-{arch}", arch, ROOT_PACKAGES, DOC_FILES, recipe, _customise, "xen lab")
    vmlinuz, modules_dir = _fetch_kernel(arch_cache(arch), "linux", arch)
    kernel = kernel_elf(vmlinuz)  # Arm: Debian's Image as it is (nothing to unpack)
    shell = busybox(arch)
    modules = _modules_in_load_order(modules_dir, BOOT_MODULES)
    domu = _domu_base(modules_dir, "linux", arch)
    digest = hashlib.sha256(BOOT_INIT.encode() + domu)
    for path in [shell, kernel, *modules]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    target = arch_cache(arch) / "xen" / f"dom0-boot-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        mark_used(target)
        return kernel, target, root
    archive = Cpio()
    for directory in ("bin", "proc", "sys", "dev", "etc", "etc/ssh", "root", "root/.ssh", "rtvirt",
                      "rtvirt/modules.d", "rtvirt/domu"):
        archive.directory(directory)
    archive.file("bin/busybox", shell.read_bytes(), executable=True)
    archive.file("init", BOOT_INIT.encode(), executable=True)
    for module in modules:
        archive.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    archive.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    archive.file(DOMU_KERNEL.lstrip("/"), kernel.read_bytes())
    archive.file(DOMU_INITRAMFS.lstrip("/"), domu)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, archive.to_bytes())
    prune_cache(target.parent, "dom0-boot-*.cpio", target)
    return kernel, target, root
