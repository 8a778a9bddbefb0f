"""Helpers for the simulator tests: build a model from Python literals, run it, read jobs back by task."""

from __future__ import annotations

from typing import Any

from rtvirt.model import model_from_dict
from rtvirt.sim import SimResult, simulate

MS = 1_000_000


def build(hypervisor: dict[str, Any], vms: list[dict[str, Any]], duration: str = "20ms", **extra: Any) -> Any:
    data = {"hypervisor": hypervisor, "vm": vms, "simulation": {"duration": duration, **extra.pop("simulation", {})},
            **extra}
    return model_from_dict(data)


def run(hypervisor: dict[str, Any], vms: list[dict[str, Any]], duration: str = "20ms", **extra: Any) -> SimResult:
    """The model simulated with a Gantt chart of everything, after checking that the run without a chart, in
    which the core accounts a pCPU only when something on it changes, produced the very same records."""
    model = build(hypervisor, vms, duration, **extra)
    charted, plain = simulate(model, gantt=(0, 10**12)), simulate(model)
    assert records(plain) == records(charted)
    return charted


def records(result: SimResult) -> dict[str, Any]:
    """Everything a run produced but its Gantt segments, as plain Python values."""
    return {"jobs": result.jobs.to_pydict(), "chains": result.chains.to_pydict(), "gaps": result.gaps.to_pydict(),
            "supply": result.supply.to_pydict(), "counters": result.counters, "end": result.end_time_ns}


def jobs_by_task(result: SimResult) -> dict[str, list[tuple[float, float, float]]]:
    """task -> [(arrival, start, finish)] in ms, in completion order."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    j = result.jobs
    for task, arrival, start, finish in zip(j["task"].to_pylist(), j["arrival_ns"].to_pylist(),
                                            j["start_ns"].to_pylist(), j["finish_ns"].to_pylist(), strict=True):
        out.setdefault(task, []).append((arrival / MS, start / MS, finish / MS))
    return out


def finishes(result: SimResult) -> dict[str, list[float]]:
    return {task: [f for _, _, f in jobs] for task, jobs in jobs_by_task(result).items()}


def busy(name: str, execution: str, *, vcpu: int = 0, period: str = "1s", **task: Any) -> dict[str, Any]:
    """One job of `execution` at time offset (default 0), then nothing for a long period."""
    return {"name": name, "vcpu": vcpu, "period": period, "execution": execution, **task}
