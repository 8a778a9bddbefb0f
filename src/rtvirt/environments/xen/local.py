"""A local dom0: rtvirt runs in a Xen host's dom0, driven through this machine's transport (remote.local)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path


def is_dom0() -> bool:
    try:
        return "control_d" in Path("/proc/xen/capabilities").read_text()
    except OSError:
        return False

def _console_log_problem() -> str | None:
    """Why this dom0 cannot tell how a domU's job ended (None: it can). rtvirt reads the RTVIRT- marks from
    xenconsoled's guest logs; Debian's xencommons starts xenconsoled without them (XENCONSOLED_TRACE=none)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "xenconsoled":
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                pairs = [*args, *(f"{a}={b}" for a, b in zip(args, args[1:], strict=False) if a in ("--log", "-l"))]
                if any(arg in ("--log=guest", "--log=all", "-l=guest", "-l=all") for arg in pairs):
                    return None
                return (f"xen: this dom0's xenconsoled (pid {entry.name}) keeps no guest console logs, where rtvirt "
                        "reads how a domU's job ended: run it with --log=guest (Debian: XENCONSOLED_TRACE=guest in "
                        "/etc/default/xencommons, then restart xencommons)")
    return "xen: no xenconsoled runs in this dom0 (rtvirt reads the domUs' consoles from its guest logs)"

def _bring_cpus_online(count: int) -> None:
    """Bring this dom0's CPUs 1..count-1 online: ``xl vcpu-set`` gives them back to Linux, which only
    registers them; udev rules online them on a full Debian dom0, nothing does in a minimal one."""
    for cpu in range(1, count):
        control = Path(f"/sys/devices/system/cpu/cpu{cpu}/online")
        deadline = time.monotonic() + 10
        while not control.exists() and time.monotonic() < deadline:  # registered from a xenstore watch
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            if control.read_text().strip() == "0":
                control.write_text("1")
