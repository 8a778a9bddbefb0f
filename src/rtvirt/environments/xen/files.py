"""Files any dom0 needs, a Xen host's or a lab's: the ARINC 653 schedule tool, the vif hotplug script, the
domUs' kernel and initramfs (the guest image plus the netfront overlay)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...agents import XEN_A653, agent_path
from ...errors import RunError
from ...fileio import mark_used, prune_cache, write_atomically
from ..guest_image import (
    GUEST_MODULES,
    Cpio,
    _fetch_kernel,
    _modules_in_load_order,
    arch_cache,
    guest_image,
    kernel_elf,
)
from ..lab_machine import run_step

__all__ = ["A653_TOOL", "DOM0_LINK_ADDRESS", "VIF_HOTPLUG", "VIF_SCRIPT", "a653_tool", "local_domu_files"]


BUILD_TIMEOUT_S = 3600


def _run(argv: list[str], cwd: Path, what: str, timeout: float = BUILD_TIMEOUT_S,
         env: dict[str, str] | None = None) -> str:
    return run_step(argv, cwd, f"xen lab: {what}", timeout, env)


# ---- rtvirt-a653: xl sets no ARINC 653 schedule, libxenctrl does (agents/xen/rtvirt-a653.c) ------------

A653_TOOL = XEN_A653


def a653_tool() -> Path:
    """The ARINC 653 schedule tool, built with the agents where libxenctrl's headers are (libxen-dev)."""
    try:
        return agent_path(XEN_A653)
    except RunError:
        raise RunError("xen: the ARINC 653 scheduler needs rtvirt-a653, which the build makes only where "
                       "libxenctrl's headers are (apt-get install libxen-dev, then make setup; scripts/setup.sh xen "
                       "does both)") from None


# ---- the domUs' network link to dom0 ----------------------------------------------------------------


DOMU_MODULES = (*GUEST_MODULES, "xen_netfront")
VIF_SCRIPT = "/etc/xen/scripts/rtvirt-vif"
# dom0's address on every domU link (a /32 on each vif) and the domUs' addresses, 10.213.0.N
DOM0_LINK_ADDRESS = "10.213.0.1"


# The hotplug script libxl runs for a domU's vif (online/offline): a point-to-point route to the domU's
# address. netback waits for hotplug-status before it connects the frontend.
VIF_HOTPLUG = rf"""#!/bin/sh
case "$1" in
online|add)
  address=$(xenstore-read "$XENBUS_PATH/ip")
  ip link set "$vif" up
  ip addr add {DOM0_LINK_ADDRESS}/32 dev "$vif"
  ip route add "$address/32" dev "$vif"
  xenstore-write "$XENBUS_PATH/hotplug-status" connected
  ;;
offline|remove)
  ip link set "$vif" down 2>/dev/null
  xenstore-rm "$XENBUS_PATH/hotplug-status" 2>/dev/null
  ;;
esac
exit 0
"""


def _domu_base(modules_dir: Path, flavour: str = "linux", arch: str = "x86_64") -> bytes:
    """The guest image's initramfs plus an overlay: the netfront driver and a module list naming it."""
    image = guest_image(flavour, arch)
    modules = _modules_in_load_order(modules_dir, DOMU_MODULES)
    overlay = Cpio()
    for module in modules:
        overlay.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    overlay.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    return image.initramfs.read_bytes() + overlay.to_bytes()

def local_domu_files(flavour: str = "linux", mode: str = "pv", arch: str = "x86_64") -> tuple[Path, Path]:
    """(kernel, initramfs) of an ``arch`` domU with the flavour's guest kernel (guest_image.KERNEL_PACKAGES): the
    guest image plus the netfront overlay. The kernel is its ELF for PV and PVH (on Arm, Debian's Image as it
    is), the bzImage for an HVM domU (its device model boots that). A local dom0 boots them from here; a lab's
    dom0 gets copies of them unless they are the ones its image holds (linux's kernel)."""
    cache = arch_cache(arch)
    vmlinuz, modules_dir = _fetch_kernel(cache, flavour, arch)
    base = _domu_base(modules_dir, flavour, arch)
    prefix = "domu-" if flavour == "linux" else f"domu-{flavour}-"
    target = cache / "xen" / f"{prefix}{hashlib.sha256(base).hexdigest()[:16]}.cpio"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, base)
        prune_cache(target.parent, f"{prefix}*.cpio", target,  # not another flavour's ("domu-linux-rt-...")
                    lambda old: old.name.removeprefix(prefix).count("-") == 0)
    mark_used(target)
    return vmlinuz if mode == "hvm" else kernel_elf(vmlinuz), target
