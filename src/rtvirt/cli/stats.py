"""``rtvirt stats RUN|FILE ...``: exact statistics of stored runs or sample files."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..digest import read_digest, stored_summaries
from ..quantity import Quantity
from ..summary import Statistics
from .output import console, print_json
from .resultopts import DURATION, reading_store

__all__ = ["stats"]

_ROWS = (("samples", "samples"), ("dropped", "dropped"), ("min", "min_ns"), ("lower whisker", "lower_whisker_ns"),
         ("Q1", "q1_ns"), ("median", "median_ns"), ("median 95% CI low", "median_ci_low_ns"),
         ("median 95% CI high", "median_ci_high_ns"), ("mean", "mean_ns"), ("mean 95% CI low", "mean_ci_low_ns"),
         ("mean 95% CI high", "mean_ci_high_ns"), ("σ", "stdev_ns"), ("Q3", "q3_ns"),
         ("upper whisker", "upper_whisker_ns"), ("p99", "p99_ns"), ("p99.9", "p999_ns"), ("p99.99", "p9999_ns"),
         ("max", "max_ns"), ("max jitter", "max_jitter_ns"))


def _table(title: str, statistics: Statistics) -> Table:
    """One run's statistics in its unit: a latency's in µs, Thread-Metric's in rounds."""
    quantity = statistics.quantity
    table = Table(title=title, title_justify="left")
    table.add_column(f"statistic ({quantity.shown_unit})")
    for group in statistics.groups:
        table.add_column(group, justify="right")
    for name, field in _ROWS:
        cells = [str(getattr(s, field)) if field in ("samples", "dropped") else quantity.show(getattr(s, field))
                 for s in statistics.groups.values()]
        table.add_row(name, *cells)
    return table


def _windows_table(source: str, window: int | None) -> Table | None:
    from ..results.windows import time_profile
    from ..store import resolve_runs

    runs = resolve_runs(source) if Path(source).is_dir() or Path(source).name == "manifest.json" else []
    table = Table(title="over time (cumulative marks, then per-window maxima)", title_justify="left")
    for column in ("run", "part", "from (s)", "to (s)", "samples", "unit", "median", "p99", "max"):
        table.add_column(column, justify="left" if column in ("run", "part", "unit") else "right")
    for run in runs:
        if not run.has_samples:
            continue
        quantity: Quantity = run.quantity
        shown, unit = quantity.show, quantity.shown_unit
        digest = read_digest(run.path, run.run_id)
        stored = digest is not None and digest.has_profile and window in (None, digest.window_ns)
        profile = digest.profile() if digest is not None and stored else time_profile(run, window)
        for share, (end, s) in zip(("1/8", "2/8", "4/8", "8/8"), profile.marks, strict=False):
            table.add_row(run.run_id, f"first {share}", "0.000", f"{end / 1e9:.3f}", str(s.samples), unit,
                          shown(s.median_ns), shown(s.p99_ns), shown(s.max_ns))
        for w in profile.windows:
            table.add_row(run.run_id, "window", f"{w.start_ns / 1e9:.3f}",
                          f"{(w.start_ns + profile.window_ns) / 1e9:.3f}", str(w.count), unit, "-", "-",
                          shown(w.max_ns))
    return table if table.row_count else None


def _summaries(source: str, column: str | None) -> dict[str, Statistics]:
    # a stored run's digest holds its statistics: no numpy, pyarrow or pass over the samples
    stored = stored_summaries(source) if column is None else None
    if stored is None:
        from ..results.sources import summaries_of

        stored = summaries_of(source, column)
    return stored


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--column", help="latency column of a foreign Parquet file [default: first integer column]")
@click.option("--over-time", is_flag=True, help="also cumulative statistics at 1/8, 2/8, 4/8, 8/8 of each run "
              "and per-window maxima")
@click.option("--window", type=DURATION, help="window for --over-time, e.g. 5m [default: 5m, or 1/50 of a "
              "shorter run]")
@click.option("--json", "as_json", is_flag=True, help="print the statistics as JSON (probe summary field names)")
def stats(sources: tuple[str, ...], column: str | None, over_time: bool, window: int | None, as_json: bool) -> None:
    """Exact statistics (quartiles, whiskers, percentiles to p99.99, 95 % CIs) of runs or sample files.

    SOURCES are run directories, results directories (every run), shared stores' URLs (every run),
    manifest.json files, .rtvs sample streams or Parquet files with an integer latency column in ns.
    """
    collected: dict[str, Statistics] = {}
    for source in sources:
        if "://" in source:  # a shared store: every run in it
            collected |= {name: found for run in reading_store(source).list_runs() if not run.failed
                          for name, found in _summaries(str(run.path), column).items()}
        else:
            collected |= _summaries(source, column)
    if as_json:
        print_json({name: statistics.as_json() for name, statistics in collected.items()})
        return
    for name, statistics in collected.items():
        console.print(_table(name, statistics))
    if over_time:
        for source in sources:
            table = _windows_table(source, window)
            if table is not None:
                console.print(table)
