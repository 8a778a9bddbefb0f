"""A Xen lab whose dom0 sees host directories (virtio-9p), for tests/test_xen_dom0.py only: the test runs this
machine's own rtvirt inside the lab's dom0 from the host's root file system shared read-only.

Nothing in rtvirt needs shares, so they live here: the lab's QEMU gets one ``-virtfs`` per share and a CPU
model the host's binaries run on, and dom0's initramfs an overlay (the 9p modules and an ``/init`` that mounts
the shares at ``/mnt/<tag>`` before the toolstack starts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rtvirt.environments.guest_image import Cpio, _fetch_kernel, _modules_in_load_order, cache_dir
from rtvirt.environments.xen import XenLab, XenLabConfig
from rtvirt.environments.xen.dom0_image import DOM0_INIT, DOM0_MODULES
from rtvirt.environments.xen.lab import LabKeys
from rtvirt.errors import RunError
from rtvirt.procs import Supervisor

SHARE_MODULES = ("9p", "9pnet_virtio")
MOUNT_BEFORE = "xenstored --pid-file"  # the shares are mounted before dom0's toolstack starts
# numpy and pyarrow of the host die with SIGILL on plain qemu64 (the lab's TCG CPU): they need SSSE3, SSE4.1/4.2 and
# POPCNT (x86-64-v2), added to the lab's own CPU model, which keeps its nested paging (PVH domUs run here too)
X86_64_V2_FEATURES = ",+ssse3,+sse4.1,+sse4.2,+popcnt"


@dataclass(frozen=True)
class LabShare:
    """A host directory QEMU shares into the lab's dom0 (virtio-9p), mounted there at ``/mnt/<tag>``."""

    tag: str
    path: Path
    writable: bool = False


def _share_init(shares: tuple[LabShare, ...], modules: list[Path]) -> str:
    """dom0's /init with the 9p modules loaded and every share mounted before the toolstack starts."""
    lines = [f'insmod "/rtvirt/share-modules/{m.name}" || echo "rtvirt: insmod {m.name} failed"' for m in modules]
    for share in shares:
        # multidevs=remap on the QEMU side; cache=loose: the tree does not change under the test
        lines += [f"mkdir -p /mnt/{share.tag}",
                  f"mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,"
                  f"{'rw' if share.writable else 'ro'} {share.tag} /mnt/{share.tag} "
                  f"|| echo 'rtvirt: mounting the 9p share {share.tag} failed'"]
    at = DOM0_INIT.index(MOUNT_BEFORE)
    return DOM0_INIT[:at] + "\n".join(lines) + "\n" + DOM0_INIT[at:]


class SharingXenLab(XenLab):
    """A :class:`XenLab` whose dom0 mounts ``shares`` (host directories) at ``/mnt/<tag>``."""

    def __init__(self, config: XenLabConfig, dom0_vcpus: int, supervisor: Supervisor,
                 shares: tuple[LabShare, ...], earlier: list[str] | None = None) -> None:
        for share in shares:
            # QEMU's option syntax: a comma would start another option
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", share.tag) or "," in str(share.path):
                raise RunError(f"xen lab: cannot share {share.path} as {share.tag!r} (tag: lower-case word; "
                               "path: no comma)")
        super().__init__(config, dom0_vcpus, supervisor, earlier=earlier)
        self.shares = shares

    def _initrd(self, base: Path, keys: LabKeys) -> Path:
        initrd = super()._initrd(base, keys)
        _, modules_dir = _fetch_kernel(cache_dir())
        loaded = set(_modules_in_load_order(modules_dir, DOM0_MODULES))  # dom0's own /init loads these
        modules = [m for m in _modules_in_load_order(modules_dir, SHARE_MODULES) if m not in loaded]
        overlay = Cpio()  # a later archive's files replace the earlier one's: this /init wins
        overlay.directory("rtvirt/share-modules")
        for module in modules:
            overlay.file(f"rtvirt/share-modules/{module.name}", module.read_bytes())
        overlay.file("init", _share_init(self.shares, modules).encode(), executable=True)
        with initrd.open("ab") as out:
            out.write(overlay.to_bytes())
        return initrd

    def _qemu_argv(self, vmlinuz: Path, initrd: Path, port: int) -> list[str]:
        argv = super()._qemu_argv(vmlinuz, initrd, port)
        cpu = argv.index("-cpu") + 1
        if argv[cpu] != "host":
            argv[cpu] += X86_64_V2_FEATURES
        for share in self.shares:
            # multidevs=remap: files of different host file systems (/proc, /sys) under one share
            # keep distinct inode numbers, else dom0's 9p client takes one for the other
            argv += ["-virtfs", f"local,path={share.path},mount_tag={share.tag},security_model=none,"
                     "multidevs=remap" + ("" if share.writable else ",readonly=on")]
        return argv
