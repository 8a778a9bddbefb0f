"""cpu: sqrt spinning, or a periodic duty-cycle interferer (agents/stressors/cpu.c)."""

from __future__ import annotations

from pydantic import Field, model_validator

from ..errors import InputError
from ..params import cli
from ..units import duration_field
from .base import StressorSpec, StressParams


class CpuParams(StressParams):
    slice: duration_field("us") = Field(  # type: ignore[valid-type]
        0, description="duty mode: busy time at the start of every period (bare numbers in us)",
        json_schema_extra=cli(metavar="TIME"))
    period: duration_field("us") = Field(  # type: ignore[valid-type]
        0, description="duty mode: period; 0 = busy all the time (bare numbers in us)",
        json_schema_extra=cli(metavar="TIME"))

    @model_validator(mode="after")
    def _duty_mode_is_consistent(self) -> CpuParams:
        if (self.slice == 0) != (self.period == 0):
            raise ValueError("--slice and --period go together (duty mode needs both)")
        if self.period and self.slice >= self.period:
            raise ValueError("--slice must be shorter than --period (use neither for a 100 % load)")
        if self.period and self.period < 10_000:
            raise ValueError("--period must be at least 10us")
        return self


def _stress_ng(params: CpuParams, workers: int) -> list[str]:
    if params.period:
        # stress-ng's --cpu-load has neither a fixed period nor a phase: no known interferer.
        raise InputError("options --slice/--period: duty mode needs --engine native (stress-ng cannot hold "
                         "a fixed period)")
    return ["--cpu", str(workers), "--cpu-method", "sqrt"]


STRESSOR = StressorSpec(
    name="cpu",
    summary="spin on square roots; --slice/--period make a periodic duty-cycle interferer",
    params=CpuParams,
    represents="the sqrt workers of the COTS study's reference load; a guest spinning at top priority; "
               "in duty mode, a known interferer (slice every period)",
    stress_ng=_stress_ng,
)
