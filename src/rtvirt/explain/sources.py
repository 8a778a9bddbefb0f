"""The one table of trace sources, by layer, and the session of one run in one environment.

An environment says what it can trace beside a run (``Environment.trace_sources``: host and partition the
host's scheduler, IRQs and timers on the measured CPUs; VM kinds their vCPU threads; Xen its scheduler
trace; a Linux guest its own tracefs); the scenario's ``[explain] layers`` pick among them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import ExplainConfig
from .model import Layer, LayerTrace, TraceSource
from .session import ExplainSession

if TYPE_CHECKING:
    from ..environments.base import Environment

__all__ = ["SOURCES", "session_for", "host_sources"]

# layer -> what its source traces (docs/explain.md has each one's method and limits)
SOURCES: dict[Layer, str] = {
    "host": "host tracefs on the measured CPUs: tasks, IRQs, softirqs, IRQ vectors, timers (explain.host)",
    "vm": "the vCPU threads on their pCPUs, KVM exits by reason (explain.vm)",
    "xen": "xentrace's scheduler class in dom0: runstates, RTDS budgets, ARINC 653 windows (explain.xen)",
    "guest": "the guest's own tracer: timerlat's IRQ/thread split, the guest's tasks and IRQs (explain.guest)",
}


def host_sources(cpus: tuple[int, ...], config: ExplainConfig) -> list[TraceSource]:
    """The host layer on ``cpus`` when the scenario asks for it (what host and partition offer)."""
    if "host" not in config.layers:
        return []
    from .host import HostSource

    return [HostSource(cpus, buffer_mb=config.buffer_mb, flight_recorder=config.flight_recorder)]


def session_for(env: Environment, config: ExplainConfig) -> ExplainSession:
    """The tracing beside one run in ``env``; an environment without a source says so in the explanation."""
    try:
        sources = [source for source in env.trace_sources(config) if source.layer in config.layers]
    except Exception as exc:  # noqa: BLE001 - a tracer never fails the measurement
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return ExplainSession(config, [], [LayerTrace("host", seen=False, why_not=f"no trace source: {why}")])
    unseen = [] if sources else [LayerTrace("host", seen=False,
                                            why_not=f"the {env.kind} environment offers no trace source")]
    return ExplainSession(config, sources, unseen)
