"""The probe descriptor: what one probe module exports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..params import CommonParams

__all__ = ["ProbeSpec", "agent_args"]


def agent_args(params: CommonParams) -> list[str]:
    """Render validated parameters as the agent's ``--name=value`` options (never through a shell)."""
    args = []
    for name, value in params.model_dump(exclude={"rt"}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            rendered = "1" if value else "0"
        elif isinstance(value, (tuple, list)):
            rendered = ",".join(str(v) for v in value)
        else:
            rendered = str(value)
        args.append(f"--{name.replace('_', '-')}={rendered}")
    return args


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
