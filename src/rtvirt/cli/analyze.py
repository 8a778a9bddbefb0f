"""``rtvirt analyze MODEL.toml``: worst-case bounds for every guest task and event chain (docs/analysis.md)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..analysis.automotive_sweep import RuleSweep, automotive_sweep
from ..analysis.record import write_analysis_run
from ..analysis.system import SystemAnalysis, analyse_model
from ..errors import InputError, VerdictFailed
from ..model import load_model, parse_assignment, parse_sweep
from .output import console, print_json
from .resultopts import results_option, store_for_writing

__all__ = ["analyze", "supply_text", "tasks_table"]


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.3f}"


def supply_text(description: dict | None) -> str:
    if description is None:
        return "none"
    model = description["model"]
    if model == "edp":
        text = (f"EDP P={_us(description['period_ns'])} Q={_us(description['budget_ns'])} "
                f"D={_us(description['deadline_ns'])} us")
    elif model == "arinc653-windows":
        text = f"windows {len(description['windows_ns'])} in frame {_us(description['frame_ns'])} us"
    elif model == "leftover":
        text = f"leftover below {len(description['higher'])} higher tasks"
    else:
        text = model
    if "initial_wait_ns" in description:
        text += f" after {_us(description['initial_wait_ns'])} us"
    return text


def tasks_table(analysis: SystemAnalysis) -> Table:
    table = Table(title=f"{analysis.model}: guest tasks under {analysis.scheduler} (bounds in us)",
                  title_justify="left")
    for column in ("vm", "task", "vCPU", "method", "bound", "deadline", "slack", "verdict"):
        table.add_column(column, justify="right" if column in ("bound", "deadline", "slack") else "left")
    for task in analysis.tasks:
        if task.wcrt is None:
            verdict = f"[red]no bound[/]: {task.reason}"
        elif task.schedulable:
            verdict = "[green]meets[/]" if task.deadline is not None else "bounded"
        else:
            verdict = f"[red]misses by {_us(-(task.slack or 0))} us[/]"
        table.add_row(task.vm, task.task, str(task.vcpu), task.method, _us(task.wcrt), _us(task.deadline),
                      _us(task.slack), verdict)
    return table


def _chains_table(analysis: SystemAnalysis) -> Table:
    table = Table(title="event chains, end to end (us)", title_justify="left")
    for column in ("chain", "stages", "bound", "deadline", "verdict"):
        table.add_column(column, justify="right" if column in ("bound", "deadline") else "left")
    for chain in analysis.chains:
        if chain.schedulable:
            verdict = "[green]meets[/]"
        else:
            verdict = "[red]no bound[/]" if chain.bound is None else \
                f"[red]misses by {_us(chain.bound - chain.deadline)}[/]"
        table.add_row(chain.name, " → ".join(chain.stages), _us(chain.bound), _us(chain.deadline), verdict)
    return table


def _supply_table(analysis: SystemAnalysis) -> Table:
    table = Table(title="vCPU supply", title_justify="left")
    for column in ("vCPU", "pCPU", "supply bound", "rate", "note"):
        table.add_column(column)
    for supply in analysis.supplies.values():
        table.add_row(str(supply.ref), "-" if supply.cpu is None else str(supply.cpu),
                      supply_text(None if supply.supply is None else supply.supply.describe()),
                      "-" if supply.supply is None else f"{float(supply.supply.rate):.4f}", supply.reason)
    return table


def _rules_table(analysis: SystemAnalysis) -> Table:
    assert analysis.automotive is not None
    table = Table(title="automotive configuration rules (Masrur et al. 2010), times in us", title_justify="left")
    for column in ("rule", "s_N / p_N", "s_i / p_i", "worst case", "deadline", "RT-core util", "non-RT room",
                   "verdict"):
        table.add_column(column)
    for result in analysis.automotive.values():
        names = list(result.slices)
        worst = max(result.worst_case[n] for n in names)
        table.add_row(result.rule, f"{_us(result.driver_slice)} / {_us(result.driver_period)}",
                      ", ".join(sorted({f"{_us(result.slices[n])} / {_us(result.periods[n])}" for n in names})),
                      _us(worst), _us(min(result.deadlines.values())), f"{result.rt_core_utilization:.3f}",
                      f"{result.nonrt_load_room:.0%}",
                      "[green]meets every deadline[/]" if result.meets_every_deadline else "[red]fails[/]")
    return table


def _simulated_cell(entry: dict) -> str:
    misses = "[green]0[/]" if not entry["misses"] else f"[red]{entry['misses']}[/]"
    served = entry["nonrt_served"]
    share = f" / {max(served.values()):.0%}" if served else ""
    return f"{_us(entry['worst_chain_ns'])} / {misses}{share}"


def _sweep_table(key: str, rows: list[RuleSweep]) -> Table:
    table = Table(title=f"automotive rules vs simulated sweep of {key} (us; per value: simulated worst chain / "
                  "misses / CPU share the non-RT vCPU got)", title_justify="left")
    for column in ("rule", "s_N / p_N", "s_i / p_i", "rule worst case", "analysed bound"):
        table.add_column(column)
    for entry in rows[0].simulated if rows else []:
        table.add_column(f"{key.rsplit('.', 1)[-1]}={entry['value']}", justify="right")
    for row in rows:
        rule = row.rule
        periods = sorted({f"{_us(rule.slices[n])} / {_us(rule.periods[n])}" for n in rule.slices})
        scope = " (stage)" if rule.rule == "psedf" else " (e2e)"
        table.add_row(rule.rule, f"{_us(rule.driver_slice)} / {_us(rule.driver_period)}", ", ".join(periods),
                      _us(row.rule_worst_case) + scope, _us(row.analysed_bound),
                      *(_simulated_cell(entry) for entry in row.simulated))
    return table


@click.command("analyze")
@click.argument("model_path", metavar="MODEL.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="override a model field, e.g. vm.nonrt.load=0.5 (repeatable)")
@results_option("results store the analysis record is written to")
@click.option("--sweep", metavar="KEY=V1,V2,...",
              help="automotive models: simulate each rule's configuration per value, e.g. vm.nonrt.load=0,0.45,0.9")
@click.option("--json", "as_json", is_flag=True, help="print the analysis as JSON")
@click.option("--strict", is_flag=True, help="exit with status 3 when a task or chain may miss its deadline")
@click.option("--workers", type=click.IntRange(1, 1024), help="--sweep: simulate on this many local worker "
              "processes [default: one after the other in this process]")
@click.option("--cluster", "--dask", "cluster", metavar="ADDRESS",
              help="--sweep: simulate on an existing Dask cluster (tcp://HOST:8786 or a scheduler file)")
def analyze(model_path: Path, assignments: tuple[str, ...], results: str, sweep: str | None, as_json: bool,
            strict: bool, workers: int | None, cluster: str | None) -> None:
    """Worst-case response-time bounds for MODEL.toml (docs/analysis.md).

    An unschedulable system is an answer, not an error: the exit status is 0 and the tables say which task
    misses and by how much (--strict turns that into exit status 3). An invalid model exits with 2.
    """
    overrides = [parse_assignment(a, "--set") for a in assignments]
    model = load_model(model_path, overrides)
    analysis = analyse_model(model)
    extra = {}
    rows: list[RuleSweep] = []
    if sweep is not None:
        key, values = parse_sweep(sweep)
        if workers is None and cluster is None:
            rows = automotive_sweep(model_path, key, values, overrides)
        else:
            from ..experiment.executors import open_pool, pool_map

            pool = open_pool(cluster, workers)
            try:
                rows = automotive_sweep(model_path, key, values, overrides,
                                        map_calls=lambda fn, calls: pool_map(pool, fn, calls))
            finally:
                pool.close()
        if not rows:
            raise InputError("option --sweep: the model has no event chains driver → RT domain (→ driver) "
                             "to derive the automotive rules from")
        extra["automotive_sweep"] = {"key": key, "values": values, "rules": [row.as_dict() for row in rows]}
    target = store_for_writing(results).write_dir
    run, _ = write_analysis_run(analysis, target, model_path=str(model_path), extra=extra)
    if as_json:
        print_json({"run_id": run.run_id, "path": str(run.path), **analysis.as_dict(), **extra})
    else:
        console.print(_supply_table(analysis))
        console.print(tasks_table(analysis))
        if analysis.chains:
            console.print(_chains_table(analysis))
        if analysis.automotive:
            console.print(_rules_table(analysis))
        if rows:
            console.print(_sweep_table(key, rows))
        verdict = "[green]every deadline is met[/]" if analysis.schedulable else "[red]deadlines may be missed[/]"
        console.print(f"{verdict}; analysis {run.run_id} written to {run.path}")
    if strict and not analysis.schedulable:
        raise VerdictFailed(f"model {model_path}: not every deadline is guaranteed")
