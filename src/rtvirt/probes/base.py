"""The probe descriptor: what one probe module exports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..agents import agent_args
from ..params import CommonParams

__all__ = ["ProbeSpec", "periodic_samples"]


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: its parameters, what its samples mean, and how its summary groups them.

    ``argv`` builds the command that produces the sample stream (by default the C agent);
    ``group_by`` names the record columns the summary is split by (e.g. ``kind`` for kops).
    """

    name: str
    summary: str
    params: type[CommonParams]
    value_field: str
    group_by: tuple[str, ...] = ("thread",)
    doc: str = ""
    argv: Callable[[Any], list[str]] | None = None
    # samples a run of these parameters promises (None: the probe's count depends on what it sees, e.g. gaps)
    expected_samples: Callable[[Any], int | None] | None = None

    def command(self, params: CommonParams, agent: str) -> list[str]:
        if self.argv is not None:
            return self.argv(params)
        return [agent, self.name, *agent_args(params)]


def periodic_samples(params: Any) -> int | None:
    """Samples a periodic probe promises: per thread, one a period (``interval``, plus ``distance`` per further
    thread) for its duration, at most ``loops``; None when neither bounds the run."""
    total = 0
    for thread in range(params.threads):
        period = params.interval + thread * getattr(params, "distance", 0)
        counts = [n for n in (params.duration // period if params.duration else 0, params.loops) if n]
        if not counts:
            return None
        total += min(counts)
    return total
