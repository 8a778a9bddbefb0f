"""``rtvirt sim MODEL.toml``: simulate a hierarchical scheduling model and store the run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import click
from rich.table import Table

from ..errors import InputError
from ..model import Model, load_model, parse_assignment, parse_sweep
from ..sim import simulate_to_store, write_gantt
from ..units import format_duration, parse_duration
from .output import console, print_json, us
from .resultopts import results_option, store_for_writing

__all__ = ["sim"]

_GANTT_DEFAULT_SPAN = 50_000_000


def _time(value: str | None, option: str, unit: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_duration(value, unit)
    except ValueError as exc:
        raise InputError(f"option {option}: {exc}") from None


def _task_table(title: str, summary: dict[str, Any]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("task / chain", "jobs", "mean us", "max us", "misses"):
        table.add_column(column, justify="left" if column == "task / chain" else "right")
    rows = list(summary["tasks"].items()) + [(f"chain {k}", v) for k, v in summary["chains"].items()]
    for name, s in rows:
        table.add_row(name, str(s["jobs"]), us(s["mean_response_ns"] if s["mean_response_ns"] is not None
                                                else float("nan")),
                      us(s["max_response_ns"] if s["max_response_ns"] is not None else float("nan")),
                      str(s["misses"]))
    for name, g in summary["gaps"].items():
        table.add_row(f"gap {name}", str(g["gaps"]), "-", us(g["max_gap_ns"] if g["max_gap_ns"] is not None
                                                                else float("nan")), "-")
    return table


@click.command("sim")
@click.argument("model_path", metavar="MODEL.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-D", "--duration", metavar="TIME", help="simulated time (bare numbers in s) [default: the model's]")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), help="random seed [default: the model's]")
@results_option("results store the run is written to")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
@click.option("--gantt", type=click.Path(dir_okay=False, path_type=Path), help="write a Gantt chart (SVG) here")
@click.option("--from", "gantt_from", metavar="TIME", help="Gantt window start (bare numbers in ms) [default: 0]")
@click.option("--to", "gantt_to", metavar="TIME", help="Gantt window end (bare numbers in ms) [default: start+50ms]")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="override a model field, e.g. vm.nonrt.load=0.5 (repeatable)")
@click.option("--sweep", metavar="KEY=V1,V2,...", help="one run per value, e.g. vm.nonrt.load=0,0.3,0.6,0.9")
@click.option("--workers", type=click.IntRange(1, 1024), help="--sweep: simulate the values on a local Dask cluster of "
              "this many worker processes (Ctrl-C waits for the submitted runs) [default: one after the other]")
@click.option("--cluster", "--dask", "cluster", metavar="ADDRESS|FILE",
              help="--sweep: simulate the values on an existing Dask cluster (tcp://HOST:8786 or a scheduler file); "
              "each result comes back and this process writes its run")
def sim(model_path: Path, duration: str | None, seed: int | None, results: str, as_json: bool,
        gantt: Path | None, gantt_from: str | None, gantt_to: str | None, assignments: tuple[str, ...],
        sweep: str | None, workers: int | None, cluster: str | None) -> None:
    """Simulate MODEL.toml (docs/model.md); every job, event and gap is kept in the results store."""
    duration_ns = _time(duration, "--duration", "s")
    if duration_ns == 0:
        raise InputError("option --duration: must be larger than 0")
    start = _time(gantt_from, "--from", "ms") or 0
    end = _time(gantt_to, "--to", "ms")
    end = end if end is not None else start + _GANTT_DEFAULT_SPAN
    if gantt is not None and end <= start:
        raise InputError("option --to: the Gantt window ends before it starts")
    overrides = [parse_assignment(a, "--set") for a in assignments]
    key, values = parse_sweep(sweep) if sweep else (None, [None])
    target = store_for_writing(results).write_dir
    models = [load_model(model_path, overrides + ([(key, value)] if key is not None else [])) for value in values]
    runs = []
    for value, model in zip(values, models, strict=True):
        params = {"model": str(model_path), "set": list(assignments),
                  "duration_ns": duration_ns if duration_ns is not None else model.simulation.duration,
                  "seed": seed if seed is not None else model.simulation.seed}
        if key is not None:
            params["sweep"] = {key: value}
        label = " ".join([model.name, *assignments, *([f"{key}={value}"] if key is not None else [])])
        runs.append(_Run(model, params, label))
    pooled = _simulate_in_pool(runs, target, str(model_path), duration_ns, seed, cluster, workers) \
        if key is not None and (cluster is not None or workers is not None) else None
    window = (start, end) if gantt is not None and key is None else None
    documents = []
    for value, run in zip(values, runs, strict=True):
        if pooled is not None:
            end_reason, run_id, run_path, summary = next(pooled)
        else:
            result, stored, summary = simulate_to_store(
                run.model, target, model_path=str(model_path), params=run.params, label=run.label,
                duration_ns=duration_ns, seed=seed, gantt=window)
            end_reason, run_id, run_path = result.end_reason, stored.run_id, str(stored.path)
            if gantt is not None and window is not None:
                write_gantt(result, gantt, *window)
        documents.append({"run_id": run_id, "path": run_path, **({"sweep": {key: value}} if key else {}),
                          **summary})
        if not as_json:
            _print_run(run.model, key, value, summary, run_id, run_path, end_reason)
        if end_reason == "interrupted":  # like an interrupted probe: keep what ran, stop the sweep
            break
    if as_json:
        print_json(documents[0] if key is None else {"sweep": key, "runs": documents})
    elif key is not None:
        console.print(_sweep_table(key, documents))
    if window is not None and not as_json:
        console.print(f"Gantt chart written to {gantt}")


class _Run(NamedTuple):
    """One simulation of the command: the model with its --set and sweep value applied, as the store records it."""

    model: Model
    params: dict[str, Any]
    label: str


def _simulate_in_pool(runs: list[_Run], target: Path, model_path: str, duration_ns: int | None, seed: int | None,
                      cluster: str | None, workers: int | None) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """A sweep's runs simulated on a Dask cluster (``cluster``: each result comes back and this process writes
    its run) or on ``workers`` local processes (each writes its own): (end reason, run id, path, summary) each,
    in the sweep's order."""
    from ..experiment.executors import open_pool

    pool = open_pool(cluster, workers)  # (a cluster's own workers, when one is given)
    try:
        if cluster is None:
            from ..experiment.executors import pool_map
            from ..sim.results import simulate_to_store_summary

            return iter(pool_map(pool, simulate_to_store_summary, [
                (run.model, target, model_path, run.params, duration_ns, seed, run.label) for run in runs]))
        from ..sim.results import simulate_for_driver, write_simulated_run

        futures = [pool.submit(simulate_for_driver, run.model, duration_ns, seed) for run in runs]
        written = []
        for future, run in zip(futures, runs, strict=True):
            result = future.result()  # one result in memory at a time; the others wait on their workers
            stored, summary = write_simulated_run(result, target, model_path=model_path, params=run.params,
                                                  label=run.label)
            written.append((result.end_reason, stored.run_id, str(stored.path), summary))
            del result
        return iter(written)
    finally:
        pool.close()


def _print_run(model: Model, key: str | None, value: Any, summary: dict[str, Any], run_id: str, run_path: str,
               end_reason: str) -> None:
    """One run's task table and where it was written, saying why a partial run stopped."""
    title = f"sim {model.name} ({model.hypervisor.scheduler})" + (f", {key} = {value}" if key else "")
    console.print(_task_table(title, summary))
    reached = format_duration(summary["simulated_ns"])
    state = {"complete": "",
             "event-cap": f" [yellow](partial: stopped by the event cap (simulation.event_cap = "
                          f"{model.simulation.event_cap}) at {reached} simulated)[/]",
             "interrupted": f" [yellow](partial: interrupted at {reached} simulated)[/]"}[end_reason]
    console.print(f"run {run_id} written to {run_path}{state}")


def _sweep_table(key: str, documents: list[dict[str, Any]]) -> Table:
    """A sweep's runs side by side: misses and worst response times per value."""
    table = Table(title=f"sweep {key}", title_justify="left")
    for column in ("value", "misses", "worst chain us", "worst task us", "run"):
        table.add_column(column)
    for doc in documents:
        worst_chain = max((c["max_response_ns"] or 0 for c in doc["chains"].values()), default=math.nan)
        worst_task = max((t["max_response_ns"] or 0 for t in doc["tasks"].values()), default=math.nan)
        table.add_row(str(doc["sweep"][key]), str(doc["misses"]), us(worst_chain), us(worst_task), doc["run_id"])
    return table
