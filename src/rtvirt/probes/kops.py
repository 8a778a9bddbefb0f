"""kops: kernel-operation latency, the Zephyr latency_measure method (agents/probes/kops.c)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..params import CommonParams, cli
from .base import ProbeSpec


class KopsParams(CommonParams):
    threads: Literal[1] = Field(1, description="kops measures with one thread (plus its partners)",
                                json_schema_extra=cli("-t"))
    iterations: int = Field(1000, ge=1, le=100_000_000, description="iterations per operation")
    alloc_size: int = Field(256, ge=1, le=1 << 30, description="bytes per malloc in malloc_free")

    @model_validator(mode="after")
    def _partner_above(self) -> KopsParams:
        if self.priority == 1:
            raise ValueError("priority: kops needs -p/--priority of at least 2 (the partner thread runs one above "
                             "the measuring thread), or 0 / --no-rt")
        return self


PROBE = ProbeSpec(
    name="kops",
    summary="kernel-operation latency (context switch, semaphore, mutex, thread, message queue, event, malloc)",
    params=KopsParams,
    value_field="duration_ns",
    group_by=("kind",),
    doc="All operations run on one CPU (first -a CPU, else the current one), --iterations times each; every "
        "iteration is kept (duration_ns, cycles) with the operation as its kind.",
)
