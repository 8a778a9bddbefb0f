"""What a started stressor has wherever it runs (here or on an SSH target): its clock, and the summary
rtvirt-stress prints last."""

from __future__ import annotations

import json
import time

from pydantic import ValidationError

from ..agents import agent_failure
from ..errors import RunError
from .base import StressParams, StressSummary

__all__ = ["StressorClock", "native_summary"]


def native_summary(status: int | None, stdout: bytes, stderr_tail: str, argv: list[str]) -> StressSummary:
    """The summary rtvirt-stress printed last on stdout (wherever it ran); its failure if it failed."""
    if status in (1, 2):  # bad options, or a worker failed (disk full...): the agent said why on stderr
        raise agent_failure(status, stderr_tail)
    lines = [line for line in stdout.decode(errors="replace").splitlines()
             if line.startswith("{") and not line.startswith('{"event"')]
    if not lines:
        raise agent_failure(status or 1, stderr_tail or f"rtvirt-stress ended ({status}) without a summary")
    try:
        return StressSummary.model_validate(json.loads(lines[-1]) | {"engine": "native", "command": argv})
    except (ValueError, ValidationError) as exc:
        raise RunError(f"rtvirt-stress printed an unreadable summary: {exc}") from None


class StressorClock:
    """Elapsed and planned time of a started stressor (here or on a target)."""

    started: float
    params: StressParams

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def duration_s(self) -> float | None:
        return self.params.duration / 1e9 if self.params.duration else None
