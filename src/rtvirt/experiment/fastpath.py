"""The ``shared`` question without building a model: the same analysis as ``rtvirt analyze`` of the configured
model, specialised to what an experiment's random systems are (one vCPU per VM, periodic tasks without jitter,
blocking or chains, deadline-monotonic guest priorities, no scheduler quantum) and run on plain integers.

Why a second path: the whole-model path validates and copies pydantic models and re-derives every supply
through the general code, about 2 ms per question; the experiment asks thousands of them per point. Every
formula here is the one the general path applies to such a system (``servers.py`` for the server supplies,
``fp.py``'s response-time analysis inlined on the explicit-deadline periodic supply, ``edf.py`` called as is
for EDF guests), and ``tests/test_experiment_fastpath.py`` checks accept/reject and every task's bound to the
nanosecond against the whole-model path on random systems of every scheduler the experiment offers.
Schedulers whose supply is not a delayed EDP (arinc653's windows) return None: the caller asks the
whole-model path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..analysis.design import DESIGNABLE
from ..analysis.edf import edf_demand_test, edf_response_times
from ..analysis.fp import _HORIZON_PERIODS
from ..analysis.servers import deferrable_edf_guarantee
from ..analysis.supply import DelayedSupply, ExplicitDeadlinePeriodic, Supply
from ..analysis.taskset import Task
from .systems import PlainSystem, PlainTask

__all__ = ["FAST_SCHEDULERS", "FastVerdict", "fast_shared"]

FAST_SCHEDULERS = frozenset(label for label, (scheduler, _) in DESIGNABLE.items() if scheduler != "arinc653")


@dataclass(frozen=True)
class FastVerdict:
    accepted: bool
    bounds: tuple[tuple[int | None, ...], ...]  # per VM, per task in model order: the response bound (None: none)


@dataclass(frozen=True)
class _Edp:
    """EDP(period, budget, deadline) started ``wait`` later: time_for(w) = wait + blackout + k·P + w − k·Q."""

    period: int
    budget: int
    deadline: int
    wait: int

    def supply(self) -> Supply:
        inner = ExplicitDeadlinePeriodic(self.period, self.budget, self.deadline)
        return DelayedSupply(inner, self.wait) if self.wait else inner


_DEDICATED = (1, 1, 1)  # EDP(1, 1, 1) has time_for(w) = w and rate 1: a dedicated pCPU


def _fp_servers(servers: list[tuple[int, int, int]], deferrable: bool, switch: int) -> list[_Edp | None]:
    """``servers._fp_servers`` with quantum 0: (budget, period, priority) per server of one pCPU."""
    out: list[_Edp | None] = []
    for i, (budget, period, priority) in enumerate(servers):
        higher = [(b, p, (p - b) if deferrable else 0) for j, (b, p, q) in enumerate(servers)
                  if j != i and q >= priority]
        response = budget
        while True:
            following = budget + sum(-(-(response + jitter) // p) * b for b, p, jitter in higher)
            if following == response or following > period:
                break
            response = following
        usable = budget - switch * (1 + sum(-(-(response + jitter) // p) for _, p, jitter in higher))
        out.append(None if following > period or usable <= 0 else _Edp(period, usable, response, 0))
    return out


def _edf_servers(servers: list[tuple[int, int]], deferrable: bool, switch: int, sedf: bool) -> list[_Edp | None]:
    """``servers._edf_servers`` with quantum 0 for (budget, period = deadline) servers of one pCPU."""
    if deferrable:
        schedulable, _ = deferrable_edf_guarantee(servers, 0)
    else:
        schedulable = edf_demand_test([Task(str(i), b, p, p) for i, (b, p) in enumerate(servers)]).schedulable
    out: list[_Edp | None] = []
    for i, (budget, period) in enumerate(servers):
        preemptions = sum(-(-period // p) + 1 for j, (_, p) in enumerate(servers) if j != i)
        usable = budget - switch * (1 + preemptions)
        if not schedulable or usable <= 0:
            out.append(None)
        elif sedf:  # the short-unblocking rule: EDP(p, s, s) a period late
            out.append(_Edp(period, usable, usable, period))
        else:
            out.append(_Edp(period, usable, period, 0))
    return out


def _supplies(label: str, system: PlainSystem, interfaces: Sequence[tuple[int, int, int]],
              vm_switch: int) -> list[_Edp | None]:
    scheduler, server = DESIGNABLE[label]
    if scheduler == "partitioned":
        return [_Edp(*_DEDICATED, vm_switch) for _ in system.cpus]
    out: list[_Edp | None] = [None] * len(system.cpus)
    for cpu in sorted(set(system.cpus)):
        on_cpu = [v for v, home in enumerate(system.cpus) if home == cpu]
        if scheduler in ("fifo", "psedf"):
            supplies = _fp_servers([interfaces[v] for v in on_cpu], scheduler == "psedf" or server == "deferrable",
                                   vm_switch)
        else:
            supplies = _edf_servers([interfaces[v][:2] for v in on_cpu], scheduler in ("rtds", "sedf-prime"),
                                    vm_switch, scheduler == "sedf")
        for v, supply in zip(on_cpu, supplies, strict=True):
            out[v] = supply
    return out


def _fp_bounds(tasks: Sequence[tuple[int, int, int, int]], levels: Sequence[int], common: int,
               edp: _Edp) -> list[int | None]:
    """``fp.fp_analysis`` on a delayed EDP for jitter- and blocking-free tasks (wcet, period, deadline, priority);
    a level's load is levels[i] / common."""
    period, budget = edp.period, edp.budget
    offset = edp.wait + period + edp.deadline - 2 * budget  # the delay before the first supply

    def time_for(work: int) -> int:
        full = -(-work // budget) - 1
        return offset + full * period + work - full * budget

    out: list[int | None] = []
    for i, ((wcet, own_period, _, priority), level) in enumerate(zip(tasks, levels, strict=True)):
        if level * period > budget * common:  # the level's load exceeds the supply rate budget / period
            out.append(None)
            continue
        higher = [(w, p) for j, (w, p, _, q) in enumerate(tasks) if j != i and q >= priority]
        horizon = _HORIZON_PERIODS * max([own_period, *(p for _, p in higher)]) + offset
        worst = 0
        job = 0
        bound: int | None = None
        while True:
            own = (job + 1) * wcet
            window = time_for(own)
            while True:
                following = time_for(own + sum(-(-window // p) * w for w, p in higher))
                if following == window:
                    break
                if following > horizon:
                    break
                window = following
            if following != window:
                break
            worst = max(worst, window - job * own_period)
            if window <= (job + 1) * own_period:
                bound = worst
                break
            if window > horizon:
                break
            job += 1
        out.append(bound)
    return out


def fast_shared(label: str, system: PlainSystem, interfaces: Sequence[tuple[int, int, int]], guest: str,
                context_switch: int, vm_switch: int) -> FastVerdict | None:
    """The ``shared`` question's verdict and bounds for ``system`` with (budget, period, priority) per VM,
    or None where only the whole-model path answers (see the module's docstring)."""
    if label not in FAST_SCHEDULERS:
        return None
    bandwidth: dict[int, float] = {}
    for cpu, (budget, period, _) in zip(system.cpus, interfaces, strict=True):
        bandwidth[cpu] = bandwidth.get(cpu, 0.0) + budget / period
    fits = all(total <= 1 + 1e-9 for total in bandwidth.values())  # else design reports an over-subscribed pCPU
    supplies = _supplies(label, system, interfaces, vm_switch)
    bounds: list[tuple[int | None, ...]] = []
    accepted = fits
    for tasks, edp in zip(system.tasks, supplies, strict=True):
        switch = context_switch * (2 if len(tasks) > 1 else 1)
        charged = [(t.wcet + switch, t.period, t.deadline, t.priority) for t in tasks]
        vm_bounds = _vm_bounds(charged, tasks, edp, guest)
        accepted = accepted and all(b is not None and b <= t.deadline for b, t in zip(vm_bounds, tasks, strict=True))
        bounds.append(tuple(vm_bounds))
    return FastVerdict(accepted, tuple(bounds))


def _vm_bounds(charged: list[tuple[int, int, int, int]], tasks: Sequence[PlainTask], edp: _Edp | None,
               guest: str) -> list[int | None]:
    if edp is None:
        return [None] * len(tasks)
    if guest == "edf":
        return [b.wcrt for b in edf_response_times([Task(f"t{k}", w, p, d, priority=q)
                                                    for k, (w, p, d, q) in enumerate(charged)], edp.supply())]
    # Each priority level's load as an exact fraction over the periods' lcm (integers: Fraction is slow here).
    common = math.lcm(*(p for _, p, _, _ in charged))
    levels = [sum(w * (common // p) for w, p, _, q in charged if q >= priority) for _, _, _, priority in charged]
    return _fp_bounds(charged, levels, common, edp)
