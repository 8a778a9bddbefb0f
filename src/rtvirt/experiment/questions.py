"""The questions asked of every random system, per hypervisor scheduler of the experiment (one record each):

- ``shared``: each VM's vCPU gets a server of period ``server_period`` × its shortest deadline and a
  bandwidth of its utilisation plus its share (in proportion to utilisation) of ``spare`` × the idle part of
  its pCPU (an overloaded pCPU is shared in proportion to utilisation); accepted
  when rtvirt's analysis for that scheduler (the supply-bound analysis of ``rtvirt analyze``) proves every
  task. One analysis per system and scheduler: the fast question.
- ``design`` (``questions.design``): ``rtvirt design``'s smallest interfaces that analysis proves; the
  interfaces' bandwidth per pCPU and its overhead above the utilisation served. A search of many analyses:
  about a hundred times slower.
- with ``simulate`` > 0, each question's configured model is simulated (accepted or not) for that long:
  deadline misses, and the worst simulated response over the analysed bound (<= 1 wherever a bound holds).

Records are plain values: a worker returns them in columns and the driver writes them.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..analysis.design import Design, configure_model, design_model
from .spec import DesignPoint, Experiment
from .systems import RandomSystem, draw_system

__all__ = ["RECORD_COLUMNS", "QUESTIONS", "answer_system", "run_chunk", "shared_interfaces"]

QUESTIONS = ("shared", "design")
RECORD_COLUMNS = ("point", "system", "target_utilization", "vms", "tasks_per_vm", "pcpus", "utilizations",
                  "periods", "deadlines", "guest_scheduler", "server_period", "spare", "tasks", "utilization",
                  "scheduler", "question", "analysis", "accepted", "bandwidth", "overhead", "sim_misses", "sim_jobs",
                  "sim_worst_ratio")
_US = 1_000
_MIN_PERIOD = 100 * _US


def shared_interfaces(system: RandomSystem, server_period: float,
                      spare: float) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(budget, period, priority) per VM: utilisation plus a proportional share of ``spare`` of the idle pCPU,
    priorities by period (shortest first)."""
    load: dict[int, float] = {}
    per_vm = []
    for vm in system.model.vm:
        cpu = (vm.vcpu[0].affinity or (0,))[0]
        utilization = sum(t.execution / (t.period or 1) for t in vm.task if isinstance(t.execution, int))
        shortest = min((t.deadline or t.period or 0 for t in vm.task), default=0)
        per_vm.append((vm.name, cpu, utilization, shortest))
        load[cpu] = load.get(cpu, 0.0) + utilization
    interfaces = {}
    for name, cpu, utilization, shortest in per_vm:
        if not shortest:
            continue  # a VM without tasks runs in the background
        period = max(_MIN_PERIOD, int(shortest * server_period) // _US * _US)
        idle = max(0.0, 1.0 - load[cpu])
        bandwidth = utilization * (1 + spare * idle / load[cpu]) / max(1.0, load[cpu])
        budget = int(period * bandwidth) // _US * _US
        interfaces[(name, 0)] = (max(budget, 10 * _US), period, 0)
    ranked = sorted(interfaces, key=lambda key: interfaces[key][1])
    return {key: (interfaces[key][0], interfaces[key][1], len(ranked) - rank) for rank, key in enumerate(ranked)}


def _simulated(system: RandomSystem, design: Design, duration_ns: int) -> dict[str, Any]:
    from ..sim import simulate, task_summary

    assert design.model is not None and design.analysis is not None
    bounds = {f"{t.vm}/{t.task}": t.wcrt for t in design.analysis.tasks}
    result = simulate(design.model, duration_ns=duration_ns, seed=system.sim_seed, keep_records=False)
    summary = task_summary(result)
    ratios = [task["max_response_ns"] / bound for name, task in summary["tasks"].items()
              if task["max_response_ns"] is not None and (bound := bounds.get(name))]
    return {"sim_misses": int(summary["misses"]), "sim_jobs": sum(t["jobs"] for t in summary["tasks"].values()),
            "sim_worst_ratio": max(ratios, default=None)}


def answer_system(experiment: Experiment, point: DesignPoint, index: int) -> list[dict[str, Any]]:
    system = draw_system(experiment.seed, point, index, experiment.questions)
    common = {**point.model_dump(exclude={"index", "utilization"}), "point": point.index, "system": index,
              "target_utilization": point.utilization, "tasks": system.tasks, "utilization": system.utilization}
    questions = experiment.questions
    shared = shared_interfaces(system, point.server_period, point.spare)
    records = []
    for label in questions.schedulers:
        for question in QUESTIONS:
            if question == "design" and not questions.design:
                continue
            design = configure_model(system.model, label, shared) if question == "shared" else \
                design_model(system.model, label)
            bandwidth = sum(v.bandwidth or 0.0 for v in design.vcpus if v.realtime) / point.pcpus
            methods = sorted({task.method for task in design.analysis.tasks}) if design.analysis else []
            record = {**common, "scheduler": label, "question": question,
                      "analysis": "+".join(methods) or "none", "accepted": design.schedulable, "bandwidth": bandwidth,
                      "overhead": bandwidth - system.utilization, "sim_misses": None, "sim_jobs": None,
                      "sim_worst_ratio": None}
            if questions.simulate and design.model is not None and design.analysis is not None:
                record |= _simulated(system, design, questions.simulate)
            records.append(record)
    return records


@functools.lru_cache(maxsize=4)
def _experiment(document: str) -> Experiment:
    return Experiment.model_validate(json.loads(document))


def run_chunk(document: str, point_index: int, start: int, count: int) -> dict[str, list[Any]]:
    """A worker's task: systems start..start+count-1 of one design point, as columns. ``document`` is the
    experiment as JSON: tasks carry plain parameters and build everything in the worker."""
    experiment = _experiment(document)
    point = experiment.points()[point_index]
    columns: dict[str, list[Any]] = {name: [] for name in RECORD_COLUMNS}
    for index in range(start, start + count):
        for record in answer_system(experiment, point, index):
            for name in RECORD_COLUMNS:
                columns[name].append(record[name])
    return columns
