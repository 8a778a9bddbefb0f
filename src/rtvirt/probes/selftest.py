"""selftest: the recorder's own throughput with synthetic samples (agents/probes/selftest.c)."""

from __future__ import annotations

from pydantic import Field

from ..params import CommonParams
from .base import ProbeSpec


class SelftestParams(CommonParams):
    rate: int = Field(100_000, ge=0, le=1_000_000_000, description="samples per second per thread, 0 = as fast as "
                      "possible (drops then show what the writer cannot keep up with)")


PROBE = ProbeSpec(
    name="selftest",
    summary="recorder throughput: synthetic samples at a fixed rate per thread",
    params=SelftestParams,
    value_field="duration_ns",
    doc="duration_ns is the time since the thread's previous sample; use the dropped count to judge the rate.",
)
