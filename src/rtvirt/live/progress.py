"""A campaign's progress from its state document (RESULTS/campaigns/<id>/state.json, rewritten by the campaign
after every change): every run its scenario plans (expanded from the scenario text the state keeps, at the
state's scale and repetitions), which are finished, which one runs, how many are left and how long they take.

The live view reads the state files of a results directory; a campaign writing to a shared store publishes the
same record into the store (``rtvirt_campaigns``) each time it saves its state, so that every machine's
campaigns can be shown side by side.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["PlannedRun", "planned_runs", "campaign_record", "run_started"]

# a run with a state entry is done unless it is one of these (or was never started: "planned"); whatever status a
# run may end with (campaign.state.FINISHED: complete, failed, skipped, ...) counts as done without a list here
NOT_DONE = ("planned", "running", "interrupted")


@dataclass(frozen=True)
class PlannedRun:
    """What the live view needs of one planned run."""

    key: str
    config: str
    environment: str
    duration_ns: int
    marks: tuple[tuple[int, str], ...]  # (ns after the workload started, stress-on | stress-off), as planned


@functools.lru_cache(maxsize=64)
def _expanded(scenario_text: str, source: str, scale: float, repetitions: int | None) -> tuple[PlannedRun, ...]:
    from ..scenario import parse_scenario
    from ..scenario.matrix import expand

    scenario = parse_scenario(scenario_text, source)
    if repetitions is not None:
        scenario = scenario.model_copy(update={"repetitions": repetitions})
    planned = []
    for plan in expand(scenario, scale):
        if plan.events:
            marks = plan.events
        elif plan.start_order == "test-first":
            marks = ((plan.settle_ns, "stress-on"),)
        elif plan.start_order == "stress-first":
            marks = ((0, "stress-on"),)  # on before the workload started
        else:
            marks = ()
        planned.append(PlannedRun(plan.key, plan.config, scenario.environments[plan.environment].label,
                                  plan.duration_ns, tuple(marks)))
    return tuple(planned)


def planned_runs(document: dict[str, Any]) -> tuple[PlannedRun, ...]:
    """The runs the campaign of state ``document`` plans, in order (cached: a state's scenario never changes).
    ValueError when the document is not a campaign state or its scenario no longer parses."""
    from ..errors import RtvirtError

    try:
        repetitions = document.get("repetitions")
        return _expanded(str(document["scenario_text"]), str(document["source"]), float(document["scale"]),
                         int(repetitions) if repetitions is not None else None)
    except (KeyError, TypeError, RtvirtError) as exc:
        raise ValueError(f"not a campaign state whose scenario parses ({exc})") from None


def run_started(run_id: str | None) -> dt.datetime | None:
    """When a run began: its id starts with the UTC time its directory was made (rtvirt.store.new_run)."""
    try:
        return dt.datetime.strptime(str(run_id)[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def campaign_record(document: dict[str, Any], machine: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """The campaign's progress as one JSON document: counts of runs done, failed, running and left, the time
    left (planned durations of the runs not done, less what the running one has had), and every planned run
    with its state entry. ``machine`` names where the campaign runs."""
    now = now or dt.datetime.now(dt.UTC)
    recorded: dict[str, dict[str, Any]] = document.get("runs") or {}
    runs, left_ns, running = [], 0, None
    for plan in planned_runs(document):
        entry = recorded.get(plan.key, {})
        status = str(entry.get("status") or "planned")
        if status == "running" and running is None:
            running = plan.key
            started = run_started(entry.get("run_id"))
            spent_ns = (now - started).total_seconds() * 1e9 if started else 0.0
            left_ns += max(0, int(plan.duration_ns - spent_ns))
        elif status in NOT_DONE:
            left_ns += plan.duration_ns
        runs.append({"key": plan.key, "config": plan.config, "environment": plan.environment, "status": status,
                     "run_id": entry.get("run_id"), "reason": entry.get("reason") or None,
                     "duration_s": plan.duration_ns / 1e9, "marks": [[t / 1e9, action] for t, action in plan.marks]})
    done = sum(1 for run in runs if run["status"] not in NOT_DONE)
    return {"campaign_id": str(document.get("campaign_id")), "scenario": str(document.get("scenario")),
            "machine": machine, "finished": bool(document.get("finished")),
            "updated": str(document.get("updated") or now.isoformat()),
            "runs_total": len(runs), "runs_done": done, "runs_failed": sum(r["status"] == "failed" for r in runs),
            "running": running, "runs_left": len(runs) - done - (running is not None),
            "seconds_left": 0.0 if document.get("finished") else left_ns / 1e9, "runs": runs}
