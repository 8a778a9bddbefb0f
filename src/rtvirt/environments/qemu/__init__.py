"""qemu: the workload in a QEMU guest (KVM, or TCG where KVM does not really accelerate), on this machine or on a
KVM host reached over SSH (the KVM lab is one).

One module per concern, in a line that only points down: ``config`` (the scenario's fields) and ``accel`` (KVM or
TCG, and why) at the bottom; ``realtime`` (KVM's real-time settings as QEMU arguments); ``deadline`` (the exclusive
cpuset of pinned SCHED_DEADLINE vCPUs); ``where`` (the machine QEMU runs on: files, outputs, sockets, QEMU's life,
thread placement, here or over a transport); ``environment`` (the lifecycle: boot paused, place, run, tear down).
"""

from __future__ import annotations

from .accel import QEMU, TCG_WARNING, choose_accel
from .config import QemuConfig
from .environment import ACK_PORT, OUTPUT_PORT, QemuEnvironment, default_emulator_cpus, qemu_stressor_guest

__all__ = ["ACK_PORT", "OUTPUT_PORT", "QEMU", "TCG_WARNING", "QemuConfig", "QemuEnvironment", "choose_accel",
           "default_emulator_cpus", "qemu_stressor_guest"]
