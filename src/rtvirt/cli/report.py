"""``rtvirt report RESULTS``: the self-contained HTML report (or Markdown / JSON) of a results directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import click

from ..results.report import FORMATS, collect, render, write_report
from ..results.verdicts import DEFAULT_MARGIN
from .output import console, print_json
from .resultopts import DURATION

__all__ = ["report"]

_SUFFIX = {"html": ".html", "markdown": ".md", "json": ".json"}


@click.command()
@click.argument("results", metavar="RESULTS", envvar="RTVIRT_RESULTS")
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              help="file to write, - for stdout (nothing else is printed there) [default: "
              "RESULTS/report.html|.md|.json; for a store URL: ./report.html|…]")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="html", show_default=True)
@click.option("--baseline", help="configuration label the configurations of its measurement (same probe, workload, "
              "parameters) are compared against [default: per measurement, one named baseline/solo/bare, else the "
              "first]")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=DEFAULT_MARGIN, show_default=True,
              help="safety margin: share of each requirement budget kept for the rest of the end-to-end path")
@click.option("--classes", "classes_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file of requirement classes [default: the built-in classes]")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="outliers per run")
@click.option("--window", type=DURATION, help="window of the per-window maxima [default: 5m, or 1/50 of a "
              "shorter run]")
@click.option("--json", "as_json", is_flag=True, help="print where the report went as JSON")
def report(results: str, out: Path | None, fmt: Literal["html", "markdown", "json"], baseline: str | None,
           margin: float, classes_file: Path | None, top: int, window: int | None, as_json: bool) -> None:
    """Write the report of every run in RESULTS: verdicts, statistics, plots, isolation, outliers, settings.

    RESULTS is a results directory, one run, or a shared store's URL (every run in it)."""
    from ..stores import is_store_url, open_store

    if is_store_url(results):
        source: Any = open_store(results)
        target = out or Path(f"report{_SUFFIX[fmt]}")
    else:
        source, target = Path(results), out or Path(results) / f"report{_SUFFIX[fmt]}"
    options: dict[str, Any] = {"baseline": baseline, "classes_file": classes_file, "margin": margin, "top": top,
                               "window_ns": window}
    if str(out) == "-":  # the report itself on stdout, for a pipe (`--format json --out - | jq ...`)
        sys.stdout.write(render(collect(source, **options), fmt))
        return
    write_report(source, target, fmt, **options)
    if as_json:
        print_json({"report": str(target), "format": fmt})
    else:
        console.print(f"report written to {target}")
