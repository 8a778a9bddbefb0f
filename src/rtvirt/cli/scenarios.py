"""``rtvirt scenarios``: the built-in scenarios."""

from __future__ import annotations

import click
from rich.table import Table

from ..campaign import expand
from ..scenario import builtin_scenarios, parse_scenario
from ..units import format_duration
from .output import console, print_json

__all__ = ["scenarios"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the list as JSON")
def scenarios(as_json: bool) -> None:
    """List the built-in scenarios (run one with `rtvirt run NAME`)."""
    table = Table(title="built-in scenarios", title_justify="left")
    for column in ("name", "runs", "duration each", "description"):
        table.add_column(column)
    listed: dict[str, dict] = {}
    for name, text in builtin_scenarios().items():
        parsed = parse_scenario(text, f"built-in scenario {name}")
        runs = len(expand(parsed))
        table.add_row(name, str(runs), format_duration(parsed.duration), parsed.description)
        listed[name] = {"runs": runs, "duration_ns": parsed.duration, "description": parsed.description}
    if as_json:
        print_json(listed)
    else:
        console.print(table)
