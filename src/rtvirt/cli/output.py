"""How every command prints (docs/output.md): tables, errors, progress and JSON.

- stdout a terminal: tables fitted to the terminal's width, colour unless NO_COLOR is set.
- stdout not a terminal (a file, a pipe, a CI log): tables at their natural width, never squeezed into "…"
  cells, and no colour (FORCE_COLOR turns it back on).
- progress bars go to stderr, and only when stderr is a terminal (``--progress`` forces them).
- ``--json`` prints one JSON document on stdout and nothing else there.
"""

from __future__ import annotations

import json
import math
import sys
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from ..stats import Summary

__all__ = ["console", "err_console", "summary_table", "print_json", "print_error", "progress_wanted", "us"]

# wide enough for any table we print; rich pads nothing to the console width, so lines stay as long as they are
_UNSQUEEZED = 10_000


def _console_for(stream: IO[str], stderr: bool) -> Console:
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else _UNSQUEEZED)


console = _console_for(sys.stdout, stderr=False)
err_console = _console_for(sys.stderr, stderr=True)


def progress_wanted(option: bool | None) -> bool:
    """``--progress/--no-progress`` as given, else: only when stderr (where the bar goes) is a terminal."""
    return sys.stderr.isatty() if option is None else option


def print_error(message: str) -> None:
    err_console.print(f"[bold red]rtvirt:[/] {escape(message)}", soft_wrap=True)


def us(ns: float) -> str:
    return "-" if math.isnan(ns) else f"{ns / 1000:.3f}"


def summary_table(title: str, summaries: dict[str, Summary], value_field: str = "latency_ns") -> Table:
    """Statistics in the values' unit (rtvirt.quantity): times in µs, counts (threadmetric's rounds) as counted."""
    from ..quantity import quantity_of

    quantity = quantity_of(value_field)
    table = Table(title=title, title_justify="left")
    table.add_column("group")
    for column in ("samples", "dropped", "min", "median", "mean", "p99", "p99.9", "p99.99", "max", "stdev", "jitter"):
        table.add_column(column if column in ("samples", "dropped") else f"{column} {quantity.shown_unit}",
                         justify="right")
    for group, s in summaries.items():
        table.add_row(group, str(s.samples), str(s.dropped), *(quantity.show(value) for value in (
            s.min_ns, s.median_ns, s.mean_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns, s.stdev_ns, s.max_jitter_ns)))
    return table


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(_clean(document), indent=2, default=str))
