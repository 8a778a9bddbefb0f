"""The study a scenario reproduces: whether it is still the study's configuration (the fields where it differs
from the built-in) and what a run's manifest records about it."""

from __future__ import annotations

from typing import Any

from .loader import builtin_scenarios, parse_scenario
from .schema import Scenario

__all__ = ["study_provenance", "differences"]

# Labels and operational settings: changing them does not change the experiment.
_NOT_THE_EXPERIMENT = {"name", "description", "run_timeout", "skip_unavailable"}
_MAX_LISTED = 20


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Field paths (``groups[2].duration``) where two JSON-like values differ."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found: list[str] = []
        for key in sorted(set(ours) | set(theirs)):
            if not path and key in _NOT_THE_EXPERIMENT:
                continue
            found += differences(ours.get(key), theirs.get(key), f"{path}.{key}" if path else key)
        return found
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [path]


def study_provenance(scenario: Scenario, plan: Any) -> dict[str, Any] | None:
    """What a run's manifest records about the study it reproduces (None: the scenario names no study).

    ``modified`` lists the fields that differ from the built-in study scenario; ``scale`` is the run's
    duration over the full-length one (``--scale``); ``repetitions`` the runs per configuration beside the
    study's (``--repetitions`` or the file's), shown on their own like the scale rather than as a modified field.
    """
    if scenario.study is None:
        return None
    reference = parse_scenario(builtin_scenarios()[scenario.study], f"built-in scenario {scenario.study}")
    changed = [field for field in differences(scenario.model_dump(mode="json"), reference.model_dump(mode="json"))
               if field != "repetitions"]
    group = next(group for group in scenario.run_groups() if group.name == plan.group)
    full = int(group.duration if group.duration is not None else scenario.duration)
    return {"name": scenario.study, "modified": changed[:_MAX_LISTED], "modified_count": len(changed),
            "scale": plan.duration_ns / full, "repetitions": scenario.repetitions,
            "study_repetitions": reference.repetitions}
