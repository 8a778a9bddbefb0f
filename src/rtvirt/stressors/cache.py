"""cache: memset over 1.5 x a cache's size, forever (agents/stressors/cache.c)."""

from __future__ import annotations

from pydantic import ByteSize, Field

from ..errors import InputError
from ..params import cli
from .base import StressorSpec, StressParams


class CacheParams(StressParams):
    level: int = Field(0, ge=0, le=4, description="cache level to overflow; 0 = the last level (2 = the study's L2)")
    buffer: ByteSize = Field(0, ge=0, le=1 << 40,  # type: ignore[assignment]
                             description="buffer per worker (e.g. 48MiB); 0 = 1.5 x the cache size from sysfs",
                             json_schema_extra=cli(metavar="BYTES"))


def _stress_ng(params: CacheParams, workers: int) -> list[str]:
    if params.buffer:
        raise InputError("option --buffer: stress-ng sizes its cache buffer itself; use --engine native")
    return ["--cache", str(workers), *(["--cache-level", str(params.level)] if params.level else [])]


STRESSOR = StressorSpec(
    name="cache",
    summary="memset a buffer of 1.5 x the last-level (or --level) cache size, forever",
    params=CacheParams,
    represents="the guest-isolation study's cache-polluting guest (memset of 1.5 x L2 forever: --level 2); "
               "on the shared last level it also evicts other cores' data",
    stress_ng=_stress_ng,
)
