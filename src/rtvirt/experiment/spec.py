"""The experiment file (docs/experiments.md): a grid of design points × the questions asked of every random
system drawn at each point. Validated by pydantic; every error names the field (exit status 2)."""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from ..analysis.design import DESIGNABLE
from ..errors import InputError, first_validation_error
from ..units import parse_duration
from .generators import PERIOD_GENERATORS, UTILISATION_GENERATORS

__all__ = ["Experiment", "Grid", "Samples", "Questions", "DesignPoint", "load_experiment", "parse_experiment"]



def _exact_duration(default_unit: str) -> Any:
    """Nanoseconds whose bare numbers are in ``default_unit``, written back as exact "<n>ns" (the shared
    duration field rounds to 6 digits, and the experiment travels to workers as JSON)."""
    return Annotated[int, BeforeValidator(lambda v: parse_duration(v, default_unit)),
                     PlainSerializer(lambda ns: f"{ns}ns", return_type=str, when_used="json")]


if TYPE_CHECKING:  # checkers see the validated value: nanoseconds
    Seconds = int
    Micros = int
else:
    Seconds = _exact_duration("s")
    Micros = _exact_duration("us")


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _as_range(value: Any) -> Any:
    """``{from = 0.1, to = 1.0, step = 0.05}`` or a list of values or one value."""
    if isinstance(value, dict):
        try:
            start, stop, step = float(value["from"]), float(value["to"]), float(value["step"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("a range needs numbers from, to and step") from None
        if step <= 0 or stop < start:
            raise ValueError("a range needs step > 0 and to >= from")
        count = int(round((stop - start) / step)) + 1
        return [round(start + i * step, 10) for i in range(count)]
    return _as_list(value)


def _one_of(allowed: Any, what: str) -> Any:
    def check(values: list[str]) -> list[str]:
        for value in values:
            if value not in allowed:
                raise ValueError(f"unknown {what} {value!r} (known: {', '.join(sorted(allowed))})")
        return values
    return check


Axis = Annotated[list[Any], BeforeValidator(_as_list)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Grid(_Strict):
    """Every field is an axis (one value or a list); the design points are their cartesian product."""

    utilization: Annotated[list[Annotated[float, Field(gt=0, le=64)]], BeforeValidator(_as_range)] = Field(
        description="total task utilisation per pCPU")
    vms: Annotated[list[Annotated[int, Field(ge=1, le=64)]], BeforeValidator(_as_list)] = [4]
    tasks_per_vm: Annotated[list[Annotated[int, Field(ge=1, le=100)]], BeforeValidator(_as_list)] = [5]
    pcpus: Annotated[list[Annotated[int, Field(ge=1, le=64)]], BeforeValidator(_as_list)] = [1]
    utilizations: Annotated[list[str], BeforeValidator(_as_list)] = ["uunifast-discard"]
    periods: Annotated[list[str], BeforeValidator(_as_list)] = ["uni-moderate"]
    deadlines: Annotated[list[Literal["implicit", "constrained"]], BeforeValidator(_as_list)] = ["implicit"]
    guest_scheduler: Annotated[list[Literal["fp", "edf"]], BeforeValidator(_as_list)] = ["fp"]
    server_period: Annotated[list[Annotated[float, Field(gt=0, le=1)]], BeforeValidator(_as_list)] = Field(
        [0.25], description="the shared-pCPU question's server period, as a share of the VM's shortest deadline")
    spare: Annotated[list[Annotated[float, Field(ge=0, le=1)]], BeforeValidator(_as_list)] = Field(
        [0.5], description="the shared-pCPU question: share of the idle pCPU handed to the servers above their load")

    _known_utilizations = field_validator("utilizations")(_one_of(UTILISATION_GENERATORS, "utilisation generator"))
    _known_periods = field_validator("periods")(_one_of(PERIOD_GENERATORS, "period distribution"))


class Samples(_Strict):
    """A fixed ``count`` per point, or (with ``ci_width``) chunks until the 95 % confidence interval of every
    acceptance ratio of the point is narrower than ``ci_width`` (at most ``count`` systems)."""

    count: int = Field(100, ge=1, le=1_000_000)
    ci_width: float | None = Field(None, gt=0, lt=1)
    chunk: int = Field(25, ge=1, le=10_000, description="systems per task sent to a worker")


class Questions(_Strict):
    schedulers: Annotated[list[str], BeforeValidator(_as_list)] = Field(min_length=1)
    design: bool = Field(False, description="also ask rtvirt design for the smallest interfaces (slow)")
    simulate: Seconds = Field(0, ge=0, description="simulated time per designed system; 0 = no simulation")
    context_switch: Micros = Field(0, description="guest task switch charged by analysis and simulation")
    vm_switch: Micros = Field(0, description="pCPU switch between vCPUs, charged to the budget switched to")

    _known = field_validator("schedulers")(_one_of(DESIGNABLE, "scheduler"))


class Experiment(_Strict):
    name: str = Field("experiment", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    seed: int = Field(1, ge=0, le=2**63 - 1)
    description: str = Field("", max_length=2000)
    grid: Grid
    samples: Samples = Samples.model_validate({})
    questions: Questions
    findings: list[str] = Field([], description="published findings this experiment restates (built-ins)")

    @model_validator(mode="after")
    def _partitioned_fits(self) -> Experiment:
        if "partitioned" in self.questions.schedulers and max(self.grid.vms) > min(self.grid.pcpus):
            raise ValueError("questions.schedulers: partitioned needs a pCPU per VM (grid.vms <= grid.pcpus)")
        return self

    def points(self) -> list[DesignPoint]:
        g = self.grid
        axes = itertools.product(g.utilization, g.vms, g.tasks_per_vm, g.pcpus, g.utilizations, g.periods,
                                 g.deadlines, g.guest_scheduler, g.server_period, g.spare)
        return [DesignPoint(index, *values) for index, values in enumerate(axes)]

    def digest(self) -> str:
        """What identifies the experiment's records: everything but its name, description and findings."""
        data = self.model_dump(mode="json", exclude={"name", "description", "findings"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class DesignPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    index: int
    utilization: float
    vms: int
    tasks_per_vm: int
    pcpus: int
    utilizations: str
    periods: str
    deadlines: str
    guest_scheduler: str
    server_period: float
    spare: float

    def __init__(self, index: int, utilization: float, vms: int, tasks_per_vm: int, pcpus: int, utilizations: str,
                 periods: str, deadlines: str, guest_scheduler: str, server_period: float, spare: float) -> None:
        super().__init__(index=index, utilization=utilization, vms=vms, tasks_per_vm=tasks_per_vm, pcpus=pcpus,
                         utilizations=utilizations, periods=periods, deadlines=deadlines,
                         guest_scheduler=guest_scheduler, server_period=server_period, spare=spare)

    def key(self) -> int:
        """The point's part of every system's seed: its values, not its place in the grid."""
        data = json.dumps(self.model_dump(exclude={"index"}), sort_keys=True).encode()
        return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def parse_experiment(data: dict[str, Any], where: str) -> Experiment:
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        path, message = first_validation_error(exc)
        raise InputError(f"{where}: field '{path}': {message}") from None


def load_experiment(path: Path) -> Experiment:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"experiment file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"experiment file {path}: not TOML ({exc})") from None
    return parse_experiment(data, f"experiment file {path}")
