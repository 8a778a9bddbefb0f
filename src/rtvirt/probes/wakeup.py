"""wakeup: cross-CPU wake-up latency, the stand-in for interrupt latency (agents/probes/wakeup.c)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from ..errors import InputError
from ..params import CommonParams, cli
from ..units import duration_field
from .base import ProbeSpec, periodic_samples


class WakeupParams(CommonParams):
    duration: duration_field("s") = Field(  # type: ignore[valid-type]
        0, description="run time (bare numbers in s); 0 runs until --loops events or Ctrl-C",
        json_schema_extra=cli("-D", metavar="TIME"))
    loops: int = Field(105_000, ge=0, description="events to send, 0 = no limit", json_schema_extra=cli("-l"))
    threads: Literal[1] = Field(1, description="one sender and one receiver", json_schema_extra=cli("-t"))
    interval: duration_field("us") = Field(  # type: ignore[valid-type]
        1_000_000, ge=10_000, le=10_000_000_000, description="period between events (bare numbers in us)",
        json_schema_extra=cli("-i", metavar="TIME"))
    sender_cpu: int | None = Field(None, ge=0, le=1023, description="CPU of the sender (default: another allowed "
                                   "CPU than the receiver's)", json_schema_extra=cli(metavar="CPU"))

    def check_host(self, usable: Iterable[int] | None = None) -> None:
        super().check_host(usable)
        allowed = set(usable) if usable is not None else os.sched_getaffinity(0)
        if self.affinity and len(self.affinity) > 1:
            raise InputError("option -a/--affinity: wakeup takes one receiver CPU (the sender goes on --sender-cpu)")
        if self.sender_cpu is not None and self.sender_cpu not in allowed:
            raise InputError(f"option --sender-cpu: CPU {self.sender_cpu} does not exist or is not allowed here "
                             f"(usable: {','.join(map(str, sorted(allowed)))})")
        receiver = self.affinity[0] if self.affinity else max(allowed)
        if self.sender_cpu == receiver or len(allowed) < 2:
            raise InputError("options -a/--affinity and --sender-cpu: wakeup needs two different CPUs")


PROBE = ProbeSpec(
    name="wakeup",
    summary="cross-CPU wake-up latency (a sender timestamps and wakes a receiver on the measured CPU)",
    params=WakeupParams,
    value_field="latency_ns",
    expected_samples=periodic_samples,
    doc="The receiver runs on the -a CPU (default: the last allowed CPU), the sender on --sender-cpu (default: "
        "the first other allowed CPU); one event per -i period, -l events (default 105,000).",
)
