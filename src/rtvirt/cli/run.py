"""``rtvirt run [NAME|FILE.toml]...``: run campaigns, write their reports, print the summaries."""

from __future__ import annotations

import importlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from ..campaign import CampaignState, find_resumable, run_campaign
from ..campaign.engine import CampaignResult, RunOutcome
from ..campaign.state import FINISHED
from ..environments import ENVIRONMENTS, SharedResources
from ..errors import EXIT_INTERRUPTED, InputError, RtvirtError
from ..quantity import run_quantity
from ..scenario import Scenario, load_scenario, parse_scenario
from ..store import load_run
from .output import console, err_console, plural, print_json, progress_wanted
from .resultopts import results_option, store_for_writing
from .serve import serving_beside, serving_options

if TYPE_CHECKING:
    from ..stores import RunStore

__all__ = ["run"]


def _fill_in_finished_runs(result: CampaignResult, store: RunStore) -> None:
    """Runs finished before a --resume come back without their manifest: read it from the store (a shared
    store's spool, else the store), so that the summary covers every run of the campaign."""
    for outcome in result.outcomes.values():
        if outcome.manifest is None and outcome.run_id:
            spooled = store.write_dir / "runs" / outcome.run_id
            try:
                found = store.find_run(outcome.run_id) if store.shared and not spooled.is_dir() else None
                outcome.manifest = found.manifest if found is not None else load_run(spooled).manifest
            except RtvirtError:  # deleted or damaged since: the table shows "-" and the status says what it was
                continue


def _overall(outcome: RunOutcome) -> dict[str, Any]:
    return ((outcome.manifest or {}).get("summary") or {}).get("all") or {}


def _summary_table(result: CampaignResult) -> Table:
    """One row per run, its statistics in its own unit (a campaign may mix latencies, durations and rounds)."""
    table = Table(title=f"campaign {result.state.campaign_id}", title_justify="left")
    for column in ("run", "status", "samples", "median", "p99", "max", "unit"):
        table.add_column(column, justify="right" if column in ("samples", "median", "p99", "max") else "left",
                         no_wrap=column == "run")
    for key, outcome in result.outcomes.items():
        summary = _overall(outcome)
        quantity = run_quantity(outcome.manifest or {})
        cells = [quantity.show(value if isinstance(value, int | float) else None)
                 for value in (summary.get("median_ns"), summary.get("p99_ns"), summary.get("max_ns"))]
        table.add_row(key, outcome.status, str(summary.get("samples", "-")), *cells,
                      quantity.shown_unit if summary.get("samples") else "-")
    return table


def _warnings(result: CampaignResult) -> list[str]:
    seen: dict[str, None] = {}
    for outcome in result.outcomes.values():
        for warning in ((outcome.manifest or {}).get("system") or {}).get("warnings") or []:
            seen.setdefault(str(warning)[:300])
    return list(seen)


def _print_reasons(result: CampaignResult) -> None:
    for key, outcome in result.outcomes.items():
        if outcome.status != "complete" and outcome.reason:
            reason = outcome.reason.removeprefix(outcome.status).strip()  # "interrupted (Ctrl-C ...)": said once
            console.print(f"{key}: {outcome.status}{' ' if reason.startswith('(') else ': '}{escape(reason)}",
                          highlight=False)


def _document(result: CampaignResult) -> dict[str, Any]:
    return {"campaign_id": result.state.campaign_id, "scenario": result.state.scenario,
            "interrupted": result.interrupted, "report": str(result.report) if result.report else None,
            "runs": {key: {"status": o.status, "reason": o.reason, "run_id": o.run_id, "summary": _overall(o) or None,
                           **(run_quantity(o.manifest).as_dict() if _overall(o) and o.manifest else {})}
                     for key, o in result.outcomes.items()},
            "warnings": _warnings(result)}


def _campaigns(names: tuple[str, ...], results: Path, scale: float | None, repetitions: int | None,
               resume: bool, as_json: bool) -> list[tuple[Scenario, CampaignState]]:
    """The campaigns to run, in order: resumed ones, or new ones made up front (so that an interrupted
    multi-scenario run resumes every one of them, also those that had not started)."""
    if resume:
        states = [find_resumable(results, load_scenario(name)[0].name) for name in names] if names else \
            [find_resumable(results, None)]
        for state in states:
            if scale is not None and not math.isclose(scale, state.scale):
                raise InputError(f"option --scale: the campaign being resumed ran at scale {state.scale}; "
                                 "leave --scale out or give the same value")
            if repetitions is not None and repetitions != state.repetitions:
                ran = state.repetitions if state.repetitions is not None else "the scenario's"
                raise InputError(f"option --repetitions: the campaign being resumed runs {ran} repetitions; leave "
                                 "--repetitions out or give the same value")
            if not as_json:
                finished = sum(1 for r in state.runs.values() if r.get("status") in FINISHED)
                console.print(f"resuming campaign {state.campaign_id}: {plural(finished, 'run')} already finished",
                              highlight=False)
        chosen = [(parse_scenario(state.scenario_text, state.source), state) for state in states]
    else:
        factor = 1.0 if scale is None else scale
        if not 0 < factor <= 1000:
            raise InputError("option --scale: must be above 0 and at most 1000")
        loaded = [load_scenario(name) for name in names or ("default",)]  # every file checked before any run
        chosen = []
        for parsed, text, source in loaded:
            state = CampaignState.create(results, parsed.name, text, source, factor)
            if repetitions is not None:
                state.repetitions = repetitions
                state.save()
            chosen.append((parsed, state))
    # like --scale, --repetitions is a property of the campaign, kept for --resume
    return [(parsed if state.repetitions is None else parsed.model_copy(update={"repetitions": state.repetitions}),
             state) for parsed, state in chosen]


SETUP_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "setup.sh"  # in a source checkout
# what the ARM labs need here beyond a kind's own part (scripts/setup.sh arm)
ARM_TOOLS = ("qemu-system-aarch64", "qemu-aarch64-static", "mmdebstrap", "aarch64-linux-gnu-gcc")


def _bring_kinds(scenarios: list[Scenario]) -> None:
    """Install what a kind beyond the main job's needs (libvirt, xen) on its first use: ``scripts/setup.sh KIND``,
    as root in a source checkout (`make run` installs the main job's only). Elsewhere the kind's available()
    says what to install, and its runs are refused with that reason."""
    kinds = {env.kind for scenario in scenarios for env in scenario.environments}
    parts = sorted({part for kind in kinds
                    if (part := ENVIRONMENTS[kind].setup_part) and ENVIRONMENTS[kind].available()}
                   | _foreign_part(scenarios))
    if not parts or os.geteuid() != 0 or not SETUP_SCRIPT.is_file():
        return
    err_console.print(f"rtvirt: first use of {', '.join(parts)} here: installing what it needs beyond the main job "
                      f"(scripts/setup.sh {' '.join(parts)}: its Debian packages and Python modules)", highlight=False)
    subprocess.run([str(SETUP_SCRIPT), *parts], env={**os.environ, "VENV": sys.prefix}, stdout=sys.stderr, check=False)
    importlib.invalidate_caches()  # a module installed just now (libvirt-python) is found by this process


def _foreign_part(scenarios: list[Scenario]) -> set[str]:
    """``arm`` when an environment's guests are of another architecture (``arch = "aarch64"``: the ARM labs) and
    what emulates and builds them is missing here."""
    from ..agents import native_arch

    foreign = {getattr(env, "arch", None) for scenario in scenarios for env in scenario.environments}
    if foreign - {None, native_arch()} and not all(shutil.which(tool) for tool in ARM_TOOLS):
        return {"arm"}
    return set()


def _measured_cpus(scenarios: list[Scenario]) -> set[int]:
    """The host CPUs the campaigns' pinned environments measure on (their ``cpus``, else the default one)."""
    from ..environments.base import default_measured_cpu

    return {cpu for scenario in scenarios for env in scenario.environments if getattr(env, "pin", True)
            for cpu in (getattr(env, "cpus", None) or (default_measured_cpu(),))}


def _live_delivery(store: RunStore, campaigns: list[tuple[Scenario, CampaignState]]) -> Any:
    """On a shared store: each campaign publishes its progress whenever it saves its state, and each run is
    delivered as it ends (its spool copy stays for the campaign's report). Returns the run-end hook, or None."""
    if not store.shared:
        return None
    import socket

    from ..live.publish import campaign_publisher

    def warn(message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {escape(message)}")

    publish = campaign_publisher(store, socket.gethostname(), warn)  # type: ignore[arg-type]
    for _, state in campaigns:
        state.on_save = publish
    unreachable: list[str] = []

    def deliver(outcome: RunOutcome) -> None:
        try:
            delivery = store.deliver(keep=True)
            problem, delivered = delivery.error or "", bool(delivery.delivered)
        except RtvirtError as exc:
            problem, delivered = str(exc), False
        if problem and not unreachable:  # said once; every run stays spooled and is delivered later
            unreachable.append(problem)
            warn(f"{problem}: runs stay in the spool {store.write_dir} and are delivered when the store answers "
                 "again (at the next run's end, the command's end, or `rtvirt push`)")
        elif delivered:
            unreachable.clear()

    return deliver


def _print_result(result: CampaignResult) -> None:
    console.print(_summary_table(result))
    _print_reasons(result)
    for warning in _warnings(result):
        console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False)
    failed = sum(1 for o in result.outcomes.values() if o.status == "failed")
    short = sum(1 for o in result.outcomes.values() if o.status == "short")
    if result.report and not result.interrupted:
        console.print(f"report: {result.report}", highlight=False)
    if failed and not result.interrupted:
        console.print(f"[red]{failed} run(s) failed[/]", highlight=False)
    if short and not result.interrupted:
        console.print(f"[yellow]{short} run(s) short of their expected samples[/]", highlight=False)


@click.command()
@click.argument("scenarios", nargs=-1)
@results_option("results store (a directory gets runs/, campaigns/; a shared store's spool does)", "--out",
                "--results")
@click.option("--scale", type=float, default=None, help="multiply every duration and event time (0.01: 100x shorter)")
@click.option("--repetitions", type=click.IntRange(1, 1000), default=None,
              help="runs per configuration instead of the scenario's (1: a quick look; the report says so)")
@click.option("--resume", is_flag=True, help="continue the last unfinished campaign in --out (of each SCENARIO "
              "given), skipping finished runs")
@click.option("--progress/--no-progress", default=None, help="progress bars on stderr [default: when stderr is a "
              "terminal]")
@click.option("--report/--no-report", default=True, help="write each campaign's HTML report (--no-report: store "
              "the runs only, e.g. in a small dom0; `rtvirt report` writes one later, also on another machine)")
@click.option("--json", "as_json", is_flag=True, help="print the campaign summary (every run) as JSON")
@click.option("--serve", "serving", is_flag=True, help="serve the live view while the campaigns run (as `rtvirt "
              "serve`: the page and /metrics, at --listen; docs/live.md)")
@serving_options
def run(scenarios: tuple[str, ...], results: str, scale: float | None, repetitions: int | None, resume: bool,
        progress: bool | None, report: bool, as_json: bool, serving: bool, listen: str,
        token_file: Path | None) -> None:
    """Run a campaign: a built-in scenario NAME (default: `default`) or a scenario FILE.toml.

    Several SCENARIOS run one after the other as separate campaigns (each with its report) that share what is
    expensive to set up: one Xen lab boot, one SSH connection per target (each libvirt domain has a connection of
    its own)."""
    if serving:
        from ..live.access import access

        access(listen, token_file)  # a bad address or token stops the command before the store is touched
    store = store_for_writing(results)
    campaigns = _campaigns(scenarios, store.write_dir, scale, repetitions, resume, as_json)
    _bring_kinds([parsed for parsed, _ in campaigns])
    if serving:
        click.get_current_context().with_resource(serving_beside(results, listen, token_file,
                                                                 _measured_cpus([p for p, _ in campaigns])))
    on_run_end = _live_delivery(store, campaigns)
    resume_hint = f"continue with rtvirt run --resume {' '.join(scenarios) + ' ' if len(campaigns) > 1 else ''}" \
                  f"--out {results}"
    done: list[CampaignResult] = []
    try:
        with SharedResources() as shared:
            for parsed, state in campaigns:
                done.append(run_campaign(parsed, state, store.write_dir, console=err_console,
                                         show_progress=progress_wanted(progress), write_report=report, shared=shared,
                                         on_run_end=on_run_end))
                if done[-1].interrupted:
                    break
    except KeyboardInterrupt:
        err_console.print(f"[yellow]interrupted[/]: {resume_hint}")
        sys.exit(EXIT_INTERRUPTED)
    for result in done:
        _fill_in_finished_runs(result, store)
    if as_json:  # one campaign: its document, as before; several: a list of them
        print_json(_document(done[0]) if len(campaigns) == 1 else {"campaigns": [_document(r) for r in done]})
    else:
        for result in done:
            _print_result(result)
    if any(result.interrupted for result in done):
        err_console.print(f"[yellow]interrupted[/]: {resume_hint}")
        sys.exit(EXIT_INTERRUPTED)
    if any(not o.measured for result in done for o in result.outcomes.values()):
        sys.exit(1)
