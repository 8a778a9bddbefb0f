"""``rtvirt sql "SELECT …"``: query the DuckDB catalog of a results directory (tables: docs/results-store.md)."""

from __future__ import annotations

import csv
import sys

import click
from rich.table import Table

from .output import console, print_json
from .resultopts import reading_store, results_option

__all__ = ["sql"]


@click.command()
@click.argument("statement")
@results_option("results store")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
def sql(statement: str, results: str, fmt: str) -> None:
    """Run STATEMENT against the catalog: tables runs, samples, histograms, analysis_tasks, experiment_records,
    explain_parts (docs/results-store.md)."""
    from ..results.catalog import query  # duckdb's import would slow every other rtvirt command's start

    columns, rows = query(reading_store(results), statement)
    if fmt == "json":
        print_json({"columns": columns, "rows": [list(r) for r in rows]})
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table()
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        console.print(table)
