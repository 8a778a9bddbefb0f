"""Validated parameter objects and their command-line options.

Each probe or stressor declares its parameters once, as a pydantic model; the same model validates
the command line, scenario files and library calls. Fields carry their CLI spelling in
``json_schema_extra`` (``short``: the cyclictest-style letter, ``flag``: on/off switch).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import click
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError, model_validator
from pydantic.fields import FieldInfo

from .errors import InputError
from .units import duration_field, format_duration

__all__ = ["CpuList", "parse_cpulist", "cpu_list", "Params", "CommonParams", "click_options", "build_params", "cli"]

_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpulist(value: Any) -> tuple[int, ...]:
    """'0,2-3' or [0, 2, 3] -> (0, 2, 3); order kept, duplicates rejected."""
    if isinstance(value, int) and not isinstance(value, bool):
        items: list[int] = [value]
    elif isinstance(value, (list, tuple)):
        items = []
        for item in value:
            items.extend(parse_cpulist(item))
    elif isinstance(value, str):
        items = []
        for part in value.replace(" ", "").split(","):
            match = _CPU_RANGE.match(part)
            if not match:
                raise ValueError(f"{value!r} is not a CPU list such as 0,2-3")
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise ValueError(f"CPU range {part!r} runs backwards")
            items.extend(range(lo, hi + 1))
    else:
        raise ValueError("expected a CPU list such as 0,2-3")
    if len(set(items)) != len(items):
        raise ValueError("a CPU is listed twice")
    if any(cpu < 0 or cpu > 1023 for cpu in items):
        raise ValueError("CPU numbers run from 0 to 1023")
    return tuple(items)


def cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5'"""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


CpuList = Annotated[tuple[int, ...], BeforeValidator(parse_cpulist)]


def cli(short: str | None = None, *, flag: bool = False, metavar: str | None = None) -> dict[str, Any]:
    """CLI spelling of a field, for ``json_schema_extra``."""
    extra: dict[str, Any] = {"flag": flag}
    if short:
        extra["short"] = short
    if metavar:
        extra["metavar"] = metavar
    return extra


class Params(BaseModel):
    """Base of every parameter model: unknown fields are errors, values are checked on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class CommonParams(Params):
    """Options every probe takes (the cyclictest core set)."""

    duration: duration_field("s") = Field(  # type: ignore[valid-type]
        10_000_000_000, description="run time (bare numbers in s); 0 runs until --loops or Ctrl-C",
        json_schema_extra=cli("-D", metavar="TIME"))
    loops: int = Field(0, ge=0, description="samples per thread, 0 = no limit", json_schema_extra=cli("-l"))
    threads: int = Field(1, ge=1, le=256, description="measuring threads", json_schema_extra=cli("-t"))
    priority: int = Field(99, ge=0, le=99, description="SCHED_FIFO priority, 0 = SCHED_OTHER",
                          json_schema_extra=cli("-p"))
    affinity: CpuList | None = Field(None, description="CPUs for the threads (thread i on the i-th, cycling)",
                                     json_schema_extra=cli("-a", metavar="CPUS"))
    mlock: bool = Field(True, description="lock all memory (mlockall)", json_schema_extra=cli("-m", flag=True))
    dma_latency: bool = Field(True, description="hold /dev/cpu_dma_latency at 0 while running",
                              json_schema_extra=cli(flag=True))
    rt: bool = Field(True, description="real-time setup; --no-rt runs unprivileged (SCHED_OTHER, no mlock)",
                     json_schema_extra=cli(flag=True))

    @model_validator(mode="after")
    def _no_rt_means_unprivileged(self) -> CommonParams:
        if not self.rt:
            object.__setattr__(self, "priority", 0)
            object.__setattr__(self, "mlock", False)
            object.__setattr__(self, "dma_latency", False)
        return self

    def check_host(self, usable: Iterable[int] | None = None) -> None:
        """Fail early, naming the option, for CPUs this process may not use (or, given, the ``usable`` ones: an
        environment's CPUs as found before it took some away from this process, as a v2 partition root does)."""
        allowed = set(usable) if usable is not None else os.sched_getaffinity(0)
        for cpu in self.affinity or ():
            if cpu not in allowed:
                raise InputError(f"option -a/--affinity: CPU {cpu} does not exist or is not allowed here "
                                 f"(usable: {','.join(map(str, sorted(allowed)))})")


ModelT = TypeVar("ModelT", bound=Params)
F = TypeVar("F", bound=Callable[..., Any])


def _option_names(name: str, extra: dict[str, Any]) -> list[str]:
    long = "--" + name.replace("_", "-")
    names = [f"{long}/--no-{name.replace('_', '-')}"] if extra.get("flag") else [long]
    if extra.get("short"):
        names.insert(0, extra["short"])
    return names


def click_options(model: type[Params], *, exclude: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorator adding one click option per model field; values stay raw for pydantic to validate."""

    def decorate(func: F) -> F:
        for name, info in reversed(list(model.model_fields.items())):
            if name in exclude:
                continue
            extra = _cli_extra(model, name)
            default = info.default
            help_text = info.description or ""
            if extra.get("flag"):
                option = click.option(*_option_names(name, extra), name, default=None,
                                      help=f"{help_text} [default: {'on' if default else 'off'}]")
            else:
                option = click.option(*_option_names(name, extra), name, default=None, type=str,
                                      metavar=_metavar(info, extra),
                                      help=f"{help_text} [default: {_show_default(info)}]")
            func = option(func)
        return func

    return decorate


def _metavar(info: FieldInfo, extra: dict[str, Any]) -> str:
    """What the option takes: the field's own metavar, its choices (``cyclictest|timerlat``), else N."""
    if "metavar" in extra:
        return str(extra["metavar"])
    if get_origin(info.annotation) is Literal:
        return "|".join(str(choice) for choice in get_args(info.annotation))
    return "N"


def _show_default(info: FieldInfo) -> str:
    """The default as a user would type it: durations with their unit, sizes and lists as given."""
    value = info.default
    if value is None:
        return "none"
    is_duration = any(isinstance(m, PlainSerializer) and m.func is format_duration for m in info.metadata)
    if is_duration and isinstance(value, int):
        return format_duration(value) if value else "0"
    return str(value)


def build_params(model: type[ModelT], values: dict[str, Any]) -> ModelT:
    """Validate CLI values; an invalid one raises InputError naming the option (for a rule between options, the
    options its message names)."""
    given = {k: v for k, v in values.items() if v is not None and k in model.model_fields}
    try:
        return model(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = error["msg"].removeprefix("Value error, ")
        field = str(error["loc"][0]) if error["loc"] else ""
        if field in model.model_fields:
            named = [field]
        else:  # a model-level rule (--slice shorter than --period): the options it speaks of
            spelled = {"--" + name.replace("_", "-"): name for name in model.model_fields}
            named = [spelled[option] for option in dict.fromkeys(re.findall(r"--[a-z][a-z-]*", message))
                     if option in spelled]
        if not named:
            raise InputError(f"options: {message}") from None
        options = ", ".join("/".join(_option_names(name, _cli_extra(model, name))) for name in named)
        raise InputError(f"option{'s' if len(named) > 1 else ''} {options}: {message}") from None


def _cli_extra(model: type[Params], name: str) -> dict[str, Any]:
    extra = model.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}
