"""The probe descriptor: what one probe module exports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..agents import agent_args
from ..params import CommonParams

__all__ = ["ProbeSpec"]


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

    def command(self, params: CommonParams, agent: str) -> list[str]:
        if self.argv is not None:
            return self.argv(params)
        return [agent, self.name, *agent_args(params)]
