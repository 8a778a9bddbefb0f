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
from collections.abc import Callable
from typing import Any

from ..analysis.design import Design, configure_model, design_model
from ..model.schema import Model
from .fastpath import fast_shared, prepare
from .spec import DesignPoint, Experiment, Questions
from .systems import PlainSystem, draw_plain, system_model

__all__ = ["RECORD_COLUMNS", "QUESTIONS", "answer_system", "run_chunk", "shared_interfaces"]

QUESTIONS = ("shared", "design")
RECORD_COLUMNS = ("point", "system", "target_utilization", "vms", "tasks_per_vm", "pcpus", "utilizations",
                  "periods", "deadlines", "guest_scheduler", "server_period", "spare", "tasks", "utilization",
                  "scheduler", "question", "analysis", "accepted", "bandwidth", "overhead", "sim_misses", "sim_jobs",
                  "sim_worst_ratio")
_US = 1_000
_MIN_PERIOD = 100 * _US


def shared_interfaces(system: PlainSystem, server_period: float, spare: float) -> list[tuple[int, int, int] | None]:
    """(budget, period, priority) per VM: utilisation plus a proportional share of ``spare`` of the idle pCPU,
    priorities by period (shortest first); None for a VM without tasks (it runs in the background)."""
    load: dict[int, float] = {}
    per_vm = []
    for cpu, tasks in zip(system.cpus, system.tasks, strict=True):
        utilization = sum(t.wcet / t.period for t in tasks)
        per_vm.append((cpu, utilization, min((t.deadline for t in tasks), default=0)))
        load[cpu] = load.get(cpu, 0.0) + utilization
    sized: dict[int, tuple[int, int]] = {}
    for vm, (cpu, utilization, shortest) in enumerate(per_vm):
        if not shortest:
            continue
        period = max(_MIN_PERIOD, int(shortest * server_period) // _US * _US)
        idle = max(0.0, 1.0 - load[cpu])
        bandwidth = utilization * (1 + spare * idle / load[cpu]) / max(1.0, load[cpu])
        budget = int(period * bandwidth) // _US * _US
        sized[vm] = (max(budget, 10 * _US), period)
    ranked = sorted(sized, key=lambda vm: sized[vm][1])
    priority = {vm: len(ranked) - rank for rank, vm in enumerate(ranked)}
    return [(*sized[vm], priority[vm]) if vm in sized else None for vm in range(len(per_vm))]


def _simulated(sim_seed: int, design: Design, duration_ns: int) -> dict[str, Any]:
    from ..sim import simulate, task_summary

    assert design.model is not None and design.analysis is not None
    bounds = {f"{t.vm}/{t.task}": t.wcrt for t in design.analysis.tasks}
    result = simulate(design.model, duration_ns=duration_ns, seed=sim_seed, keep_records=False)
    summary = task_summary(result)
    ratios = [task["max_response_ns"] / bound for name, task in summary["tasks"].items()
              if task["max_response_ns"] is not None and (bound := bounds.get(name))]
    return {"sim_misses": int(summary["misses"]), "sim_jobs": sum(t["jobs"] for t in summary["tasks"].values()),
            "sim_worst_ratio": max(ratios, default=None)}


def _fast_record(label: str, point: DesignPoint, system: PlainSystem, interfaces: list[tuple[int, int, int] | None],
                 questions: Questions, prepared: Callable[[], Any]) -> dict[str, Any] | None:
    """The ``shared`` record from the fast path (``fastpath.py``), None where only the whole model answers."""
    if questions.simulate or any(i is None for i in interfaces):
        return None
    given = [i for i in interfaces if i is not None]
    verdict = fast_shared(label, system, given, point.guest_scheduler, questions.context_switch, questions.vm_switch,
                          prepared(), verdict_only=True)
    if verdict is None:
        return None
    bandwidth = sum(budget / period for budget, period, _ in given) / point.pcpus
    return {"analysis": "edf-spuri" if point.guest_scheduler == "edf" else "fp-rta", "accepted": verdict.accepted,
            "bandwidth": bandwidth, "overhead": bandwidth - system.utilization}


def answer_system(experiment: Experiment, point: DesignPoint, index: int, fast: bool = True) -> list[dict[str, Any]]:
    """Every record of one system; ``fast=False`` asks the whole-model path even where the fast one answers."""
    questions = experiment.questions
    system = draw_plain(experiment.seed, point, index)
    common = {**point.model_dump(exclude={"index", "utilization"}), "point": point.index, "system": index,
              "target_utilization": point.utilization, "tasks": system.count, "utilization": system.utilization}
    interfaces = shared_interfaces(system, point.server_period, point.spare)
    shared = {(f"vm{vm}", 0): given for vm, given in enumerate(interfaces) if given is not None}
    model: Model | None = None
    prepared = functools.cache(lambda: prepare(system, questions.context_switch))  # once for every scheduler
    records = []
    for label in questions.schedulers:
        for question in QUESTIONS:
            if question == "design" and not questions.design:
                continue
            unanswered = {"sim_misses": None, "sim_jobs": None, "sim_worst_ratio": None}
            answer = _fast_record(label, point, system, interfaces, questions, prepared) \
                if fast and question == "shared" else None
            if answer is not None:
                records.append({**common, "scheduler": label, "question": question, **answer, **unanswered})
                continue
            model = model or system_model(system, point, index, questions)
            design = configure_model(model, label, shared) if question == "shared" else design_model(model, label)
            bandwidth = sum(v.bandwidth or 0.0 for v in design.vcpus if v.realtime) / point.pcpus
            methods = sorted({task.method for task in design.analysis.tasks}) if design.analysis else []
            record = {**common, "scheduler": label, "question": question,
                      "analysis": "+".join(methods) or "none", "accepted": design.schedulable, "bandwidth": bandwidth,
                      "overhead": bandwidth - system.utilization, **unanswered}
            if questions.simulate and design.model is not None and design.analysis is not None:
                record |= _simulated(system.sim_seed, design, questions.simulate)
            records.append(record)
    return records


@functools.lru_cache(maxsize=4)
def _experiment(document: str) -> Experiment:
    return Experiment.model_validate(json.loads(document))


def run_chunk(document: str, point_index: int, start: int, count: int, fast: bool = True) -> dict[str, list[Any]]:
    """A worker's task: systems start..start+count-1 of one design point, as columns. ``document`` is the
    experiment as JSON: tasks carry plain parameters and build everything in the worker."""
    experiment = _experiment(document)
    point = experiment.points()[point_index]
    columns: dict[str, list[Any]] = {name: [] for name in RECORD_COLUMNS}
    for index in range(start, start + count):
        for record in answer_system(experiment, point, index, fast):
            for name in RECORD_COLUMNS:
                columns[name].append(record[name])
    return columns
