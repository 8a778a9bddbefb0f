"""Expanding a scenario into its run matrix: environment x disturbance x start order x repetition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..units import parse_duration
from .schema import Scenario, TimelineEvent

__all__ = ["PlannedRun", "expand", "scaled_ns", "scaled_params"]

# Probe parameters that are times on the run's timeline, not on the measurement's: a scaled run scales them
# too, so that it keeps the study's number of reports (Thread-Metric: 60 intervals in its 5-minute runs).
SCALED_PARAMS = ("report_interval",)
MIN_SCALED_PARAM_NS = 1_000_000  # the probes' smallest report interval


@dataclass(frozen=True)
class PlannedRun:
    key: str  # stable identity across --resume: [group/]environment/disturbance/order/r<n>
    config: str  # what the report groups by (repetitions share it)
    environment: int
    disturbance: int
    start_order: str | None  # None: no stressors, or an events timeline decides
    repetition: int
    duration_ns: int
    settle_ns: int
    events: tuple[tuple[int, str], ...]  # (ns after the workload started, action)
    workload: int = 0  # index into Scenario.probe_workloads()
    group: str = "all"  # the run group (Scenario.run_groups)
    scale: float = 1.0  # --scale


def scaled_params(params: dict[str, Any], scale: float) -> dict[str, Any]:
    """The workload's parameters for a run at ``scale``: SCALED_PARAMS given in the scenario scale with it."""
    if scale == 1.0:
        return params
    scaled = dict(params)
    for name in SCALED_PARAMS:
        try:
            full = parse_duration(params[name], "s") if name in params else None
        except ValueError:  # left as given: the probe's own model names the field
            continue
        if full is not None:
            scaled[name] = f"{max(MIN_SCALED_PARAM_NS, scaled_ns(full, scale))}ns"
    return scaled


def scaled_ns(value: int, scale: float) -> int:
    return max(1, round(value * scale))


def expand(scenario: Scenario, scale: float = 1.0) -> list[PlannedRun]:
    """Every run of the campaign in execution order; ``scale`` shrinks durations, settle and event times.

    runs = for each group: its environments x its disturbances x start orders x repetitions.
    """
    if not 0 < scale <= 1000:
        raise InputError("option --scale: must be a number above 0 (e.g. 0.01 for a 100x shorter campaign)")
    runs: list[PlannedRun] = []
    settle = scaled_ns(scenario.timeline.settle, scale)
    groups = scenario.run_groups()
    grouped = len(groups) > 1 or bool(scenario.groups)
    for group in groups:
        duration = scaled_ns(group.duration if group.duration is not None else scenario.duration, scale)
        workload = scenario.workload_of(group)
        for env_index, env in enumerate(scenario.environments):
            if group.environments is not None and env.label not in group.environments:
                continue
            for dist_index, disturbance in enumerate(scenario.disturbances):
                if group.disturbances is not None and disturbance.name not in group.disturbances:
                    continue
                events: list[TimelineEvent] = disturbance.events if disturbance.events is not None \
                    else scenario.timeline.events
                scaled_events = tuple((scaled_ns(e.at, scale), e.action) for e in events) \
                    if disturbance.stressors else ()
                orders: list[str | None] = [None] if not disturbance.stressors or scaled_events \
                    else list(group.start_order or scenario.timeline.start_order)
                if orders != [None] and group.start_order is None \
                        and any(use.where in ("other-vm", "inside") for use in disturbance.stressors):
                    # disturbing guests take seconds to boot: they are up before the workload starts;
                    # stressors inside a guest start with it
                    orders = ["stress-first"]
                for order in orders:
                    config = f"{env.label} / {disturbance.name}" + (f" / {order}" if order and len(orders) > 1 else "")
                    if grouped:
                        config = f"{group.name}: {config}"
                    for repetition in range(1, scenario.repetitions + 1):
                        parts = [env.label, disturbance.name, order or "-", f"r{repetition}"]
                        if grouped:
                            parts.insert(0, group.name)
                        runs.append(PlannedRun("/".join(parts), config, env_index, dist_index, order, repetition,
                                               duration, settle, scaled_events, workload, group.name, scale))
    return runs
