"""Time values with unit suffixes (ns, us, ms, s, m, h), as every rtvirt option and file accepts them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

__all__ = ["NS_PER", "parse_duration", "format_duration", "Duration", "duration_field"]

NS_PER = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
          "h": 3_600_000_000_000, "d": 86_400_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|m|h|d)?\s*$")


def parse_duration(value: Any, default_unit: str = "ns") -> int:
    """Return nanoseconds. Bare numbers are in ``default_unit`` (cyclictest: -i in us, -D in s)."""
    if isinstance(value, bool):
        raise ValueError("expected a time such as 100us, 1ms, 10s, 5m, 8h")
    if isinstance(value, int):
        ns = value * NS_PER[default_unit]
    elif isinstance(value, float):
        ns = round(value * NS_PER[default_unit])
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a time; use a number with ns, us, ms, s, m, h or d")
        ns = round(float(match.group(1)) * NS_PER[match.group(2) or default_unit])
    else:
        raise ValueError("expected a time such as 100us, 1ms, 10s, 5m, 8h")
    if ns < 0:
        raise ValueError("a time cannot be negative")
    return ns


def format_duration(ns: float) -> str:
    """Shortest readable form: 1500000 -> '1.5ms'."""
    for unit in ("h", "m", "s", "ms", "us"):
        if abs(ns) >= NS_PER[unit]:
            text = f"{ns / NS_PER[unit]:.6g}"
            return f"{text}{unit}"
    return f"{ns:.6g}ns"


def duration_field(default_unit: str) -> Any:
    """A pydantic-validated int of nanoseconds whose bare numbers are in ``default_unit``."""
    return Annotated[
        int,
        BeforeValidator(lambda v: parse_duration(v, default_unit)),
        PlainSerializer(format_duration, return_type=str, when_used="json"),
    ]


Duration = duration_field("ns")
