"""``rtvirt experiment FILE.toml|NAME``: a grid of design points × questions over random systems, on local worker
processes or a Dask cluster (docs/experiments.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..errors import EXIT_INTERRUPTED, InputError
from .output import console, err_console, print_json, progress_console, progress_wanted

__all__ = ["experiment"]


def _acceptance_table(summary: dict[str, Any]) -> Table:
    table = Table(title="acceptance ratio per utilisation (95 % CI)", title_justify="left")
    columns = sorted({(c["question"], c["scheduler"]) for c in summary["curves"]})
    table.add_column("point")
    table.add_column("U")
    for question, scheduler in columns:
        table.add_column(f"{question} {scheduler}", justify="right")
    table.add_column("best")
    best = {d["point"]: d for d in summary["dominance"] if d["question"] == "shared"}
    by_point: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    for c in summary["curves"]:
        by_point.setdefault(c["point"], {})[(c["question"], c["scheduler"])] = c
    for point, cells in sorted(by_point.items()):
        first = next(iter(cells.values()))
        row = [str(point), f"{first['target_utilization']:g}"]
        for column in columns:
            c = cells.get(column)
            row.append("-" if c is None else f"{c['acceptance']:.2f} [{c['acceptance_low']:.2f}, "
                       f"{c['acceptance_high']:.2f}] n={c['systems']}")
        row.append(best[point]["best"] if point in best else "-")
        table.add_row(*row)
    return table


@click.command("experiment")
@click.argument("spec", metavar="FILE.toml|NAME", required=False)
@click.option("--results", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="results directory the experiment's run is written to")
@click.option("--workers", type=click.IntRange(1, 1024), help="local worker processes [default: one per core]")
@click.option("--cluster", "--dask", "cluster", metavar="ADDRESS",
              help="run on an existing Dask cluster: scheduler address (tcp://HOST:8786) or scheduler file")
@click.option("--resume", is_flag=True, help="continue the latest interrupted run of this experiment in --results")
@click.option("--list", "list_builtins", is_flag=True, help="list the built-in experiments and exit")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr [default: if a terminal]")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def experiment(spec: str | None, results: Path, workers: int | None, cluster: str | None, resume: bool,
               list_builtins: bool, progress: bool | None, as_json: bool) -> None:
    """Run an experiment: every design point's random systems, every question, one record per system and
    question in the results store (query them with `rtvirt sql`: table experiment_records).

    Ctrl-C keeps every finished chunk of systems; --resume continues with what is missing.
    """
    from .. import experiment as lib

    if list_builtins:
        names = lib.builtin_names()
        if as_json:
            print_json({"experiments": names})
        else:
            for name in names:
                console.print(f"[bold]{name}[/]: {' '.join(lib.load(name).description.split())}\n")
        return
    if spec is None:
        raise InputError("argument FILE.toml|NAME: give an experiment file or a built-in name (--list)")
    plan = lib.load(spec)
    pool = lib.open_pool(cluster, workers)
    where = {"cluster": cluster} if cluster else {"workers": pool.workers}
    started = time.monotonic()
    try:
        run = lib.open_experiment_run(results, plan, resume, where)
        bar = _bar(len(plan.points())) if progress_wanted(progress) else None
        try:
            done = lib.run_experiment(plan, run, pool, on_progress=None if bar is None else bar[1])
        except KeyboardInterrupt:
            lib.finish_run(run, plan, False, where)
            err_console.print(f"interrupted: every finished chunk is kept in {run.path}; continue with --resume")
            raise SystemExit(EXIT_INTERRUPTED) from None
        finally:
            if bar is not None:
                bar[0].stop()
    finally:
        pool.close()
    elapsed = time.monotonic() - started
    lib.finish_run(run, plan, True, {**where, "elapsed_s": round(elapsed, 3)})
    summary = lib.summarize(lib.iter_records(run.path))
    (run.path / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    from ..experiment.figures import experiment_html

    (run.path / "experiment.html").write_text(experiment_html(plan.name, plan.description, plan.findings, summary))
    if as_json:
        print_json({"run_id": run.run_id, "path": str(run.path), "systems": done.systems_done,
                    "elapsed_s": elapsed, **summary})
        return
    console.print(_acceptance_table(summary))
    for sentence in summary["where"]:
        console.print(f"  {sentence}")
    console.print(f"{done.systems_done} systems in {elapsed:.1f} s; run {run.run_id} written to {run.path} "
                  f"(figures: {run.path / 'experiment.html'})")


def _bar(points: int) -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("design points"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[systems]}"
                   " systems"), TimeRemainingColumn(), console=progress_console())
    task = bar.add_task("points", total=points, systems=0)
    bar.start()

    def update(progress: Any) -> None:
        bar.update(task, completed=progress.points_done, systems=progress.systems_done)
    return bar, update
