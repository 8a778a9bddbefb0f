"""``[predict]`` of a scenario: its schema (what rtvirt.predict reads to simulate and analyse each measured
configuration; docs/predictions.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..units import duration_field

__all__ = ["PredictSpec"]


class PredictSpec(BaseModel):
    """``[predict]`` of a scenario: simulate and analyse each measured configuration beside measuring it."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="false keeps the table but predicts nothing")
    model: str | None = Field(None, max_length=4096, description="an explicit model file used for every "
                              "configuration instead of the derived one (paths relative to the scenario file)")
    compare: str | None = Field(None, max_length=200, description="with 'model': the record kind compared with "
                                "the measurement, 'vm/task' (its start - arrival) or 'gap:VM.VCPU'")
    duration: duration_field("s") | None = Field(  # type: ignore[valid-type]
        None, gt=0, description="simulated time per configuration (default: the run's duration)")
    probe_cost: duration_field("us") = Field(  # type: ignore[valid-type]
        1_000, ge=1, description="execution time of one timer-probe job in the model (bare numbers in us)")
    vm_switch: duration_field("us") = Field(  # type: ignore[valid-type]
        0, ge=0, description="switch overhead charged by the model when a CPU changes vCPU (bare numbers in us)")
    tick: duration_field("us") = Field(  # type: ignore[valid-type]
        0, ge=0, description="scheduler tick of the model (0: event driven; bare numbers in us)")
    enforcement: Literal["auto", "off"] = Field(
        "auto", description="auto: SCHED_DEADLINE runtimes enforced at the measured kernel's tick (its HZ and "
        "HRTICK_DL from the run's system audit), the tick's phase read from a gap probe's holes; off: exactly")
    long_gap: duration_field("us") | None = Field(  # type: ignore[valid-type]
        None, ge=1, description="gaps at least this long are the ones the model explains (scheduler holes); "
        "shorter ones are interrupts and housekeeping it does not have (default: half the model's median gap, "
        "else 1 ms; bare numbers in us)")
