"""mem: malloc, touch every page, free; repeat (agents/stressors/mem.c)."""

from __future__ import annotations

from pydantic import ByteSize, Field

from ..params import cli
from .base import StressorSpec, StressParams

BLOCK_DEFAULT = 64 << 20


class MemParams(StressParams):
    block: ByteSize = Field(BLOCK_DEFAULT, ge=4096, le=1 << 40,  # type: ignore[assignment]
                            description="bytes per malloc/touch/free cycle (64MiB; M = 10^6, MiB = 2^20)",
                            json_schema_extra=cli(metavar="BYTES"))


def _stress_ng(params: MemParams, workers: int) -> list[str]:
    return ["--vm", str(workers), "--vm-bytes", str(int(params.block))]


STRESSOR = StressorSpec(
    name="mem",
    summary="malloc a block (default 64 MiB), touch every page, free it; repeat",
    params=MemParams,
    represents="the malloc/free workers of the COTS study's reference load (64 MB blocks): page faults, "
               "page zeroing and memory bandwidth",
    stress_ng=_stress_ng,
)
