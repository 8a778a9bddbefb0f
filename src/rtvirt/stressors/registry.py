"""The stressor registry: one module per stressor, one line per stressor here."""

from __future__ import annotations

from ..errors import InputError
from . import cache, cpu, io, irq, mem, mix
from .base import StressorSpec

__all__ = ["STRESSORS", "get_stressor", "stressor_spec"]

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


def stressor_spec(stressor: str | StressorSpec) -> StressorSpec:
    """A stressor given by name or by spec, as its spec."""
    return stressor if isinstance(stressor, StressorSpec) else get_stressor(stressor)
