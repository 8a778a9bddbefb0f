"""Verdicts: which requirement classes a run (a platform configuration) can serve.

A measured processing latency is only part of the end-to-end latency, so a class is met only when the
run's worst case stays within ``(1 - margin)`` of the class's latency budget and its jitter (max − min)
within ``(1 - margin)`` of the allowed jitter. ``margin`` defaults to 0.5: the platform may use at most
half of each budget. Classes are data: rtvirt/results/classes.toml, or any TOML file of the same shape.
The budgets are latencies: only values that are latencies (rtvirt.quantity: ``judged``) are judged; a duration
of work or a throughput gets no verdict.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InputError, first_validation_error
from ..quantity import LATENCY, Quantity
from ..stats import Summary

__all__ = ["RequirementClass", "Verdict", "load_classes", "judge", "DEFAULT_MARGIN"]

DEFAULT_MARGIN = 0.5


class RequirementClass(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    latency_ns: tuple[int, int]
    jitter_ns: tuple[int, int]

    @field_validator("latency_ns", "jitter_ns", mode="before")
    @classmethod
    def _as_range(cls, value: object) -> object:
        return (value, value) if isinstance(value, int) else value


class _ClassFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    class_: list[RequirementClass] = Field(alias="class")


@dataclass(frozen=True)
class Verdict:
    requirement: str
    outcome: Literal["meets", "partly", "fails"]
    worst_ns: float
    jitter_ns: float
    latency_budget_ns: int
    jitter_budget_ns: int
    reason: str


def load_classes(path: Path | None = None) -> list[RequirementClass]:
    try:
        if path is None:
            text = resources.files(__package__).joinpath("classes.toml").read_text()
        else:
            text = Path(path).read_text()
        document = tomllib.loads(text)
        return _ClassFile.model_validate(document).class_
    except OSError as exc:
        raise InputError(f"{path}: cannot read requirement classes ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not TOML ({exc})") from None
    except ValidationError as exc:
        where, message = first_validation_error(exc)
        raise InputError(f"{path or 'classes.toml'}: field '{where}': {message}") from None


def judge(summary: Summary, classes: list[RequirementClass], margin: float = DEFAULT_MARGIN,
          quantity: Quantity = LATENCY) -> list[Verdict]:
    """A verdict per class, or none when ``quantity`` is not a latency (the classes' budgets are latencies)."""
    if not 0 <= margin < 1:
        raise InputError(f"--margin {margin}: must be at least 0 and below 1")
    if not quantity.judged:
        return []
    usable = 1 - margin
    verdicts = []
    for requirement in classes:
        outcome: Literal["meets", "partly", "fails"]
        worst, jitter = summary.max_ns, summary.max_jitter_ns
        tight = worst <= requirement.latency_ns[0] * usable and jitter <= requirement.jitter_ns[0] * usable
        loose = worst <= requirement.latency_ns[1] * usable and jitter <= requirement.jitter_ns[1] * usable
        if summary.samples == 0:
            outcome, reason = "fails", "no samples"
        elif tight:
            outcome, reason = "meets", "worst case and jitter within the budget"
        elif loose:
            outcome, reason = "partly", "meets the loose end of the class's range only"
        else:
            over = "worst case" if worst > requirement.latency_ns[1] * usable else "jitter"
            outcome, reason = "fails", f"{over} beyond {usable:.0%} of the budget"
        verdicts.append(Verdict(requirement.name, outcome, worst, jitter, requirement.latency_ns[0],
                                requirement.jitter_ns[0], reason))
    return verdicts
