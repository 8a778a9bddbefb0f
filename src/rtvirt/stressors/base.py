"""The stressor descriptor, the options every stressor takes, and the summary a run ends with."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..agents import agent_args
from ..errors import InputError
from ..params import CpuList, Params, cli
from ..units import duration_field

__all__ = ["StressParams", "StressorSpec", "StressSummary", "PartSummary", "WorkerSummary"]


class StressParams(Params):
    """Options every stressor takes: how many workers, where, how long, at which priority."""

    duration: duration_field("s") = Field(  # type: ignore[valid-type]
        10_000_000_000, description="run time (bare numbers in s); 0 runs until stopped (Ctrl-C)",
        json_schema_extra=cli("-D", metavar="TIME"))
    workers: int = Field(0, ge=0, le=1024, description="worker threads; 0 = one per CPU of --cpus (or per online CPU)",
                         json_schema_extra=cli("-w"))
    cpus: CpuList | None = Field(None, description="CPUs for the workers (worker i on the i-th, cycling)",
                                 json_schema_extra=cli("-a", metavar="CPUS"))
    priority: int = Field(0, ge=0, le=99, description="SCHED_FIFO priority of the workers, 0 = SCHED_OTHER",
                          json_schema_extra=cli("-p"))

    def check_host(self) -> None:
        """Fail early, naming the option, for CPUs this process may not use."""
        allowed = os.sched_getaffinity(0)
        for cpu in self.cpus or ():
            if cpu not in allowed:
                raise InputError(f"option -a/--cpus: CPU {cpu} does not exist or is not allowed here "
                                 f"(usable: {','.join(map(str, sorted(allowed)))})")

    def worker_count(self) -> int:
        """Workers actually started, resolving 0 the way the agent does."""
        return self.workers or (len(self.cpus) if self.cpus else os.cpu_count() or 1)

    def agent_args(self) -> list[str]:
        return agent_args(self)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StressorSpec:
    """One stressor: its parameters and, where stress-ng can stand in, how its options map there.

    ``stress_ng`` returns the stress-ng arguments for the stressor-specific part (the runner adds
    timeout, placement and priority); it raises InputError, naming the option, for settings that
    stress-ng cannot reproduce.
    """

    name: str
    summary: str
    params: type[StressParams]
    represents: str
    stress_ng: Callable[[Any, int], list[str]] | None = None

    def command(self, params: StressParams, agent: str) -> list[str]:
        return [agent, self.name, *params.agent_args()]


class PartSummary(BaseModel):
    """One kind of worker in a run (``mix`` has two: cpu and mem)."""

    name: str
    workers: int
    bogo_ops: int
    elapsed_ns: int
    bogo_ops_per_s: float
    cpu_time_ns: int | None = None
    missed: int | None = None
    bytes: int | None = None


class WorkerSummary(BaseModel):
    index: int
    part: str
    cpu: int
    bogo_ops: int
    cpu_time_ns: int
    missed: int


class StressSummary(BaseModel):
    """What a stressor run did: the agent's JSON line, or stress-ng's YAML metrics, in one shape.

    Stressor-specific members (the cache sizes, the duty-cycle mode...) are kept as extra fields.
    """

    model_config = ConfigDict(extra="allow")

    stressor: str
    engine: Literal["native", "stress-ng"] = "native"
    end: Literal["complete", "signal", "error"]
    elapsed_ns: int
    workers: int
    priority: int
    bogo_ops: int
    cpus: list[int] = Field(default_factory=list)
    parts: list[PartSummary]
    per_worker: list[WorkerSummary] = Field(default_factory=list)
    command: list[str] = Field(default_factory=list, description="the argv that ran (agent or stress-ng)")
