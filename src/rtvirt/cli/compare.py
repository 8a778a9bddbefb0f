"""``rtvirt compare RUN_A RUN_B``: isolation of RUN_B against RUN_A (the baseline)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click
from rich.table import Table

from ..errors import InputError
from ..results.isolation import isolation, outliers
from ..store import resolve_runs
from .output import console, print_json, us

__all__ = ["compare"]


def _one(spec: str, results: Path | None) -> object:
    runs = resolve_runs(spec, results)
    if len(runs) != 1:
        raise InputError(f"{spec}: names {len(runs)} runs; give one run directory or run id")
    return runs[0]


@click.command()
@click.argument("baseline")
@click.argument("run")
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="results directory for run ids")
@click.option("--top", type=click.IntRange(0, 1000), default=10, show_default=True, help="outliers of RUN shown")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def compare(baseline: str, run: str, results: Path, top: int, as_json: bool) -> None:
    """Isolation table of RUN against BASELINE: mean/median/p99 increase %, WCET vs WCET, outliers."""
    base_run, other = _one(baseline, results), _one(run, results)
    row = isolation(other, base_run)  # type: ignore[arg-type]
    worst = outliers(other, top) if top else []  # type: ignore[arg-type]
    if as_json:
        print_json({"isolation": asdict(row), "outliers": [asdict(o) for o in worst]})
        return
    table = Table(title=f"{row.label} against {row.baseline}", title_justify="left")
    for column in ("mean increase", "median increase", "p99 increase", "WCET µs", "baseline WCET µs", "WCET ratio"):
        table.add_column(column, justify="right")
    table.add_row(f"{row.mean_increase_pct:+.1f} %", f"{row.median_increase_pct:+.1f} %",
                  f"{row.p99_increase_pct:+.1f} %", us(row.wcet_ns), us(row.baseline_wcet_ns), f"{row.wcet_ratio:.2f}")
    console.print(table)
    if worst:
        table = Table(title="outliers", title_justify="left")
        for column in ("time s", "cpu", "value µs", "median µs", "value cycles", "median cycles"):
            table.add_column(column, justify="right")
        for o in worst:
            table.add_row(f"{o.t_ns / 1e9:.3f}", str(o.cpu), us(o.value_ns), us(o.median_ns),
                          "-" if o.value_cycles is None else f"{o.value_cycles:,.0f}",
                          "-" if o.median_cycles is None else f"{o.median_cycles:,.0f}")
        console.print(table)
