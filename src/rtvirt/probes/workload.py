"""workload: application-level execution time, MiBench automotive style (agents/probes/workload.c)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..params import CommonParams
from .base import ProbeSpec


class WorkloadParams(CommonParams):
    kernel: Literal["qsort", "basicmath", "bitcount"] = Field("qsort", description="what every iteration runs")
    size: int = Field(1_200_000, ge=1024, le=1 << 32, description="qsort data set in bytes (larger than the L2)")


PROBE = ProbeSpec(
    name="workload",
    summary="application-level execution time per iteration (qsort, basicmath, bitcount)",
    params=WorkloadParams,
    value_field="duration_ns",
    doc="Each thread runs --kernel over the same input again and again (-l iterations or -D time) and "
        "keeps every iteration's duration_ns and cycles.",
)
