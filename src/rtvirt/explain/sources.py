"""The one table of trace sources, by layer, and the session of one run in one environment.

An environment says what it can trace beside a run (``Environment.trace_sources``: host and partition the
host's scheduler, IRQs and timers on the measured CPUs; VM kinds their vCPU threads; Xen its scheduler
trace; a Linux guest its own tracefs); the scenario's ``[explain] layers`` pick among them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .config import ExplainConfig
from .model import Layer, LayerTrace, TraceSource
from .recorder import keep_rule
from .session import ExplainSession
from .tracefs import TracefsAccess

if TYPE_CHECKING:
    from ..environments.base import Environment
    from .kvm import KvmSource
    from .vm import VmSource
    from .xen import XenDom0, XenDomains, XenTraceSource

__all__ = ["SOURCES", "session_for", "session_for_sources", "host_sources", "kvm_source", "vm_source", "xen_source"]

# layer -> what its source traces (docs/explain.md has each one's method and limits)
SOURCES: dict[Layer, str] = {
    "host": "host tracefs on the measured CPUs: tasks, IRQs, softirqs, IRQ vectors, timers (explain.host)",
    "vm": "the vCPU threads on their pCPUs, KVM exits by reason (explain.vm)",
    "kvm": "KVM on the vCPUs' pCPUs: exits by reason, halts and their timer, interrupt injection (explain.kvm)",
    "xen": "xentrace's scheduler class in dom0: runstates, RTDS budgets, ARINC 653 windows (explain.xen)",
    "guest": "the guest's own tracer: timerlat's IRQ/thread split, the guest's tasks and IRQs (explain.guest)",
}


def host_sources(cpus: tuple[int, ...], config: ExplainConfig, access: TracefsAccess | None = None
                 ) -> list[TraceSource]:
    """The host layer on ``cpus`` when the scenario asks for it (what host and partition offer; an SSH target
    the same on its own CPUs, through ``access``)."""
    if "host" not in config.layers:
        return []
    from .host import HostSource

    return [HostSource(cpus, buffer_mb=config.buffer_mb, flight_recorder=config.flight_recorder, access=access,
                       keep=keep_rule(config))]


def vm_source(vm: str, host_cpus: tuple[int, ...] | None, accel: str, config: ExplainConfig,
              no_clock: str | None = None, access: TracefsAccess | None = None,
              exits: bool | None = None) -> VmSource:
    """The VM layer of a QEMU guest or libvirt domain on this host, or on a KVM host through ``access``
    (explain.vm), bounded as the scenario says."""
    from .vm import VmSource

    return VmSource(vm, host_cpus, accel, config.buffer_mb, no_clock,
                    keep=keep_rule(config), access=access, exits=exits)


def kvm_source(vm: str, host_cpus: tuple[int, ...], config: ExplainConfig, no_clock: str | None = None,
               access: TracefsAccess | None = None) -> KvmSource:
    """The KVM layer of a QEMU guest under KVM, on this host or on a KVM host through ``access`` (explain.kvm)."""
    from .kvm import KvmSource

    return KvmSource(vm, host_cpus, "kvm", config.buffer_mb, no_clock, keep=keep_rule(config), access=access)


def xen_source(open_dom0: Callable[[], XenDom0], domains: Callable[[], XenDomains], workdir: Path,
               config: ExplainConfig) -> XenTraceSource:
    """The Xen layer of a domU (explain.xen): xentrace in its dom0, bounded as the scenario says."""
    from .xen import XenTraceSource

    return XenTraceSource(open_dom0, domains, workdir, buffer_mb=config.buffer_mb,
                          keep=keep_rule(config))


def session_for(env: Environment, config: ExplainConfig) -> ExplainSession:
    """The tracing beside one run in ``env``; an environment without a source says so in the explanation."""
    try:
        sources = env.trace_sources(config)
    except Exception as exc:  # noqa: BLE001 - a tracer never fails the measurement
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return ExplainSession(config, [], [LayerTrace("host", seen=False, why_not=f"no trace source: {why}")])
    return session_for_sources(config, sources, f"the {env.kind} environment")


def session_for_sources(config: ExplainConfig, sources: list[TraceSource], where: str) -> ExplainSession:
    """The tracing of the ``sources`` the scenario's layers pick; none left: the explanation says ``where``
    offers nothing to trace."""
    sources = [source for source in sources if source.layer in config.layers]
    unseen = [] if sources else [LayerTrace("host", seen=False, why_not=f"{where} offers no trace source")]
    # the measured machine's /proc for the outer-hypervisor note: a target's through its source's connection
    reads = [read for source in sources if (read := getattr(source, "read_system", None)) is not None]
    return ExplainSession(config, sources, unseen, *reads[:1])
