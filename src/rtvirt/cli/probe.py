"""``rtvirt probe NAME``: one subcommand per registered probe, options generated from its parameters."""

from __future__ import annotations

import contextlib
from typing import Any

import click
from rich.progress import Progress as RichProgress

from ..errors import InputError, Interrupted, RunError
from ..params import build_params, click_options
from ..probes import PROBES, ProbeSpec
from ..probes.runner import Progress, run_probe
from ..quantity import quantity_of
from ..stats import summarize_stream
from ..store import RunDir, new_run, write_measured_run
from .output import console, err_console, plural, print_json, progress_bar, summary_table
from .resultopts import results_option, store_for_writing
from .targetopts import pop_target, target_options

__all__ = ["probe"]


@click.group()
def probe() -> None:
    """Run one measurement probe; every sample is kept in the results store."""


def _progress_display(option: bool | None, name: str) -> tuple[RichProgress | None, Any]:
    bar = progress_bar(name, option)
    return (None, None) if bar is None else (bar, bar.add_task(name, total=None, status=""))


def _make_command(spec: ProbeSpec) -> click.Command:
    @click.command(name=spec.name, help=f"{spec.summary}.\n\n{spec.doc}".strip())
    @click_options(spec.params)
    @results_option("results store the run is written to")
    @click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
    @click.option("--progress/--no-progress", default=None, help="progress bar [default: when on a terminal]")
    @click.option("--explain", is_flag=True, help="trace the measured CPUs beside the probe and store a cause for "
                  "each outlier (`rtvirt explain RUN`; docs/explain.md)")
    @click.option("--explain-threshold", metavar="TIME", default=None, help="with --explain: the outliers are the "
                  "samples above this (bare numbers in us) [default: the larger of p99.9 and 20 us]")
    @click.option("--explain-top", metavar="N", type=int, default=None, help="with --explain: explain at most the N "
                  "largest outliers [default: 100]")
    @target_options
    def command(results: str, as_json: bool, progress: bool | None, explain: bool, explain_threshold: str | None,
                explain_top: int | None,
                **values: Any) -> None:
        target = pop_target(values)
        params = build_params(spec.params, values)
        run = new_run(store_for_writing(results).write_dir, spec.name)
        bar, task = _progress_display(progress, spec.name)

        quantity = quantity_of(spec.value_field)

        def show(p: Progress) -> None:
            assert bar is not None
            peak = "-" if p.running_max is None else f"{quantity.show(p.running_max)} {quantity.shown_unit}"
            bar.update(task, total=p.duration_s, completed=p.elapsed_s if p.duration_s else None,
                       status=f"{p.samples} samples, max {peak}")

        extra: dict[str, Any] = {}
        agent_pids: list[int] = []
        with contextlib.ExitStack() as resources:
            explaining = explain_session(params, target, explain_threshold, explain_top, resources) \
                if explain or explain_threshold or explain_top is not None else None
            stream = _measure_and_explain(spec, params, run, target, show if bar is not None else None, bar,
                                          explaining, agent_pids, extra)
        manifest = write_measured_run(run, stream, name=spec.name, params=params.model_dump(mode="json"),
                                      group_by=spec.group_by, extra=extra or None)
        if as_json:
            print_json({k: manifest[k] for k in ("run_id", "probe", "status", "end_reason", "dropped", "summary",
                                                 "quantity", "unit")}
                       | {"path": str(run.path)})
        else:
            summaries = summarize_stream(stream, spec.group_by)
            console.print(summary_table(f"{spec.name}: {spec.summary}", summaries, stream.value_field))
            state = "" if manifest["status"] == "complete" else f" [yellow]({manifest['status']}: " \
                f"{manifest['end_reason']})[/]"
            console.print(f"run {run.run_id} written to {run.path}{state}")
            if "explain" in extra:
                console.print(explain_line(extra["explain"], run.run_id, results), markup=False, highlight=False)
        if extra.get("target", {}).get("connection") == "lost":
            err_console.print(f"the connection to {target.label} was lost mid-run: the samples received are kept; "
                              f"{extra['target']['recovered']}", markup=False, highlight=False)
        if stream.error:
            raise RunError(f"{stream.error} (the samples taken are kept in {run.path})")
        # the same status as an interrupted run or experiment; a target's agent also ends by a signal when its SSH
        # session is cut, which is a lost connection (said above; the run is kept, partial), not an interruption
        lost = extra.get("target", {}).get("connection") == "lost"
        if manifest.get("end_reason") == "signal" and not lost:
            raise Interrupted(f"interrupted (Ctrl-C or SIGTERM): the samples taken are kept in {run.path}")

    return command


def _measure_and_explain(spec: ProbeSpec, params: Any, run: RunDir, target: Any, show: Any, bar: Any,
                         explaining: Any, agent_pids: list[int], extra: dict[str, Any]) -> Any:
    """Run the probe here or on ``target`` (traced beside it when ``explaining``) and explain its outliers."""
    def measure() -> Any:
        if target is None:
            return run_probe(spec, params, run.stream_path, show, on_launch=agent_pids.append)
        from ..remote.probe import run_probe_on_target

        stream, extra["target"] = run_probe_on_target(spec, params, run.stream_path, target, on_progress=show,
                                                      on_launch=agent_pids.append)
        return stream

    try:
        if explaining is not None:
            explaining.start(run.stream_path)
        if bar is not None:
            with bar:
                stream = measure()
        else:
            stream = measure()
    finally:
        if explaining is not None:
            explaining.stop()
    if stream.error:
        extra["error"] = stream.error
    if explaining is not None and stream.records.size:
        extra["explain"] = explaining.explain_into(run.path, stream, agent_pids)
    return stream


def explain_line(entry: dict[str, Any], run_id: str, results: str = "results") -> str:
    """One line on the stored explanation (or why there is none), ending with the command that shows it: with
    the ``--results`` the probe wrote to, unless that is the default or RTVIRT_RESULTS, which explain reads too."""
    import os
    import shlex

    if "error" in entry:
        return f"not explained: {entry['error']}"
    top = entry["top_causes"][0] if entry["top_causes"] else None
    cause = f"; first culprit {top['cause']} ({top['share']:.0%})" if top else ""
    counts = entry.get("headline")
    split = (f" ({counts['traced']} by a traced layer, {counts['held']} held back by a layer not traced, "
             f"{counts['unexplained']} unexplained)") if counts else ""
    shown = results
    if "://" in results:  # a store's URL as every message shows it: the password is never printed
        from ..stores.postgres import redact_url

        shown = redact_url(results)
    where = "" if results in ("results", os.environ.get("RTVIRT_RESULTS")) else f" --results {shlex.quote(shown)}"
    return f"{plural(entry['outliers'], 'outlier')}, {entry['explained']} explained{split}{cause}: " \
           f"rtvirt explain {run_id}{where}"


def explain_session(params: Any, target: Any, threshold: str | None, top: int | None,
                    resources: contextlib.ExitStack) -> Any:
    """The tracing beside a one-off probe: the measured CPUs (all allowed ones when not pinned) of this host, or
    of ``target`` through a connection of its own (closed with ``resources``)."""
    import os

    from pydantic import ValidationError

    from ..explain.config import ExplainConfig
    from ..explain.sources import host_sources, session_for_sources

    try:
        config = ExplainConfig.model_validate({"threshold": threshold, **({"top": top} if top is not None else {})})
    except ValidationError as exc:
        error = exc.errors()[0]
        option = "--explain-top" if error["loc"] and error["loc"][0] == "top" else "--explain-threshold"
        raise InputError(f"option {option}: {error['msg']}") from None
    if target is None:
        cpus = tuple(params.affinity) if params.affinity else tuple(sorted(os.sched_getaffinity(0)))
        return session_for_sources(config, host_sources(cpus, config), "host")
    from ..explain.remote import RemoteTracefs
    from ..remote.connection import connect
    from ..remote.system import RemoteSystem

    connection = connect(target)
    resources.callback(connection.close)
    cpus = tuple(params.affinity) if params.affinity else tuple(RemoteSystem(connection).cpus())
    return session_for_sources(config, host_sources(cpus, config, RemoteTracefs(connection, target.label)),
                               f"target {target.label}")


for _spec in PROBES.values():
    probe.add_command(_make_command(_spec))
