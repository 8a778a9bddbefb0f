"""``rtvirt scenarios``: the built-in scenarios."""

from __future__ import annotations

import click
from rich.table import Table

from ..campaign import expand
from ..scenario import builtin_scenarios, parse_scenario
from ..units import format_duration
from .output import console

__all__ = ["scenarios"]


@click.command()
def scenarios() -> None:
    """List the built-in scenarios (run one with `rtvirt run NAME`)."""
    table = Table(title="built-in scenarios", title_justify="left")
    for column in ("name", "runs", "duration each", "description"):
        table.add_column(column)
    for name, text in builtin_scenarios().items():
        parsed = parse_scenario(text, f"built-in scenario {name}")
        table.add_row(name, str(len(expand(parsed))), format_duration(parsed.duration), parsed.description)
    console.print(table)
