"""Human tables and JSON for summaries."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from ..stats import Summary

__all__ = ["console", "summary_table", "print_json", "us"]

console = Console(highlight=False)


def us(ns: float) -> str:
    return "-" if math.isnan(ns) else f"{ns / 1000:.3f}"


def summary_table(title: str, summaries: dict[str, Summary], value_field: str = "latency_ns") -> Table:
    """Statistics in microseconds; a value that is a count (e.g. threadmetric's ``rounds``) stays as is."""
    is_time = value_field.endswith("_ns")
    unit = "us" if is_time else value_field

    def show(value: float) -> str:
        if is_time or math.isnan(value):
            return us(value)
        return f"{value:.6g}"

    table = Table(title=title, title_justify="left")
    table.add_column("group")
    for column in ("samples", "dropped", "min", "median", "mean", "p99", "p99.9", "p99.99", "max", "stdev", "jitter"):
        table.add_column(column if column in ("samples", "dropped") else f"{column} {unit}", justify="right")
    for group, s in summaries.items():
        table.add_row(group, str(s.samples), str(s.dropped), show(s.min_ns), show(s.median_ns), show(s.mean_ns),
                      show(s.p99_ns), show(s.p999_ns), show(s.p9999_ns), show(s.max_ns), show(s.stdev_ns),
                      show(s.max_jitter_ns))
    return table


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(_clean(document), indent=2, default=str))
