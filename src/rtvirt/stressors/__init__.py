"""The stressor registry: one module per stressor, one line per stressor here."""

from __future__ import annotations

from ..errors import InputError
from . import cache, cpu, io, irq, mem, mix
from .base import StressorSpec, StressParams, StressSummary
from .runner import ENGINES, RunningStressor, StressProgress, run_stressor, start_stressor

__all__ = ["STRESSORS", "ENGINES", "StressorSpec", "StressParams", "StressSummary", "StressProgress",
           "RunningStressor", "get_stressor", "start_stressor", "run_stressor"]

STRESSORS: dict[str, StressorSpec] = {spec.name: spec for spec in (
    cpu.STRESSOR,
    cache.STRESSOR,
    mem.STRESSOR,
    io.STRESSOR,
    irq.STRESSOR,
    mix.STRESSOR,
)}


def get_stressor(name: str) -> StressorSpec:
    try:
        return STRESSORS[name]
    except KeyError:
        raise InputError(f"unknown stressor {name!r} (known: {', '.join(STRESSORS)})") from None
