"""A throwaway TCG guest that runs this checkout's rtvirt in this host's own root file system: Debian's kernel
boots a busybox /init, which mounts the host's / read-only over virtio-9p (tmpfs on /tmp and /run, a writable
share on /tmp/out) and runs a test's shell script chrooted there. Whatever the script changes (cgroups, sysctls,
a daemon it starts) dies with the guest; the host's files cannot be written.

Used where the real thing must not run on the shared host: a cgroup v2 kernel (tests/test_host_v2.py), a tuned
daemon (tests/test_host_tuned.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rtvirt.environments.guest_image import (
    BUSYBOX,
    Cpio,
    _fetch_kernel,
    _modules_in_load_order,
    cache_dir,
    kernel_elf,
)

QEMU = shutil.which("qemu-system-x86_64")
GUEST_MODULES = ("virtio_pci", "9p", "9pnet_virtio")
DONE_MARK = "RTVIRT-GUEST-DONE"
CHECKOUT = Path(__file__).resolve().parents[1]  # whose rtvirt the guest runs (no spaces: a path we chose)

# Mounts the host's root under /host and prepares it to be chrooted into; then {body} runs (busybox sh, outside the
# chroot, /out is the writable share), then the guest powers off.
INIT = rf"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/modules.d/$m" || echo "insmod $m failed"; done
mkdir -p /host /checkout
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro host /host
# a checkout under /tmp or /run (a CI clone) is kept visible under the tmpfs mounted there below (a 9p share
# mounts once: the checkout is bound aside first, then back)
case "{CHECKOUT}" in /tmp/*|/run/*) mount -o bind "/host{CHECKOUT}" /checkout;; esac
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
case "{CHECKOUT}" in /tmp/*|/run/*) mkdir -p "/host{CHECKOUT}" && mount -o bind /checkout "/host{CHECKOUT}";; esac
mkdir /host/tmp/out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,rw out /host/tmp/out
ln -s /host/tmp/out /out
cp -r /host/root/.cache/matplotlib /host/tmp/matplotlib 2>/dev/null  # the report's font cache: not rebuilt
{{body}}
echo {DONE_MARK}
sync
poweroff -f
"""
# rtvirt as the guest runs it (one Python start per command; no bytecode written to the read-only checkout)
RTVIRT_ENV = "env HOME=/tmp PYTHONDONTWRITEBYTECODE=1 RTVIRT_CACHE=/tmp/cache MPLCONFIGDIR=/tmp/matplotlib"

needs_guest = pytest.mark.skipif(not (QEMU and BUSYBOX.exists() and os.geteuid() == 0),
                                 reason="needs QEMU, busybox and root")


def run_guest(tmp_path: Path, body: str, files: dict[str, str], append: str = "", timeout: float = 600,
              vcpus: int = 2) -> Path:
    """Boot a ``vcpus``-vCPU guest whose /init runs ``body`` after the mounts (``files`` are put in its initramfs root);
    returns the writable share (the guest's /out) once it powered off. Fails the test with the console's and
    the share's ``*.log`` ends when it does not finish in ``timeout`` s or never reaches the end of ``body``."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    vmlinuz, modules_dir = _fetch_kernel(cache_dir())
    modules = _modules_in_load_order(modules_dir, GUEST_MODULES)
    archive = Cpio()
    for name in ("bin", "proc", "sys", "dev", "modules.d"):
        archive.directory(name)
    archive.file("bin/busybox", BUSYBOX.read_bytes(), executable=True)
    archive.file("init", INIT.format(body=body).encode(), executable=True)
    for module in modules:
        archive.file(f"modules.d/{module.name}", module.read_bytes())
    archive.file("modules", "".join(f"{m.name}\n" for m in modules).encode())
    for name, text in files.items():
        archive.file(name, text.encode())
    initramfs = tmp_path / "guest.cpio"
    initramfs.write_bytes(archive.to_bytes())
    console = tmp_path / "console.log"
    # numpy and pyarrow of the host need more than qemu64 has (as the Xen lab's dom0 found); AVX2 off: under this
    # QEMU's TCG, numpy's AVX2 argsort returns unsorted orders (253 of 300 random int64 arrays; 0 without AVX2),
    # and np.unique(return_inverse=True) sorts through it
    qemu = subprocess.Popen(
        [QEMU, "-accel", "tcg", "-cpu", "Haswell-noTSX,-avx2", "-smp", str(vcpus), "-m", "1536", "-display", "none",
         "-nodefaults", "-no-reboot", "-serial", f"file:{console}", "-kernel", str(kernel_elf(vmlinuz)), "-initrd",
         str(initramfs), "-append", f"console=ttyS0 rdinit=/init quiet panic=-1 {append}".strip(),
         "-virtfs", "local,path=/,mount_tag=host,security_model=none,multidevs=remap,readonly=on",
         "-virtfs", f"local,path={out},mount_tag=out,security_model=none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        qemu.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        qemu.kill()
        qemu.wait()
        pytest.fail(f"the guest did not finish within {timeout:.0f} s:\n{_ends(console, out)}")
    text = console.read_text(errors="replace")
    if DONE_MARK not in text:
        pytest.fail(f"the guest stopped before the end of its script:\n{_ends(console, out)}")
    return out


def _ends(console: Path, out: Path) -> str:
    logs = [console, *sorted(out.glob("*.log"))]
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
