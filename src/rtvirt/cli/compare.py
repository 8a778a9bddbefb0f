"""``rtvirt compare [BASELINE] RUN``: isolation of RUN against BASELINE, and whether RUN's tail is worse than its
baseline's beyond the runs' own spread (exit 3 on a regression of the same configuration, for CI gates).

Only comparable runs (rtvirt.identity: the same measurement) are compared: two that are not exit 2 naming what
differs, unless --anyway, and then never with the gate."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import InputError, VerdictFailed
from ..identity import identity_key, measurement_differences, setting_differences
from ..quantity import Quantity
from ..results.history import TailTest, previous_run_row, tail_test
from ..results.isolation import isolation, outliers
from ..store import StoredRun
from ..stores import RunStore, resolve_in
from ..stores.provenance import run_row
from .output import console, print_json
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
        raise InputError(f"{run.run_id}: no earlier complete run comparable with it (same probe, parameters, CPUs, "
                         f"environment and configuration {run.label!r}) on machine "
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
              "of the same configuration: same measurement and setting]")
@click.option("--anyway", is_flag=True, help="compare runs that are not comparable (another probe parameter, "
              "thread count or CPUs), without the gate")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def compare(runs: tuple[str, ...], results: str, top: int, level: float, alpha: float, min_ratio: float,
            gate: bool | None, anyway: bool, as_json: bool) -> None:
    """Isolation table of RUN against BASELINE: mean/median/p99 increase %, WCET vs WCET, outliers; and the
    tail test on their exact histograms.

    Without BASELINE, RUN is compared with the last earlier complete run of the same configuration (same probe,
    parameters, threads, CPUs, environment and label) on its machine. Runs whose measurements differ exit 2
    naming the difference (--anyway compares them, never with the gate). Exits 3 when RUN's tail is worse beyond
    the runs' own spread (see --gate)."""
    if len(runs) > 2:
        raise InputError(f"give at most BASELINE and RUN ({len(runs)} arguments given)")
    store = reading_store(results)
    other = _one(runs[-1], store)
    base_run = _one(runs[0], store) if len(runs) == 2 else _previous(other, store)
    differences = _comparable(base_run, other, anyway, gate)
    same = not differences and identity_key(base_run.identity) == identity_key(other.identity)
    gated = (same if gate is None else gate) and not differences
    quantity = other.quantity
    row = isolation(other, base_run)
    cause = _caused_by(other)
    worst = outliers(other, top) if top else []
    base_histogram, histogram = base_run.histogram(), other.histogram()
    test = tail_test(base_histogram, histogram, level=level, alpha=alpha, min_ratio=min_ratio,
                     lower=not quantity.larger_is_worse) \
        if base_histogram is not None and histogram is not None and base_histogram.n and histogram.n else None
    if as_json:
        document: dict[str, Any] = {"isolation": {**asdict(row), "caused_by": cause},
                                    "outliers": [asdict(o) for o in worst],
                                    "baseline_run": base_run.run_id, "run": other.run_id,
                                    "comparable": not differences, "differences": differences,
                                    "same_configuration": same, "gated": gated,
                                    "tail": test.as_dict() if test else None}
        print_json(document)
    else:
        _print(row, cause, worst, test, base_run, other, differences)
    if test is not None and test.regression and gated:
        side = "above" if test.tail == "upper" else "below"
        raise VerdictFailed(f"{other.run_id}: tail regression against {base_run.run_id} "
                            f"({test.above} of {test.samples} samples {side} {quantity.show(test.threshold_ns)} "
                            f"{quantity.shown_unit}, {test.rate_ratio:.1f}x the baseline's rate, "
                            f"p = {test.p_value:.2g})")


def _comparable(base_run: StoredRun, other: StoredRun, anyway: bool, gate: bool | None) -> list[str]:
    """What makes the two runs' measurements differ ([]: comparable); exit 2 when they do and the user did not
    ask to compare them anyway, or asks for the gate on them, and always for values in different units."""
    if base_run.quantity.unit != other.quantity.unit:
        raise InputError(f"{base_run.run_id} holds {base_run.quantity.title}, {other.run_id} "
                         f"{other.quantity.title}: values in different units are not compared")
    differences = measurement_differences(base_run.identity, other.identity)
    if differences and not anyway:
        raise InputError(f"{base_run.run_id} and {other.run_id} are not comparable: {'; '.join(differences)} "
                         "(--anyway compares them all the same, without the regression gate)")
    if differences and gate:
        raise InputError(f"option --gate: {base_run.run_id} and {other.run_id} are not comparable "
                         f"({'; '.join(differences)}): a difference between them is no regression")
    return differences


def _caused_by(run: StoredRun) -> str:
    """What caused most of the run's outlier latency, when it was explained (docs/explain.md)."""
    from ..results.explained import caused_by, configuration_causes, load_explanation

    explanation = load_explanation(run.path)
    return caused_by(configuration_causes([explanation] if explanation else []))


def _print(row: Any, cause: str, worst: list[Any], test: TailTest | None, base_run: StoredRun, other: StoredRun,
           differences: list[str]) -> None:
    quantity: Quantity = other.quantity
    unit = quantity.shown_unit
    largest = "WCET" if quantity.larger_is_worse else "max"
    if differences:
        console.print(f"not comparable, compared anyway (--anyway): {'; '.join(differences)}", markup=False,
                      highlight=False)
    elif setting := setting_differences(base_run.identity, other.identity):
        console.print(f"the same measurement in another setting: {'; '.join(setting)}", markup=False,
                      highlight=False)
    table = Table(title=f"{row.label} against {row.baseline}: {quantity.title}", title_justify="left")
    for column in ("mean increase", "median increase", "p99 increase", f"{largest} {unit}",
                   f"baseline {largest} {unit}", f"{largest} ratio"):
        table.add_column(column, justify="right")
    table.add_column("caused by")
    table.add_row(f"{row.mean_increase_pct:+.1f} %", f"{row.median_increase_pct:+.1f} %",
                  f"{row.p99_increase_pct:+.1f} %", quantity.show(row.wcet_ns), quantity.show(row.baseline_wcet_ns),
                  f"{row.wcet_ratio:.2f}", escape(cause))
    console.print(table)
    if test is not None:
        table = Table(title=f"tail test: {other.run_id} against {base_run.run_id}", title_justify="left")
        side = "above" if test.tail == "upper" else "below"
        level = test.level if test.tail == "upper" else 1 - test.level
        for column in (f"threshold {unit}", f"baseline {side}", f"run {side}", "rate ratio", "p", "verdict"):
            table.add_column(column, justify="right")
        verdict = "[red]regression[/]" if test.regression else "within the runs' spread"
        table.add_row(f"{quantity.show(test.threshold_ns)} (p{level * 100:g})",
                      f"{test.baseline_above} / {test.baseline_samples}", f"{test.above} / {test.samples}",
                      f"{test.rate_ratio:.2f}", f"{test.p_value:.2g}", verdict)
        console.print(table)
    if worst:
        table = Table(title="outliers" if quantity.larger_is_worse else "largest values", title_justify="left")
        for column in ("time s", "cpu", f"value {unit}", f"median {unit}", "value cycles", "median cycles"):
            table.add_column(column, justify="right")
        for o in worst:
            table.add_row(f"{o.t_ns / 1e9:.3f}", str(o.cpu), quantity.show(o.value_ns), quantity.show(o.median_ns),
                          "-" if o.value_cycles is None else f"{o.value_cycles:,.0f}",
                          "-" if o.median_cycles is None else f"{o.median_cycles:,.0f}")
        console.print(table)
