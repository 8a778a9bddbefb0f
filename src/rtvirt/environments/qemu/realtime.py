"""KVM's real-time settings as real-time KVM guides prescribe them, turned into QEMU's arguments, and what the
guest really got (read back over QMP once QEMU has made its vCPUs).

The host side (vCPU threads at SCHED_FIFO on isolated pCPUs, emulator and I/O threads elsewhere) is placement
(environment.py); here: ``-overcommit mem-lock`` (no page of the guest ever faults in from swap), ``cpu-pm``
(HLT, MWAIT and PAUSE stay in the guest: no VM exit when it idles, for vCPUs that own their pCPU), I/O threads
(``-object iothread``, serving the stream copy's disk off the vCPUs), and the guest side: its idle loop
(``idle=poll``, or the cpuidle-haltpoll driver, which polls a while before it halts) and a TSC-deadline timer
(``-cpu host`` passes KVM's on; TCG's CPU has none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import QemuConfig

__all__ = ["RealtimeOptions", "cpu_readback", "realtime_options"]

IOTHREAD_PREFIX = "rtvirtio"


@dataclass
class RealtimeOptions:
    """QEMU's arguments for the settings, the guest kernel's command line additions, and the record."""

    cpu: str
    argv: list[str] = field(default_factory=list)
    kernel_args: list[str] = field(default_factory=list)
    iothreads: list[str] = field(default_factory=list)  # ids of the I/O threads
    record: dict[str, Any] = field(default_factory=dict)


def realtime_options(config: QemuConfig, accel: dict[str, Any]) -> RealtimeOptions:
    """The settings of ``config`` under ``accel`` (choose_accel's: its CPU model where the host's is refused);
    ``record`` says what each became (not applied: why)."""
    kvm = accel["accel"] == "kvm"
    options = RealtimeOptions(cpu=accel.get("cpu", "host") if kvm else "max")
    if "cpu_reason" in accel:
        options.record["cpu_model_reason"] = accel["cpu_reason"]
    if config.mem_lock or config.cpu_pm:
        options.argv += ["-overcommit", f"mem-lock={'on' if config.mem_lock else 'off'},"
                                        f"cpu-pm={'on' if config.cpu_pm else 'off'}"]
    options.record["mem_lock"] = config.mem_lock
    options.record["cpu_pm"] = config.cpu_pm if kvm else ("no effect under TCG" if config.cpu_pm else False)
    options.iothreads = [f"{IOTHREAD_PREFIX}{i}" for i in range(config.iothreads)]
    for iothread in options.iothreads:
        options.argv += ["-object", f"iothread,id={iothread}"]
    if config.guest_idle == "poll":
        options.kernel_args.append("idle=poll")
    elif config.guest_idle == "haltpoll":
        # built into Debian's kernel; it registers only where KVM's paravirtual interface is (not under TCG)
        options.kernel_args.append("cpuidle_haltpoll.force=1")
    options.record["guest_idle"] = config.guest_idle if kvm or config.guest_idle != "haltpoll" else \
        "haltpoll asked, but cpuidle-haltpoll needs KVM's paravirtual interface (not under TCG)"
    return options


def cpu_readback(monitor: Any, qom_path: str) -> dict[str, Any]:
    """What the guest's CPU model has, asked of QEMU (QMP qom-get): the TSC-deadline timer, the hint that its
    vCPUs are dedicated (which lets a guest's haltpoll driver register), KVM's paravirtual clock."""
    found: dict[str, Any] = {}
    for name in ("tsc-deadline", "kvm-hint-dedicated", "kvmclock"):
        try:
            found[name.replace("-", "_")] = bool(monitor.cmd("qom-get", path=qom_path, property=name))
        except Exception:  # noqa: BLE001 - a property this QEMU's CPU model lacks: not known
            found[name.replace("-", "_")] = None
    return found
