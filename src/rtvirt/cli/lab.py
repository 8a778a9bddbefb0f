"""``rtvirt lab INVENTORY.toml``: one probe, or a scenario's whole matrix, on every target of an inventory at
once; one report comparing them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_INTERRUPTED, InputError, RunError, first_validation_error
from ..probes import PROBES
from .output import console, err_console, print_json
from .resultopts import results_option, store_for_writing

__all__ = ["lab"]


@click.command("lab")
@click.argument("inventory", metavar="INVENTORY.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--probe", "probe_name", type=click.Choice(sorted(PROBES)), default="timer", show_default=True,
              help="the probe every target runs")
@click.option("--set", "assignments", multiple=True, metavar="PARAM=VALUE",
              help="a probe parameter, as in `rtvirt probe NAME --help` (e.g. interval=1ms; repeatable)")
@click.option("-D", "--duration", default="10s", show_default=True, metavar="TIME",
              help="run time on every target (bare numbers in s)")
@click.option("--scenario", metavar="NAME|FILE.toml",
              help="run this scenario's whole matrix on every target instead of one probe (its kind = \"ssh\" "
                   "environments measure each target in turn)")
@click.option("--scale", type=float, default=None, help="with --scenario: multiply every duration and event time")
@click.option("--resume", is_flag=True, help="with --scenario: each target continues its last unfinished campaign")
@results_option("results store: the targets' runs (and campaigns), reports/lab-*.html")
@click.option("--json", "as_json", is_flag=True, help="print each target's outcome and the report's path as JSON")
@click.pass_context
def lab(ctx: click.Context, inventory: Path, probe_name: str, assignments: tuple[str, ...], duration: str,
        scenario: str | None, scale: float | None, resume: bool, results: str, as_json: bool) -> None:
    """Run one probe, or a scenario's whole matrix, on every target of INVENTORY.toml at the same time
    (docs/targets.md).

    Each target's runs are stored on their own (labelled with the target's name; with --scenario, one
    campaign per target); one report compares them. A target that cannot be reached fails alone.
    """
    from ..campaign.lab import load_inventory

    target = store_for_writing(results).write_dir  # a shared store's spool: the lab's runs are delivered after
    if scenario is None:
        for option, name in (("--scale", "scale"), ("--resume", "resume")):
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
                raise InputError(f"option {option}: only with --scenario")
        _probe_lab(load_inventory(inventory), inventory.name, probe_name, assignments, duration, target, as_json)
        return
    for option, name in (("--probe", "probe_name"), ("--set", "assignments"), ("--duration", "duration")):
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
            raise InputError(f"option {option}: not with --scenario (the scenario says what runs)")
    _scenario_lab(load_inventory(inventory), inventory.name, scenario, scale, resume, target, as_json)


def _lab_report(results: Path, run_ids: set[str]) -> Path | None:
    """One HTML report comparing the targets' runs (None when no target was measured)."""
    if not run_ids:
        return None
    from ..results.report import write_report

    (results / "reports").mkdir(parents=True, exist_ok=True)
    return write_report(results, results / "reports" / f"lab-{time.strftime('%Y%m%dT%H%M%S')}.html", "html",
                        run_ids=run_ids)


def _probe_lab(inventory: Any, title: str, probe_name: str, assignments: tuple[str, ...], duration: str,
               results: Path, as_json: bool) -> None:
    from pydantic import ValidationError

    from ..campaign.lab import run_lab

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
    outcomes = run_lab(inventory, spec, params, results)
    run_ids = {o.run_id for o in outcomes if o.run_id}
    report = _lab_report(results, run_ids)
    if as_json:
        print_json({"targets": [vars(o) for o in outcomes], "report": str(report) if report else None})
    else:
        table = Table(title=f"lab {title}: {spec.name}", title_justify="left")
        for column in ("target", "status", "samples", "run", "note"):
            table.add_column(column)
        for o in outcomes:
            table.add_row(o.name, o.status, str(o.samples), o.run_id or "-", escape(o.reason[:120]))
        console.print(table)
        if report:
            console.print(f"report: {report}")
    if not run_ids:
        raise RunError("no target could be measured: " + "; ".join(f"{o.name}: {o.reason[:200]}" for o in outcomes))


def _scenario_lab(inventory: Any, title: str, scenario: str, scale: float | None, resume: bool, results: Path,
                  as_json: bool) -> None:
    from ..campaign.lab import run_lab_scenario
    from ..scenario import load_scenario

    if resume and scale is not None:
        raise InputError("option --scale: not with --resume (each target's campaign keeps the scale it started with)")
    factor = 1.0 if scale is None else scale
    if not 0 < factor <= 1000:
        raise InputError("option --scale: must be above 0 and at most 1000")
    parsed, text, source = load_scenario(scenario)
    outcomes = run_lab_scenario(inventory, text, source, results, scale=factor, resume=resume)
    report = _lab_report(results, {run_id for o in outcomes for run_id in o.run_ids})
    for o in outcomes:
        for what in o.reclaimed:
            err_console.print(f"reclaimed on {o.name}: {what[:300]}", markup=False, highlight=False)
    if as_json:
        print_json({"scenario": parsed.name, "targets": [{**vars(o), "status": o.status} for o in outcomes],
                    "report": str(report) if report else None})
    else:
        table = Table(title=f"lab {title}: scenario {parsed.name}", title_justify="left")
        for column in ("target", "status", "runs", "campaign", "note"):
            table.add_column(column)
        for o in outcomes:
            done = sum(1 for status in o.runs.values() if status == "complete")
            note = o.reason or "; ".join(f"{key}: {status}" for key, status in o.runs.items()
                                         if status not in ("complete", "skipped"))
            table.add_row(o.name, o.status, f"{done}/{len(o.runs)}", o.campaign_id or "-", escape(note[:120]))
        console.print(table)
        if report:
            console.print(f"report: {report}")
    if any(o.interrupted for o in outcomes):
        err_console.print(f"[yellow]interrupted[/]: continue with rtvirt lab INVENTORY --scenario {scenario} "
                          f"--resume --results {results}")
        sys.exit(EXIT_INTERRUPTED)
    if not any(o.run_ids for o in outcomes):
        raise RunError("no target could be measured: " + "; ".join(f"{o.name}: {o.reason[:200]}" for o in outcomes))
    if any(o.status != "complete" for o in outcomes):
        sys.exit(1)
