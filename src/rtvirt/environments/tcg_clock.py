"""A TCG guest's clock: its TSC rate given on its command line, and the check that its clock kept time.

Under TCG an x86 guest's TSC is the host's cycle counter (QEMU reads the host's and adds an offset), but no CPUID
leaf tells the guest its rate, so its kernel calibrates it against the emulated PIT or HPET at boot, on a vCPU the
loaded host may preempt at any moment. Most boots get within 0.1 %; one libvirt domain of a test suite run got
80.2 MHz for a 2445 MHz counter, and with the clocksource watchdog off (``tsc=reliable``, which keeps a TCG guest
on its TSC) its clock ran 30.5 times the host's for the whole run: a 10 ms preemption read as 303 ms. rtvirt
measures the counter's rate on the host (``rtvirt-probe --cycles-hz``) and gives it to the guest's kernel
(``tsc_early_khz``), which then skips the calibration; the kernel's own refinement against the HPET a second
later still corrects it within 1 %.

Whatever the cause, a Linux guest whose clock runs fast says so at boot: its uptime when /init reports ready
cannot exceed the time since the host started it. ``clock_failure`` fails such a run by name instead of storing
samples measured in a clock that was not real time.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache

from ..agents import agent_path, native_arch
from ..errors import RunError
from .guest_image import READY_MARK

__all__ = ["clock_failure", "tsc_kernel_args"]

# after the ready mark: a Linux guest's /proc/uptime ("12.34 0.56"). Not our bare-metal guest's "us after reset":
# that counts from the vCPU's reset, and under KVM its TSC runs while QEMU waits paused (seconds in the KVM lab).
_UPTIME = r" (\d{1,9}\.\d\d) \d"
# The guest's uptime may exceed the host's time since launch by its console's latency and rounding; a clock
# that runs fast by more than a tenth, past one second, is not real time.
SLACK_RATIO, SLACK_S = 1.10, 1.0


@cache
def host_cycles_khz() -> int:
    """The host's cycle counter's rate in kHz (the agent's measurement: 50 ms against CLOCK_MONOTONIC_RAW)."""
    try:
        done = subprocess.run([str(agent_path("rtvirt-probe")), "--cycles-hz"], capture_output=True, text=True,
                              timeout=10, check=True)
        return round(float(done.stdout.strip()) / 1000)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise RunError(f"could not measure this host's cycle counter rate for a TCG guest: {exc}"[:300]) from None


def tsc_kernel_args(arch: str, accel: str, here: bool) -> list[str]:
    """The x86 guest kernel's ``tsc_early_khz`` where its TSC is this host's counter under TCG (KVM tells a guest
    its TSC rate itself; an Arm guest reads its timer's rate from CNTFRQ; a remote host's counter is not ours)."""
    if arch != "x86_64" or accel != "tcg" or not here or native_arch() != "x86_64":
        return []
    return [f"tsc_early_khz={host_cycles_khz()}"]


def clock_failure(console: str, since_launch_s: float, mark: str = READY_MARK) -> str | None:
    """Why the guest's clock cannot be trusted, from its ready line (``mark`` and its uptime) and the host's
    seconds since it launched the guest; None when the uptime fits (or the line is not there yet)."""
    match = re.search(re.escape(mark) + _UPTIME, console)
    if match is None:
        return None
    uptime = float(match.group(1))
    if uptime <= since_launch_s * SLACK_RATIO + SLACK_S:
        return None
    return (f"the guest's clock ran fast: {uptime:.1f} s of uptime when it was ready, {since_launch_s:.1f} s "
            f"after the host started it (at least {uptime / max(since_launch_s, 0.1):.1f} times real time); its kernel "
            "mis-measured its clock's rate, and its samples would not be in real time")
