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

__all__ = ["RandomSystem", "draw_system"]

_MS = 1_000_000
_US = 1_000


@dataclass(frozen=True)
class RandomSystem:
    model: Model
    utilization: float  # drawn total per pCPU (the WCETs' whole-nanosecond rounding included)
    tasks: int
    sim_seed: int


def draw_system(seed: int, point: DesignPoint, index: int, questions: Questions) -> RandomSystem:
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
    vms: list[dict] = [{"name": f"vm{v}", "scheduler": point.guest_scheduler,
                        "vcpu": [{"affinity": [v % point.pcpus]}], "task": []} for v in range(point.vms)]
    for i in range(utilizations.size):
        vms[i % point.vms]["task"].append({"name": f"t{i}", "period": f"{periods[i]}ns",
                                            "execution": f"{wcets[i]}ns", "deadline": f"{deadlines[i]}ns"})
    for vm in vms:
        if len(vm["task"]) > 1000:
            raise GeneratorError(f"{point.utilizations}: more than 1000 tasks in one VM")
        # deadline-monotonic: the shortest deadline gets the largest priority
        order = sorted(range(len(vm["task"])), key=lambda k: (int(vm["task"][k]["deadline"][:-2]), k))
        for rank, k in enumerate(order):
            vm["task"][k]["priority"] = len(order) - rank
    model = Model.model_validate({
        "name": f"p{point.index}-s{index}",
        "hypervisor": {"scheduler": "partitioned", "pcpus": point.pcpus,
                       "overheads": {"context_switch": f"{questions.context_switch}ns",
                                     "vm_switch": f"{questions.vm_switch}ns"}},
        "vm": vms,
    })
    sim_seed = int(rng.integers(0, 2**62))
    return RandomSystem(model, float((wcets / periods).sum()) / point.pcpus, int(utilizations.size), sim_seed)
