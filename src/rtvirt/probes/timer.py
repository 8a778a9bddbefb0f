"""timer: periodic wake-up latency by the cyclictest method (agents/probes/timer.c)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..params import CommonParams, cli
from ..units import duration_field
from .base import ProbeSpec, periodic_samples


class TimerParams(CommonParams):
    interval: duration_field("us") = Field(  # type: ignore[valid-type]
        1_000_000, ge=10_000, le=10_000_000_000, description="wake-up period of thread 0 (bare numbers in us)",
        json_schema_extra=cli("-i", metavar="TIME"))
    distance: duration_field("us") = Field(  # type: ignore[valid-type]
        500_000, le=10_000_000_000, description="period added per further thread (bare numbers in us)",
        json_schema_extra=cli("-d", metavar="TIME"))
    engine: Literal["cyclictest", "timerlat"] = Field(
        "cyclictest", description="cyclictest: our own threads; timerlat: the kernel's timerlat tracer, which splits "
        "each latency into IRQ and thread parts (irq_latency_ns); needs CONFIG_TIMERLAT_TRACER and root")


def timer_samples(params: TimerParams) -> int | None:
    """Samples a run promises: the cyclictest engine's threads as every periodic probe's; the timerlat engine's
    one kernel thread per CPU of ``affinity``, each at ``interval`` (None without a CPU list: the machine's
    CPUs decide)."""
    if params.engine != "timerlat":
        return periodic_samples(params)
    if not params.affinity:
        return None
    per_cpu = periodic_samples(params.model_copy(update={"threads": 1}))
    return None if per_cpu is None else per_cpu * len(params.affinity)


PROBE = ProbeSpec(
    name="timer",
    summary="periodic wake-up latency (cyclictest method)",
    params=TimerParams,
    value_field="latency_ns",
    expected_samples=timer_samples,
)
