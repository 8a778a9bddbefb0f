"""``rtvirt lab INVENTORY.toml``: one probe on every target of an inventory at once, one report comparing them."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from ..errors import InputError, RunError, first_validation_error
from ..probes import PROBES
from .output import console, print_json

__all__ = ["lab"]


@click.command("lab")
@click.argument("inventory", metavar="INVENTORY.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--probe", "probe_name", type=click.Choice(sorted(PROBES)), default="timer", show_default=True,
              help="the probe every target runs")
@click.option("--set", "assignments", multiple=True, metavar="PARAM=VALUE",
              help="a probe parameter, as in `rtvirt probe NAME --help` (e.g. interval=1ms; repeatable)")
@click.option("-D", "--duration", default="10s", show_default=True, metavar="TIME",
              help="run time on every target (bare numbers in s)")
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="results directory: one run per target, and reports/lab-*.html")
@click.option("--json", "as_json", is_flag=True, help="print each target's outcome and the report's path as JSON")
def lab(inventory: Path, probe_name: str, assignments: tuple[str, ...], duration: str, results: Path,
        as_json: bool) -> None:
    """Run one probe on every target of INVENTORY.toml at the same time (docs/targets.md).

    Each target's run is stored on its own (labelled with the target's name); one report compares them.
    A target that cannot be reached fails alone; the others are measured.
    """
    from pydantic import ValidationError

    from ..remote.lab import load_inventory, run_lab
    from ..results.report import write_report

    spec = PROBES[probe_name]
    values: dict[str, str] = {"duration": duration}
    for text in assignments:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InputError(f"option --set: {text!r} is not PARAM=VALUE (e.g. interval=1ms)")
        values[key.strip().replace("-", "_")] = value.strip()
    try:
        params = spec.params.model_validate(values)
    except ValidationError as exc:
        field, message = first_validation_error(exc)
        raise InputError(f"option --set/--duration: {field}: {message}") from None
    outcomes = run_lab(load_inventory(inventory), spec, params, results)
    run_ids = {o.run_id for o in outcomes if o.run_id}
    report = None
    if run_ids:
        (results / "reports").mkdir(parents=True, exist_ok=True)
        report = write_report(results, results / "reports" / f"lab-{time.strftime('%Y%m%dT%H%M%S')}.html", "html",
                              run_ids=run_ids)
    if as_json:
        print_json({"targets": [vars(o) for o in outcomes], "report": str(report) if report else None})
    else:
        table = Table(title=f"lab {inventory.name}: {spec.name}", title_justify="left")
        for column in ("target", "status", "samples", "run", "note"):
            table.add_column(column)
        for o in outcomes:
            table.add_row(o.name, o.status, str(o.samples), o.run_id or "-", escape(o.reason[:120]))
        console.print(table)
        if report:
            console.print(f"report: {report}")
    if not run_ids:
        raise RunError("no target could be measured: " + "; ".join(f"{o.name}: {o.reason[:200]}" for o in outcomes))
