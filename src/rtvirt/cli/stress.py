"""``rtvirt stress NAME``: one subcommand per registered stressor, options generated from its parameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ..errors import Interrupted
from ..params import build_params, click_options
from ..stressors import ENGINES, STRESSORS, StressorSpec, StressProgress, StressSummary, follow_stressor, run_stressor
from ..units import format_duration
from .output import console, print_json, progress_bar
from .targetopts import pop_target, target_options

if TYPE_CHECKING:  # asyncssh and the remote package load only when a target is used
    from ..remote.target import SshTarget

__all__ = ["stress"]


@click.group()
def stress() -> None:
    """Load the machine in a known way (our own stressors, or stress-ng with --engine stress-ng)."""


def _summary_table(summary: StressSummary) -> Table:
    table = Table(title=f"{summary.stressor} ({summary.engine}): {summary.end}, "
                        f"{format_duration(summary.elapsed_ns)}", title_justify="left")
    for column in ("part", "workers", "bogo ops", "bogo ops/s", "CPU time", "missed", "bytes"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part in summary.parts:
        table.add_row(part.name, str(part.workers), str(part.bogo_ops), f"{part.bogo_ops_per_s:.1f}",
                      "-" if part.cpu_time_ns is None else format_duration(part.cpu_time_ns),
                      "-" if part.missed is None else str(part.missed), "-" if not part.bytes else str(part.bytes))
    return table


def _run(spec: StressorSpec, params: Any, engine: str, target: SshTarget | None,
         on_progress: Callable[[StressProgress], None] | None = None) -> StressSummary:
    """Run the stressor here, or on ``target`` (the remote package and asyncssh load only then)."""
    if target is None:
        return run_stressor(spec, params, engine=engine, on_progress=on_progress)  # type: ignore[arg-type]
    from ..remote.stressor import start_on_target

    return follow_stressor(start_on_target(spec, params, engine, target), on_progress)


def _make_command(spec: StressorSpec) -> click.Command:
    @click.command(name=spec.name, help=f"{spec.summary}.\n\nRepresents: {spec.represents}.")
    @click_options(spec.params)
    @click.option("--engine", type=click.Choice(ENGINES), default="native", show_default=True,
                  help="our agent, or stress-ng with the same names and options (approximate, see docs)")
    @click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
    @click.option("--progress/--no-progress", default=None, help="progress bar [default: when on a terminal]")
    @target_options
    def command(engine: str, as_json: bool, progress: bool | None, **values: Any) -> None:
        target = pop_target(values)
        params = build_params(spec.params, values)
        bar = progress_bar(f"stress {spec.name}", progress, status=False)
        if bar is not None:
            task = bar.add_task(spec.name, total=None)

            def show(p: StressProgress) -> None:
                bar.update(task, total=p.duration_s, completed=p.elapsed_s if p.duration_s else None)

            with bar:
                summary = _run(spec, params, engine, target, show)
        else:
            summary = _run(spec, params, engine, target)
        if as_json:
            print_json(summary.model_dump(mode="json"))
        else:
            console.print(_summary_table(summary))
        if summary.end == "signal" and params.duration:  # cut short; with -D 0 a signal is the planned end
            raise Interrupted("interrupted (Ctrl-C or SIGTERM) before the end of --duration")

    return command


for _spec in STRESSORS.values():
    stress.add_command(_make_command(_spec))
