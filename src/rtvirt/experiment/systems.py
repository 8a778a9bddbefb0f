"""One random system of an experiment, rebuilt from (experiment seed, design point, index) alone: the same
three numbers give the same tasks on any machine and in any order, which is what lets a cluster worker, a
resumed run and a reader of the records all see the same system.

The system: ``vms`` VMs with one vCPU each, VM i's on pCPU i mod ``pcpus``; task utilisations from the
point's generator summing to ``utilization`` × ``pcpus``, task i in VM i mod ``vms``; periods from the
point's distribution (whole milliseconds); WCET = utilisation × period; deadlines implicit or drawn
uniformly in [WCET, period]; guest priorities deadline-monotonic."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.schema import Model
from .generators import PERIOD_GENERATORS, UTILISATION_GENERATORS, GeneratorError
from .spec import DesignPoint, Questions

__all__ = ["PlainSystem", "PlainTask", "RandomSystem", "draw_plain", "draw_system", "system_model"]

_MS = 1_000_000
_US = 1_000


@dataclass(frozen=True)
class PlainTask:
    wcet: int
    period: int
    deadline: int
    priority: int  # deadline-monotonic within its VM: larger = more urgent


@dataclass(frozen=True)
class PlainSystem:
    """The drawn system as plain integers (what the fast analysis reads; no model built)."""

    cpus: tuple[int, ...]  # home pCPU of each VM's one vCPU
    tasks: tuple[tuple[PlainTask, ...], ...]  # per VM, in the order the model lists them
    utilization: float  # drawn total per pCPU (the WCETs' whole-nanosecond rounding included)
    count: int
    sim_seed: int


@dataclass(frozen=True)
class RandomSystem:
    model: Model
    utilization: float
    tasks: int
    sim_seed: int
    plain: PlainSystem


def draw_plain(seed: int, point: DesignPoint, index: int) -> PlainSystem:
    rng = np.random.default_rng([seed, point.key(), index])
    total = point.utilization * point.pcpus
    count = point.vms * point.tasks_per_vm
    utilizations = UTILISATION_GENERATORS[point.utilizations](rng, count, total)
    periods = PERIOD_GENERATORS[point.periods](rng, utilizations.size).astype(np.int64) * _MS
    wcets = np.maximum(np.round(utilizations * periods).astype(np.int64), 1)
    if point.deadlines == "constrained":
        spans = rng.random(utilizations.size)
        deadlines = np.maximum(wcets + (spans * (periods - wcets)).astype(np.int64) // _US * _US, wcets)
    else:
        deadlines = periods
    per_vm: list[list[tuple[int, int, int]]] = [[] for _ in range(point.vms)]
    for wcet, period, deadline, i in zip(wcets.tolist(), periods.tolist(), deadlines.tolist(),
                                         range(utilizations.size), strict=True):
        per_vm[i % point.vms].append((wcet, period, deadline))
    vms = []
    for tasks in per_vm:
        if len(tasks) > 1000:
            raise GeneratorError(f"{point.utilizations}: more than 1000 tasks in one VM")
        # deadline-monotonic: the shortest deadline gets the largest priority
        order = sorted(range(len(tasks)), key=lambda k, tasks=tasks: (tasks[k][2], k))  # type: ignore[misc]
        priority = {k: len(order) - rank for rank, k in enumerate(order)}
        vms.append(tuple(PlainTask(*task, priority[k]) for k, task in enumerate(tasks)))
    sim_seed = int(rng.integers(0, 2**62))
    return PlainSystem(tuple(v % point.pcpus for v in range(point.vms)), tuple(vms),
                       float((wcets / periods).sum()) / point.pcpus, int(utilizations.size), sim_seed)


def system_model(plain: PlainSystem, point: DesignPoint, index: int, questions: Questions) -> Model:
    return Model.model_validate({
        "name": f"p{point.index}-s{index}",
        "hypervisor": {"scheduler": "partitioned", "pcpus": point.pcpus,
                       "overheads": {"context_switch": f"{questions.context_switch}ns",
                                     "vm_switch": f"{questions.vm_switch}ns"}},
        "vm": [{"name": f"vm{v}", "scheduler": point.guest_scheduler, "vcpu": [{"affinity": [cpu]}],
                "task": [{"name": f"t{v + k * len(plain.cpus)}", "period": f"{t.period}ns",
                          "execution": f"{t.wcet}ns", "deadline": f"{t.deadline}ns", "priority": t.priority}
                         for k, t in enumerate(tasks)]}
               for v, (cpu, tasks) in enumerate(zip(plain.cpus, plain.tasks, strict=True))],
    })


def draw_system(seed: int, point: DesignPoint, index: int, questions: Questions) -> RandomSystem:
    plain = draw_plain(seed, point, index)
    return RandomSystem(system_model(plain, point, index, questions), plain.utilization, plain.count,
                        plain.sim_seed, plain)
