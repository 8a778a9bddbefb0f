"""gap: interruption detector, or busy-work unit durations with --work (agents/probes/gap.c)."""

from __future__ import annotations

from pydantic import Field

from ..params import CommonParams, cli
from ..units import duration_field
from .base import ProbeSpec


class GapParams(CommonParams):
    threshold: duration_field("ns") = Field(  # type: ignore[valid-type]
        1_000, ge=1, le=1_000_000_000, description="smallest step between two clock reads kept as a gap "
        "(bare numbers in ns)", json_schema_extra=cli(metavar="TIME"))
    work: bool = Field(False, description="time a fixed busy-work unit again and again instead of spinning",
                       json_schema_extra=cli(flag=True))
    work_unit: int = Field(20_000, ge=1, le=1_000_000_000, description="busy-work unit size in loop iterations "
                           "(--work)")


PROBE = ProbeSpec(
    name="gap",
    summary="interruption detector: every gap in a cycle-counter spin loop (or busy-work unit durations)",
    params=GapParams,
    value_field="duration_ns",
    doc="Each thread spins at its priority reading the cycle counter; a step above --threshold is a gap "
        "(t_ns = start, duration_ns = length). --loops caps gaps (or work units) per thread. The stream's "
        "end-of-run stats give the loop's noise floor and the share of CPU time the thread got.",
)
