"""irq: a steady stream of timer interrupts (agents/stressors/irq.c)."""

from __future__ import annotations

from pydantic import Field

from .base import StressorSpec, StressParams


class IrqParams(StressParams):
    rate: int = Field(10_000, ge=1, le=1_000_000, description="timer wake-ups per second per worker (Hz)")


def _stress_ng(params: IrqParams, workers: int) -> list[str]:
    return ["--timer", str(workers), "--timer-freq", str(params.rate)]


STRESSOR = StressorSpec(
    name="irq",
    summary="timer interrupts at --rate per worker (absolute clock_nanosleep)",
    params=IrqParams,
    represents="the interrupt-heavy neighbour the studies list as wanted next, and the RT-Xen study's "
               "extra interrupt source: hrtimer interrupts and wake-ups on the chosen CPUs",
    stress_ng=_stress_ng,
)
