"""``rtvirt compare [BASELINE] RUN``: isolation of RUN against BASELINE, and whether RUN's tail is worse than its
baseline's beyond the runs' own spread (exit 3 on a regression of the same configuration, for CI gates)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import InputError, VerdictFailed
from ..results.history import previous_run_row, tail_test
from ..results.isolation import isolation, outliers
from ..store import StoredRun
from ..stores import RunStore, resolve_in
from ..stores.provenance import configuration, run_row
from .output import console, print_json, us
from .resultopts import reading_store, results_option

__all__ = ["compare"]


def _one(spec: str, store: RunStore) -> StoredRun:
    runs = resolve_in(spec, store)
    if len(runs) != 1:
        raise InputError(f"{spec}: names {len(runs)} runs; give one run directory or run id")
    return runs[0]


def _previous(run: StoredRun, store: RunStore) -> StoredRun:
    row = run_row(run.manifest)
    previous = previous_run_row(store, row)
    if previous is None:
        raise InputError(f"{run.run_id}: no earlier complete run of configuration {configuration(row)!r} on machine "
                         f"{row.get('machine') or 'unknown'!r} in {store.label}; name a BASELINE")
    found = store.find_run(str(previous["run_id"]))
    assert found is not None  # the store just listed it
    return found


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="[BASELINE] RUN")
@results_option("results store for run ids and for the last run of RUN's configuration")
@click.option("--top", type=click.IntRange(0, 1000), default=10, show_default=True, help="outliers of RUN shown")
@click.option("--level", type=click.FloatRange(0.5, 1, max_open=True), default=0.999, show_default=True,
              help="tail test: the baseline's quantile whose exceedances are counted")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=1e-3,
              show_default=True, help="tail test: significance level")
@click.option("--min-ratio", type=click.FloatRange(1), default=2.0, show_default=True,
              help="tail test: RUN must exceed the threshold at least this many times as often as BASELINE")
@click.option("--gate/--no-gate", default=None, help="exit 3 on a tail regression [default: when both runs are "
              "of the same configuration]")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def compare(runs: tuple[str, ...], results: str, top: int, level: float, alpha: float, min_ratio: float,
            gate: bool | None, as_json: bool) -> None:
    """Isolation table of RUN against BASELINE: mean/median/p99 increase %, WCET vs WCET, outliers; and the
    tail test on their exact histograms.

    Without BASELINE, RUN is compared with the last earlier complete run of its configuration on its machine.
    Exits 3 when RUN's tail is worse beyond the runs' own spread (see --gate)."""
    if len(runs) > 2:
        raise InputError(f"give at most BASELINE and RUN ({len(runs)} arguments given)")
    store = reading_store(results)
    other = _one(runs[-1], store)
    base_run = _one(runs[0], store) if len(runs) == 2 else _previous(other, store)
    row = isolation(other, base_run)
    cause = _caused_by(other)
    worst = outliers(other, top) if top else []
    base_histogram, histogram = base_run.histogram(), other.histogram()
    test = tail_test(base_histogram, histogram, level=level, alpha=alpha, min_ratio=min_ratio) \
        if base_histogram is not None and histogram is not None and base_histogram.n and histogram.n else None
    same = configuration(run_row(base_run.manifest)) == configuration(run_row(other.manifest))
    gated = same if gate is None else gate
    if as_json:
        document: dict[str, Any] = {"isolation": {**asdict(row), "caused_by": cause},
                                    "outliers": [asdict(o) for o in worst],
                                    "baseline_run": base_run.run_id, "run": other.run_id,
                                    "tail": test.as_dict() if test else None}
        print_json(document)
    else:
        _print(row, cause, worst, test, base_run, other)
    if test is not None and test.regression and gated:
        raise VerdictFailed(f"{other.run_id}: tail regression against {base_run.run_id} "
                            f"({test.above} of {test.samples} samples above {us(test.threshold_ns)} µs, "
                            f"{test.rate_ratio:.1f}x the baseline's rate, p = {test.p_value:.2g})")


def _caused_by(run: StoredRun) -> str:
    """What caused most of the run's outlier latency, when it was explained (docs/explain.md)."""
    from ..results.explained import caused_by, configuration_causes, load_explanation

    explanation = load_explanation(run.path)
    return caused_by(configuration_causes([explanation] if explanation else []))


def _print(row: Any, cause: str, worst: list[Any], test: Any, base_run: StoredRun, other: StoredRun) -> None:
    table = Table(title=f"{row.label} against {row.baseline}", title_justify="left")
    for column in ("mean increase", "median increase", "p99 increase", "WCET µs", "baseline WCET µs", "WCET ratio"):
        table.add_column(column, justify="right")
    table.add_column("caused by")
    table.add_row(f"{row.mean_increase_pct:+.1f} %", f"{row.median_increase_pct:+.1f} %",
                  f"{row.p99_increase_pct:+.1f} %", us(row.wcet_ns), us(row.baseline_wcet_ns), f"{row.wcet_ratio:.2f}",
                  escape(cause))
    console.print(table)
    if test is not None:
        table = Table(title=f"tail test: {other.run_id} against {base_run.run_id}", title_justify="left")
        for column in ("threshold µs", "baseline above", "run above", "rate ratio", "p", "verdict"):
            table.add_column(column, justify="right")
        verdict = "[red]regression[/]" if test.regression else "within the runs' spread"
        table.add_row(f"{us(test.threshold_ns)} (p{test.level * 100:g})",
                      f"{test.baseline_above} / {test.baseline_samples}", f"{test.above} / {test.samples}",
                      f"{test.rate_ratio:.2f}", f"{test.p_value:.2g}", verdict)
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
