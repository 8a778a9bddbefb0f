"""``rtvirt trend CONFIG``: a metric of one configuration over time, per machine, each change of kernel,
hypervisor or scenario marked (the long-term view of a latency farm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from ..results.history import METRICS, metric_name
from .output import console, err_console, print_json
from .resultopts import reading_store, results_option

__all__ = ["trend"]


def _short(value: str | None) -> str:
    """Hashes by their first 12 digits, as git shows commits."""
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def _known_configurations(store: Any, config: str) -> str:
    """What CONFIG could have been: the closest label (`host/solo` for `host / solo`) and the labels there are."""
    import difflib

    from ..results.history import configuration

    known = sorted({configuration(row) for row in store.rows()})
    if not known:
        return " (it holds no runs)"
    squeezed = {label.replace(" ", ""): label for label in known}
    close = [squeezed[config.replace(" ", "")]] if config.replace(" ", "") in squeezed else \
        difflib.get_close_matches(config, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
    return f"{hint} (configurations: {listed})"


@click.command()
@click.argument("config")
@results_option("results store")
@click.option("--metric", type=click.Choice([*METRICS, *(f"{m}_ns" for m in METRICS if m != "class")]),
              default="max", show_default=True, help="what is followed: a statistic in the runs' unit, or the "
              "strictest requirement class met (class; latencies only); max_ns ... are the old names of max ...")
@click.option("--machine", help="only this machine [default: every machine, each its own series]")
@click.option("--classes", "classes_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file of requirement classes for --metric class [default: the built-in classes]")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="also draw it into this PNG file")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def trend(config: str, results: str, metric: str, machine: str | None, classes_file: Path | None,
          plot: Path | None, as_json: bool) -> None:
    """CONFIG's METRIC in every run over time, per machine, with each change of kernel, preemption, command
    line, hypervisor (version), guest kernel, scenario content or rtvirt version marked."""
    from ..results.history import trend as history
    from ..results.verdicts import load_classes

    metric = metric_name(metric)
    classes = load_classes(classes_file) if metric == "class" else None
    store = reading_store(results)
    found = history(store, config, metric, machine, classes=classes)
    if not found.machines:
        raise InputError(f"{config}: no runs of this configuration"
                         + (f" on machine {machine!r}" if machine else "") + f" in {store.label}"
                         + _known_configurations(store, config))
    if plot is not None:
        if metric == "class":
            raise InputError("option --plot: draws statistics; --metric class is a table only")
        from ..fileio import write_atomically
        from ..results.figures import trend_chart

        write_atomically(plot, trend_chart(found))
        err_console.print(f"plot written to {plot}", markup=False)
    if as_json:
        print_json(found.as_dict())
        return
    shown = found.quantity
    for name, points in found.machines.items():
        table = Table(title=f"{escape(config)} on {escape(name)}: {metric}", title_justify="left")
        for column in ("created", "run", metric + (f" {shown.shown_unit}" if metric != "class" else ""),
                       "status", "changed"):
            table.add_column(column)
        for p in points:
            value = "-" if p.value is None else p.value if isinstance(p.value, str) else shown.show(p.value)
            change = "; ".join(f"{column}: {_short(before)} → {_short(after)}"
                               for column, (before, after) in p.changes.items())
            table.add_row(p.created[:19], p.run_id, value, p.status or "-",
                          escape(f"◆ {change}"[:300]) if change else "")
        console.print(table)
