"""``rtvirt run [NAME|FILE.toml]``: run a campaign, write its report, print the summary."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from ..campaign import CampaignState, find_resumable, run_campaign
from ..campaign.engine import CampaignResult
from ..errors import InputError
from ..scenario import load_scenario, parse_scenario
from .output import console, us

__all__ = ["run"]


def _summary_table(result: CampaignResult) -> Table:
    table = Table(title=f"campaign {result.state.campaign_id}", title_justify="left")
    for column in ("run", "status", "samples", "median us", "p99 us", "max us"):
        table.add_column(column, justify="right" if column.endswith(("us", "samples")) else "left",
                         no_wrap=column == "run")
    for key, outcome in result.outcomes.items():
        summary = ((outcome.manifest or {}).get("summary") or {}).get("all") or {}

        def cell(name: str, summary: dict = summary) -> str:
            value = summary.get(name)
            return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else us(value)

        table.add_row(key, outcome.status, str(summary.get("samples", "-")), cell("median_ns"), cell("p99_ns"),
                      cell("max_ns"))
    return table


def _print_warnings(result: CampaignResult) -> None:
    seen: dict[str, None] = {}
    for outcome in result.outcomes.values():
        for warning in ((outcome.manifest or {}).get("system") or {}).get("warnings") or []:
            seen.setdefault(str(warning)[:300])
    for warning in seen:
        console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)


def _print_reasons(result: CampaignResult) -> None:
    for key, outcome in result.outcomes.items():
        if outcome.status != "complete" and outcome.reason:
            console.print(f"{key}: {outcome.status}: {escape(outcome.reason)}", highlight=False)


@click.command()
@click.argument("scenario", required=False)
@click.option("--out", "results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="results directory (runs/, campaigns/)")
@click.option("--scale", type=float, default=None, help="multiply every duration and event time (0.01: 100x shorter)")
@click.option("--resume", is_flag=True, help="continue the last unfinished campaign in --out, skipping finished runs")
@click.option("--progress/--no-progress", default=None, help="progress bars [default: when on a terminal]")
def run(scenario: str | None, results: Path, scale: float | None, resume: bool, progress: bool | None) -> None:
    """Run a campaign: a built-in scenario NAME (default: `default`) or a scenario FILE.toml."""
    if resume:
        wanted = None
        if scenario:
            wanted = load_scenario(scenario)[0].name
        state = find_resumable(results, wanted)
        if scale is not None and not math.isclose(scale, state.scale):
            raise InputError(f"option --scale: the campaign being resumed ran at scale {state.scale}; "
                             "leave --scale out or give the same value")
        parsed = parse_scenario(state.scenario_text, state.source)
        console.print(f"resuming campaign {state.campaign_id}: "
                      f"{sum(1 for r in state.runs.values() if r.get('status') in ('complete', 'failed', 'skipped'))}"
                      " runs already finished", highlight=False)
    else:
        parsed, text, source = load_scenario(scenario or "default")
        factor = 1.0 if scale is None else scale
        if not 0 < factor <= 1000:
            raise InputError("option --scale: must be above 0 and at most 1000")
        state = CampaignState.create(results, parsed.name, text, source, factor)
    show = sys.stderr.isatty() if progress is None else progress
    try:
        result = run_campaign(parsed, state, results, show_progress=show)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: continue with rtvirt run --resume --out {results}")
        sys.exit(130)
    console.print(_summary_table(result))
    _print_reasons(result)
    _print_warnings(result)
    if result.interrupted:
        console.print(f"[yellow]interrupted[/]: continue with rtvirt run --resume --out {results}")
        sys.exit(130)
    if result.report:
        console.print(f"report: {result.report}", highlight=False)
    failed = [k for k, o in result.outcomes.items() if o.status == "failed"]
    if failed:
        console.print(f"[red]{len(failed)} run(s) failed[/]", highlight=False)
        sys.exit(1)
