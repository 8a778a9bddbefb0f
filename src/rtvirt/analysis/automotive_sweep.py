"""The automotive rules side by side with a simulated sweep (``rtvirt analyze MODEL --sweep KEY=V1,...``).

For each rule set the model is configured with the rule's derived parameters (scheduler = the rule, the
driver domain and every RT domain given the derived slice and period, the other vCPUs in the background as
in a design), analysed, and simulated once per swept value. The rules' costs e_i and e_N include the switch
costs the model charges per job (two guest context switches and two VM switches: start and resume), so that
the derived slices cover what the simulator charges.

The rules' worst cases are end to end for SEDF and SEDF' (4p_N + p_i, 2p_N + p_i); PSEDF's r_i is the
response of the RT-domain stage alone, so each row also records the simulated worst response of every
RT-domain stage. The analysed bound is that of ``rtvirt analyze`` on the configured model (compositional,
hence more pessimistic than the rules, or none where a supply has no guarantee).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..model import Model, load_model
from ..sim import simulate, task_summary
from .automotive import RuleResult
from .design import configure_model
from .system import derive_automotive

__all__ = ["RuleSweep", "automotive_sweep", "job_overhead", "simulated_summary", "MapCalls"]

MapCalls = Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]]


@dataclass
class RuleSweep:
    rule: RuleResult
    analysed_bound: int | None  # largest end-to-end chain bound of the configured model (None: no bound)
    analysed_reason: str  # why the analysis has no bound ("" when it has one)
    # per swept value: worst end-to-end chain, worst response of each RT-domain stage, misses
    simulated: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rule_worst_case(self) -> int:
        return max(self.rule.worst_case.values())

    def as_dict(self) -> dict[str, Any]:
        return {**self.rule.as_dict(), "rule_worst_case_ns": self.rule_worst_case,
                "analysed_chain_bound_ns": self.analysed_bound,
                "analysed_reason": self.analysed_reason, "simulated": self.simulated}


def job_overhead(model: Model) -> int:
    overheads = model.hypervisor.overheads
    return 2 * overheads.context_switch + 2 * overheads.vm_switch


def _parameters(model: Model, rule: RuleResult) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(slice, period, priority) per vCPU: drivers on top, RT domains deadline-monotonic below them."""
    ranked = sorted(rule.slices, key=lambda name: rule.deadlines[name])
    top = len(ranked) + 1
    parameters: dict[tuple[str, int], tuple[int, int, int]] = {}
    for chain in model.chain:
        for stage in chain.stages[::2]:  # driver → RT domain → driver
            parameters[(stage.split("/", 1)[0], 0)] = (rule.driver_slice, rule.driver_period, top)
    for position, name in enumerate(ranked):
        vm_name, task_name = name.split("/", 1)
        vm = next(vm for vm in model.vm if vm.name == vm_name)
        vcpu = next(task.vcpu for task in vm.task if task.name == task_name)
        parameters[(vm_name, vcpu)] = (rule.slices[name], rule.periods[name], top - 1 - position)
    return parameters


def _swept_model(model_path: Path | str, overrides: Sequence[tuple[str, Any]], key: str, value: Any) -> Model:
    try:
        return load_model(model_path, [*overrides, (key, value)])
    except InputError as exc:
        # the --set overrides already loaded cleanly without the swept value: the problem is the sweep's
        message = str(exc).removeprefix("option --set: ")
        raise InputError(f"option --sweep: {key}={value}: {message}") from None


def simulated_summary(model: Model, duration_ns: int | None, seed: int | None) -> dict[str, Any]:
    """One swept simulation's task summary: a plain dict, so it can be computed in another process."""
    return task_summary(simulate(model, duration_ns=duration_ns, seed=seed))


def _in_process(fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
    return [fn(*args) for args in calls]


def automotive_sweep(model_path: Path | str, key: str, values: Sequence[Any],
                     overrides: Sequence[tuple[str, Any]] = (), *, duration_ns: int | None = None,
                     seed: int | None = None, map_calls: MapCalls = _in_process) -> list[RuleSweep]:
    """One row per derived rule set (empty when the model's chains do not have the study's shape).
    ``map_calls(fn, calls)`` runs the simulations (every rule × value): in this process by default, or on
    worker processes or a cluster (rtvirt.experiment.executors.pool_map)."""
    base = load_model(model_path, list(overrides))
    rules = derive_automotive(base, job_overhead(base)) if base.chain else None
    if rules is None:
        return []
    models = [_swept_model(model_path, overrides, key, value) for value in values]
    rows = []
    calls = []
    for label, rule in rules.items():
        configured = configure_model(base, label, _parameters(base, rule))
        assert configured.analysis is not None
        bounds = [chain.bound for chain in configured.analysis.chains]
        reasons = [task.reason for task in configured.analysis.tasks if task.wcrt is None]
        rows.append(RuleSweep(rule, None if None in bounds else max(b for b in bounds if b is not None),
                              reasons[0] if None in bounds and reasons else ""))
        for swept in models:
            variant = configure_model(swept, label, _parameters(swept, rule)).model
            assert variant is not None
            calls.append((variant, duration_ns, seed))
    summaries = iter(map_calls(simulated_summary, calls))
    for row in rows:
        rule = row.rule
        parameters = _parameters(base, rule)
        background = [f"{vm.name}.{index}" for vm in base.vm for index in range(len(vm.vcpu))
                      if vm.load > 0 and (vm.name, index) not in parameters]
        for value in values:
            summary = next(summaries)
            worst = max((c["max_response_ns"] or 0 for c in summary["chains"].values()), default=0)
            stages = {name: summary["tasks"][name]["max_response_ns"] for name in rule.slices}
            # what the non-RT vCPUs actually got, to set against the load they asked for
            served = {name: summary["supplied_ns"][name] / summary["simulated_ns"] for name in background}
            row.simulated.append({"value": value, "worst_chain_ns": worst, "rt_stage_ns": stages,
                                  "misses": summary["misses"], "nonrt_served": served, "status": summary["status"]})
    return rows
