"""threadmetric: preemptive scheduling throughput, the Thread-Metric method (agents/probes/threadmetric.c)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..params import CommonParams, cli
from ..units import duration_field
from .base import ProbeSpec


class ThreadmetricParams(CommonParams):
    threads: Literal[1] = Field(1, description="threadmetric runs its own chain of five threads",
                                json_schema_extra=cli("-t"))
    report_interval: duration_field("s") = Field(  # type: ignore[valid-type]
        5_000_000_000, ge=1_000_000, le=3_600_000_000_000, description="reporting interval (bare numbers in s)",
        json_schema_extra=cli(metavar="TIME"))

    @model_validator(mode="after")
    def _needs_fifo(self) -> ThreadmetricParams:
        if self.priority < 6:
            raise ValueError("priority: threadmetric needs SCHED_FIFO with -p/--priority of at least 6 (its five "
                             "threads take the priorities below it), so --no-rt is not possible")
        return self


PROBE = ProbeSpec(
    name="threadmetric",
    summary="preemptive scheduling throughput: rounds of a 5-thread resume chain per reporting interval",
    params=ThreadmetricParams,
    value_field="rounds",
    doc="Fails (exit 1, stream end reason 'error') when the five per-thread counters diverge, i.e. when a "
        "resume did not preempt. -l caps the number of intervals.",
)
