"""Files any dom0 needs, a Xen host's or a lab's: the ARINC 653 schedule tool, the vif hotplug script, the
domUs' kernel and initramfs (the guest image plus the netfront overlay)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...errors import RunError
from ...fileio import write_atomically
from ..guest_image import GUEST_MODULES, Cpio, _fetch_kernel, _modules_in_load_order, cache_dir, guest_image

__all__ = ["A653_TOOL", "DOM0_LINK_ADDRESS", "VIF_HOTPLUG", "VIF_SCRIPT", "a653_tool", "local_domu_files"]


BUILD_TIMEOUT_S = 3600


def _run(argv: list[str], cwd: Path, what: str, timeout: float = BUILD_TIMEOUT_S,
         env: dict[str, str] | None = None) -> str:
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunError(f"xen lab: {what} failed: {exc}") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:] or ["no output"]
        raise RunError(f"xen lab: {what} failed: {' | '.join(line[:200] for line in tail)}")
    return result.stdout


# ---- rtvirt-a653: xl sets no ARINC 653 schedule, libxenctrl does ------------------------------------


A653_TOOL = "rtvirt-a653"
A653_SOURCE = r"""/* rtvirt-a653: set or show the ARINC 653 schedule of a cpupool (xl has no command for it).
   argv: POOL_ID MAJOR_FRAME_NS then UUID VCPU RUNTIME_NS per window: sets it, prints nothing;
   argv: POOL_ID alone: prints "major_frame NS" and one "UUID VCPU RUNTIME_NS" line per window. */
#define __XEN_TOOLS__ 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xenctrl.h>

static int parse_uuid(const char *text, uint8_t out[16]) {
    int n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-') continue;
        char c = *p; int v;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        else return -1;
        if (n % 2 == 0) out[n / 2] = (uint8_t)(v << 4); else out[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32 ? 0 : -1;
}

static int show(uint32_t pool) {
    static struct xen_sysctl_arinc653_schedule schedule;
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_get(xch, pool, &schedule);
    xc_interface_close(xch);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_get"); return 1; }
    printf("major_frame %llu\n", (unsigned long long)schedule.major_frame);
    for (int i = 0; i < schedule.num_sched_entries && i < ARINC653_MAX_DOMAINS_PER_SCHEDULE; i++) {
        const uint8_t *h = schedule.sched_entries[i].dom_handle;
        for (int b = 0; b < 16; b++) printf("%02x%s", h[b], (b == 3 || b == 5 || b == 7 || b == 9) ? "-" : "");
        printf(" %u %llu\n", schedule.sched_entries[i].vcpu_id,
               (unsigned long long)schedule.sched_entries[i].runtime);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2) return show((uint32_t)strtoul(argv[1], NULL, 10));
    if (argc < 6 || (argc - 3) % 3 != 0 || (argc - 3) / 3 > ARINC653_MAX_DOMAINS_PER_SCHEDULE) {
        fprintf(stderr, "usage: rtvirt-a653 POOL_ID MAJOR_FRAME_NS (UUID VCPU RUNTIME_NS)...\n");
        return 2;
    }
    static struct xen_sysctl_arinc653_schedule schedule;
    memset(&schedule, 0, sizeof(schedule));
    uint32_t pool = (uint32_t)strtoul(argv[1], NULL, 10);
    schedule.major_frame = strtoull(argv[2], NULL, 10);
    schedule.num_sched_entries = (uint8_t)((argc - 3) / 3);
    for (int i = 0; i < schedule.num_sched_entries; i++) {
        if (parse_uuid(argv[3 + 3 * i], schedule.sched_entries[i].dom_handle) != 0) {
            fprintf(stderr, "rtvirt-a653: bad UUID %.40s\n", argv[3 + 3 * i]);
            return 2;
        }
        schedule.sched_entries[i].vcpu_id = (uint32_t)strtoul(argv[4 + 3 * i], NULL, 10);
        schedule.sched_entries[i].runtime = strtoull(argv[5 + 3 * i], NULL, 10);
    }
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_set(xch, pool, &schedule);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_set"); xc_interface_close(xch); return 1; }
    xc_interface_close(xch);
    return 0;
}
"""


def a653_tool() -> Path:
    """The ARINC 653 schedule setter, compiled against libxenctrl on first use (libxen-dev)."""
    digest = hashlib.sha256(A653_SOURCE.encode()).hexdigest()[:16]
    target = cache_dir() / "xen" / f"{A653_TOOL}-{digest}"
    if target.exists():
        return target
    if not Path("/usr/include/xenctrl.h").exists():
        raise RunError("xen: the ARINC 653 scheduler needs libxenctrl's headers (apt-get install libxen-dev; "
                       "scripts/setup.sh does)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="a653-", dir=target.parent))
    try:
        (work / "a653.c").write_text(A653_SOURCE)
        _run(["cc", "-O2", "-Wall", "-o", str(work / A653_TOOL), str(work / "a653.c"), "-lxenctrl"], work,
             "compiling rtvirt-a653", timeout=300)
        os.replace(work / A653_TOOL, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


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


def _domu_base(modules_dir: Path, flavour: str = "linux") -> bytes:
    """The guest image's initramfs plus an overlay: the netfront driver and a module list naming it."""
    image = guest_image(flavour)
    modules = _modules_in_load_order(modules_dir, DOMU_MODULES)
    overlay = Cpio()
    for module in modules:
        overlay.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    overlay.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    return image.initramfs.read_bytes() + overlay.to_bytes()

def local_domu_files(flavour: str = "linux") -> tuple[Path, Path]:
    """(kernel, initramfs) of a domU with the flavour's guest kernel (guest_image.KERNEL_PACKAGES): the guest
    image plus the netfront overlay. A local dom0 boots them from here; a lab's dom0 gets copies of them
    unless they are the ones its image holds (linux)."""
    vmlinuz, modules_dir = _fetch_kernel(cache_dir(), flavour)
    base = _domu_base(modules_dir, flavour)
    prefix = "domu-" if flavour == "linux" else f"domu-{flavour}-"
    target = cache_dir() / "xen" / f"{prefix}{hashlib.sha256(base).hexdigest()[:16]}.cpio"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob(f"{prefix}*.cpio"):
            if old.name.removeprefix(prefix).count("-") == 0:  # not another flavour's ("domu-linux-rt-...")
                old.unlink()
        write_atomically(target, base)
    return vmlinuz, target
