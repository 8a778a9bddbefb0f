"""What to explain and how: a scenario's ``[explain]`` table and the options of ``--explain`` (docs/explain.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..units import duration_field

__all__ = ["ExplainConfig", "TracedLayer", "TRACED_LAYERS", "DEFAULT_FLOOR_NS", "DEFAULT_QUANTILE", "DEFAULT_TOP"]

TracedLayer = Literal["host", "vm", "kvm", "xen", "guest"]
TRACED_LAYERS: tuple[TracedLayer, ...] = ("host", "vm", "kvm", "xen", "guest")
DEFAULT_FLOOR_NS = 20_000
DEFAULT_QUANTILE = 99.9
DEFAULT_TOP = 100


class ExplainConfig(BaseModel):
    """Tracing beside a run, and which of its samples get a cause (the outliers)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="trace beside each run and store its explanation")
    threshold: duration_field("us") | None = Field(  # type: ignore[valid-type]
        None, description="explain samples above this (bare numbers in us); default: the larger of the "
                          "quantile and the floor")
    quantile: float = Field(DEFAULT_QUANTILE, gt=0, lt=100, description="percentile of the run's values above "
                            "which a sample is an outlier (unless 'threshold' is given)")
    floor: duration_field("us") = Field(  # type: ignore[valid-type]
        DEFAULT_FLOOR_NS, description="never call a sample below this an outlier (bare numbers in us)")
    top: int = Field(DEFAULT_TOP, ge=1, le=100_000, description="explain at most this many outliers, largest first")
    layers: list[TracedLayer] = Field(default_factory=lambda: list(TRACED_LAYERS),
                                      description="layers to trace where the environment offers them")
    buffer_mb: int = Field(64, ge=1, le=4096, description="trace kept per traced CPU, in MiB (the flight "
                           "recorder's bound; the whole buffer where there is no recorder)")
    flight_recorder: bool = Field(True, description="read the trace while the run goes (host, SSH targets, the VM "
                                  "layer) and keep only the windows around samples that can become outliers, so a "
                                  "long run keeps its early outliers' causes; the Xen layer keeps the xentrace "
                                  "segments that hold the largest samples, the guest layer a full buffer's newest "
                                  "events. false: one buffer read at the end. Either way the run says what the "
                                  "bound dropped")
