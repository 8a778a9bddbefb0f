"""``rtvirt scenarios [NAME]``: the built-in scenarios, or one scenario's run matrix."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..scenario import Scenario, builtin_scenarios, load_scenario, parse_scenario
from ..scenario.matrix import PlannedRun, expand
from ..scenario.schema import StressorUse
from ..units import format_duration
from .output import console, print_json

__all__ = ["scenarios"]


def _stressor(use: StressorUse) -> str:
    kernel = f"{use.guest} " if use.guest else ""
    place = use.where + (f" ({use.vms} {kernel}guest{'s' if use.vms > 1 else ''}, "
                         f"{use.guest_cpus or 'default cores'})" if use.where == "other-vm" else "")
    params = ", ".join(f"{k}={v}" for k, v in use.params.items())
    return f"{use.stressor} x{use.workers} {place}" + (f" [{params}]" if params else "")


def _placement(env: Any) -> str:
    """The environment's kind and placement in a few words: what the matrix's system profiles differ in."""
    parts = [env.kind, "pinned" if env.pin else "unpinned"]
    if getattr(env, "vcpus", None):
        parts.append(f"{env.vcpus} vCPU{'s' if env.vcpus > 1 else ''}")
    if getattr(env, "guest", None):
        parts.append(f"{env.guest} guest")
    if getattr(env, "stressor_cpus", None):  # where a Xen env's 'other-vm' domUs run (default: its own pCPUs)
        parts.append("stressor domUs on pCPU " + ",".join(map(str, env.stressor_cpus)))
    if getattr(env, "scheduler", None) not in (None, "default"):  # a Xen cpupool's scheduler and server
        rtds = getattr(env, "rtds", None)
        parts.append(env.scheduler + (f" {format_duration(rtds.budget)}/{format_duration(rtds.period)}"
                                      if rtds is not None else ""))
    return ", ".join(parts)


def matrix(scenario: Scenario, scale: float = 1.0) -> dict[str, Any]:
    """The scenario's run matrix as plain data: groups, their workload, and every run."""
    plans = expand(scenario, scale)
    workloads = scenario.probe_workloads()
    groups: dict[str, dict[str, Any]] = {}
    for plan in plans:
        workload = workloads[plan.workload]
        entry = groups.setdefault(plan.group, {
            "name": plan.group, "workload": {"name": workload.name, "probe": workload.probe, "params": workload.params},
            "duration_s": plan.duration_ns / 1e9, "runs": []})
        disturbance = scenario.disturbances[plan.disturbance]
        entry["runs"].append({
            "key": plan.key, "config": plan.config, "environment": scenario.environments[plan.environment].label,
            "placement": _placement(scenario.environments[plan.environment]),
            "disturbance": disturbance.name, "stressors": [_stressor(u) for u in disturbance.stressors],
            "start_order": plan.start_order, "repetition": plan.repetition,
            "events": [{"at_s": at / 1e9, "action": action} for at, action in plan.events]})
    return {"name": scenario.name, "study": scenario.study, "description": scenario.description,
            "repetitions": scenario.repetitions, "scale": scale, "groups": list(groups.values()),
            "environments": [env.model_dump(mode="json") for env in scenario.environments],
            "runs": len(plans), "total_duration_s": sum(p.duration_ns for p in plans) / 1e9}


def _show(document: dict[str, Any]) -> None:
    title = f"{document['name']}" + (f" — reproduces the {document['study']} study (docs/studies.md)"
                                     if document["study"] else "")
    console.print(title, markup=False, highlight=False)
    if document["description"]:
        console.print(document["description"], markup=False, highlight=False)
    table = Table(title=f"run matrix: {document['runs']} runs, {format_duration(document['total_duration_s'] * 1e9)} "
                        f"of measurement; {document['repetitions']} repetition(s) of each configuration",
                  title_justify="left")
    for column in ("group", "workload", "environment", "disturbance", "stressors", "start order", "timeline",
                   "duration"):
        table.add_column(column)
    for group in document["groups"]:
        workload = group["workload"]
        params = ", ".join(f"{k}={v}" for k, v in workload["params"].items())
        for run in group["runs"]:
            if run["repetition"] != 1:
                continue
            events = ", ".join(f"{e['action']} at {format_duration(e['at_s'] * 1e9)}" for e in run["events"])
            # scenario strings are plain text: "[block=64MiB]" is no rich markup
            table.add_row(*(escape(cell) for cell in (
                group["name"], f"{workload['probe']}" + (f" ({params})" if params else ""),
                f"{run['environment']} ({run['placement']})", run["disturbance"], "; ".join(run["stressors"]) or "-",
                run["start_order"] or "-", events or "throughout" if run["stressors"] else "-",
                format_duration(group["duration_s"] * 1e9))))
    console.print(table)


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the run matrix as JSON")
@click.option("--scale", type=float, default=1.0, show_default=True, help="durations as `rtvirt run --scale` would")
def scenarios(name: str | None, as_json: bool, scale: float) -> None:
    """List the built-in scenarios, or show NAME's run matrix (a built-in or a .toml file)."""
    if name is not None:
        document = matrix(load_scenario(name)[0], scale)
        if as_json:
            print_json(document)
        else:
            _show(document)
        return
    listing: dict[str, dict[str, Any]] = {}
    for builtin, text in builtin_scenarios().items():
        parsed = parse_scenario(text, f"built-in scenario {builtin}")
        plans: list[PlannedRun] = expand(parsed, scale)
        listing[builtin] = {"study": parsed.study, "runs": len(plans), "duration_ns": parsed.duration,
                            "total_duration_s": sum(p.duration_ns for p in plans) / 1e9,
                            "description": parsed.description}
    if as_json:
        print_json(listing)
        return
    table = Table(title="built-in scenarios (`rtvirt scenarios NAME` shows one's matrix)", title_justify="left")
    for column in ("name", "study", "runs", "measurement", "description"):
        table.add_column(column)
    for builtin, entry in listing.items():
        table.add_row(*(escape(cell) for cell in (builtin, entry["study"] or "-", str(entry["runs"]),
                                                  format_duration(entry["total_duration_s"] * 1e9),
                                                  entry["description"])))
    console.print(table)
