"""A Debian root file system that a lab boots, made by ``mmdebstrap`` from Debian's archive and written into an
ext4 image (sparse), built once and cached, content-addressed by its recipe and the versions of its packages as
apt here names them (after ``apt-get update`` brings new ones, the next lab gets a new root).

The KVM lab's root (QEMU, libvirtd, sshd) and the arm64 Xen lab's dom0 (the xl toolstack, sshd) are such roots.
A root of a foreign architecture (arm64 on an x86_64 machine) has its packages' maintainer scripts run by
qemu-user-static through binfmt_misc, which ``foreign_emulation`` sets up (mounted and registered by hand: this
machine's init is not systemd, which would do it at boot).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..agents import native_arch
from ..errors import RunError
from ..fileio import mark_used, prune_cache
from .guest_image import DEBIAN_ARCHES, apt_name, cache_dir
from .lab_machine import run_step

__all__ = ["DOC_FILES", "MIRROR", "SECURITY_MIRROR", "debian_root", "foreign_emulation", "handover_init"]


# the archive's suites a root is made from, as this machine's own sources name them (bookworm)
SUITES = ("{codename}", "{codename}-updates")
SECURITY = "{codename}-security"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# what no lab reads (dpkg leaves them out: --dpkgopt=path-exclude)
DOC_FILES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
FREE_SPACE = 1536 << 20  # room in a root for what runs in it (libvirt's volumes, domUs' files, logs)
BUILD_TIMEOUT_S = 1800
BINFMT = Path("/proc/sys/fs/binfmt_misc")
# qemu-user-static's registration of each foreign architecture (systemd-binfmt reads the same files at boot)
BINFMT_RULES = {"aarch64": Path("/usr/lib/binfmt.d/qemu-aarch64.conf")}


def _codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        text = ""
    match = re.search(r"^VERSION_CODENAME=(\w+)", text, re.M)
    if not match:
        raise RunError("lab root: this machine's /etc/os-release names no Debian release (VERSION_CODENAME); "
                       "a lab's root is made from Debian's archive")
    return match.group(1)


def _candidate_versions(packages: tuple[str, ...], arch: str) -> str:
    """``package=version`` of each package as apt here would install it (its index after apt-get update). One
    ``apt-cache policy`` for all of them: each call loads apt's whole cache (the KVM lab's 8 packages one at a
    time took 5.9 s of every lab boot here, 13 s under the suite's load; at once 0.7 s)."""
    names = [apt_name(package, arch) for package in packages]
    output = run_step(["apt-cache", "policy", *names], Path("/"), "lab root: apt-cache policy", timeout=120)
    candidates = dict(re.findall(r"^(\S+):\n(?:[ \t].*\n)*?\s+Candidate:\s*(\S+)", output, re.MULTILINE))
    found = []
    for package, name in zip(packages, names, strict=True):
        if candidates.get(name, "(none)") == "(none)":
            hint = "" if arch == native_arch() else f"; dpkg --add-architecture {DEBIAN_ARCHES[arch]} first"
            raise RunError(f"lab root: apt knows no {name} (apt-get update{hint}; a lab's root is made from "
                           "Debian's archive; scripts/setup.sh kvm arm does both)")
        found.append(f"{package}={candidates[name]}")
    return "\n".join(found)


def foreign_emulation(arch: str) -> None:
    """Make this machine run ``arch``'s binaries (a foreign root's maintainer scripts): binfmt_misc mounted and
    qemu-user-static's rule for ``arch`` registered. Needs root; the registration lasts until the next boot."""
    if arch == native_arch():
        return
    rule = BINFMT_RULES.get(arch)
    if rule is None or not rule.exists():
        raise RunError(f"lab root: building an {arch} root needs qemu-user-static's binfmt rule {rule} "
                       "(apt-get install qemu-user-static; scripts/setup.sh arm does)")
    if (BINFMT / f"qemu-{arch}").exists():
        return
    if not (BINFMT / "register").exists():
        run_step(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], Path("/"),
                 "lab root: mounting binfmt_misc (root needed)", timeout=30)
    try:
        (BINFMT / "register").write_text(rule.read_text().strip())
    except OSError as exc:
        if not (BINFMT / f"qemu-{arch}").exists():  # another build registered it meanwhile
            raise RunError(f"lab root: registering {arch} emulation with binfmt_misc failed ({exc}); "
                           "root is needed") from None


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One build of a lab's files at a time on this machine (test workers and checkouts share the cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def debian_root(directory_name: str, stem: str, arch: str, packages: tuple[str, ...], excluded: tuple[str, ...],
                recipe: str, customise: Callable[[Path], None], label: str) -> Path:
    """The cached ext4 image ``$RTVIRT_CACHE/<directory_name>/<stem>-<digest>.ext4`` of a Debian root of ``arch``
    with ``packages`` (``--variant=essential``, files matching ``excluded`` left out), then ``customise``\\ d;
    built on first use (mmdebstrap: about 40 s natively, 3 min for a foreign root under qemu-user). ``recipe``
    is everything else that makes it (scripts, configuration): its digest covers it."""
    if shutil.which("mmdebstrap") is None or shutil.which("mke2fs") is None:
        raise RunError(f"{label}: building the lab's root needs mmdebstrap and mke2fs (apt-get install mmdebstrap "
                       "e2fsprogs; scripts/setup.sh kvm does)")
    digest = hashlib.sha256((recipe + _candidate_versions(packages, arch)).encode()).hexdigest()[:16]
    directory = cache_dir() / directory_name
    target = directory / f"{stem}-{digest}.ext4"
    if target.exists():
        mark_used(target)
        return target
    with _build_lock(directory):
        if not target.exists():  # another process built it while this one waited
            foreign_emulation(arch)
            _build(arch, packages, excluded, customise, target, label)
    prune_cache(directory, f"{stem}-*.ext4", target)
    return target


def _build(arch: str, packages: tuple[str, ...], excluded: tuple[str, ...], customise: Callable[[Path], None],
           target: Path, label: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        root = work / "root"
        codename = _codename()
        sources = [f"deb {MIRROR} {suite.format(codename=codename)} main" for suite in SUITES]
        sources.append(f"deb {SECURITY_MIRROR} {SECURITY.format(codename=codename)} main")
        run_step(["mmdebstrap", "--variant=essential", "--mode=root", f"--architectures={DEBIAN_ARCHES[arch]}",
                  f"--include={','.join(packages)}",
                  *(f"--dpkgopt=path-exclude={pattern}" for pattern in excluded),
                  codename, str(root), *sources], work, f"{label}: mmdebstrap", timeout=BUILD_TIMEOUT_S)
        customise(root)
        used = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        partial = work / "root.ext4"
        run_step(["mke2fs", "-q", "-F", "-t", "ext4", "-L", f"rtvirt-{target.parent.name}", "-d", str(root),
                  str(partial), f"{(int(used * 1.25) + FREE_SPACE) >> 20}M"], work, f"{label}: mke2fs", timeout=600)
        partial.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def handover_init(failed_mark: str, root_name: str, prepare: str, init: str, wait_tenths: int = 200) -> str:
    """The ``/init`` of a lab's boot initramfs: busybox, its modules loaded, the root (``/dev/vda``, ext4) mounted
    on /newroot, ``prepare`` run (shell lines: checks, this lab's files copied in; ``fail WHY`` ends the boot
    with ``failed_mark``), then the root's own ``init``."""
    return rf"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() {{ echo "{failed_mark} $*"; sleep 2; poweroff -f; }}
for m in $(cat /rtvirt/modules); do insmod "/rtvirt/modules.d/$m" || echo "rtvirt: insmod $m failed"; done
n=0; until [ -b /dev/vda ] || [ $n -gt {wait_tenths} ]; do n=$((n+1)); sleep 0.1; done
mkdir -p /newroot
mount -t ext4 /dev/vda /newroot || fail "cannot mount {root_name} (/dev/vda)"
{prepare}for d in proc sys dev; do mount --move /$d /newroot/$d; done
exec switch_root /newroot {init}
"""
