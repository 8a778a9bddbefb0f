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
from .systems import PlainSystem

__all__ = ["FAST_SCHEDULERS", "FastVerdict", "fast_shared", "prepare"]

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


@dataclass(frozen=True)
class _GuestTasks:
    """One VM's tasks as the analysis charges them, with what every scheduler's analysis of them shares."""

    charged: tuple[tuple[int, int, int, int], ...]  # (wcet + context switches, period, deadline, priority)
    higher: tuple[tuple[tuple[int, int], ...], ...]  # per task: (wcet, period) of the tasks at or above it
    horizon_period: tuple[int, ...]  # per task: the longest period of its level
    levels: tuple[int, ...]  # per task: its level's load × common (an exact fraction without Fraction's cost)
    common: int  # the lcm of the periods


def prepare(system: PlainSystem, context_switch: int) -> tuple[_GuestTasks, ...]:
    """The per-VM part of the analysis that does not depend on the hypervisor scheduler: done once per system."""
    out = []
    for tasks in system.tasks:
        switch = context_switch * (2 if len(tasks) > 1 else 1)
        charged = tuple((t.wcet + switch, t.period, t.deadline, t.priority) for t in tasks)
        higher = tuple(tuple((w, p) for j, (w, p, _, q) in enumerate(charged) if j != i and q >= priority)
                       for i, (_, _, _, priority) in enumerate(charged))
        common = math.lcm(*(p for _, p, _, _ in charged)) if charged else 1
        levels = tuple(sum(w * (common // p) for w, p, _, q in charged if q >= priority)
                       for _, _, _, priority in charged)
        spans = tuple(max([p, *(other for _, other in above)]) for (_, p, _, _), above in zip(charged, higher,
                                                                                            strict=True))
        out.append(_GuestTasks(charged, higher, spans, levels, common))
    return tuple(out)


def _fp_bounds(guest: _GuestTasks, edp: _Edp, verdict_only: bool) -> list[int | None]:
    """``fp.fp_analysis`` on a delayed EDP for jitter- and blocking-free tasks; with ``verdict_only`` it stops
    at the first task past its deadline (its bound and the later ones then read None)."""
    period, budget = edp.period, edp.budget
    offset = edp.wait + period + edp.deadline - 2 * budget  # the delay before the first supply

    def time_for(work: int) -> int:
        full = -(-work // budget) - 1
        return offset + full * period + work - full * budget

    out: list[int | None] = []
    for (wcet, own_period, deadline, _), higher, span, level in zip(guest.charged, guest.higher, guest.horizon_period,
                                                                    guest.levels, strict=True):
        if level * period > budget * guest.common:  # the level's load exceeds the supply rate budget / period
            out.append(None)
            if verdict_only:
                break
            continue
        horizon = _HORIZON_PERIODS * span + offset
        worst = 0
        job = 0
        bound: int | None = None
        while True:
            own = (job + 1) * wcet
            window = time_for(own)
            while True:
                following = time_for(own + sum(-(-window // p) * w for w, p in higher))
                if following == window or following > horizon:
                    break
                window = following
            if following != window:
                break
            worst = max(worst, window - job * own_period)
            if verdict_only and worst > deadline:
                break
            if window <= (job + 1) * own_period:
                bound = worst
                break
            if window > horizon:
                break
            job += 1
        out.append(bound)
        if verdict_only and (bound is None or bound > deadline):
            break
    return out + [None] * (len(guest.charged) - len(out))


def fast_shared(label: str, system: PlainSystem, interfaces: Sequence[tuple[int, int, int]], guest: str,
                context_switch: int, vm_switch: int, prepared: tuple[_GuestTasks, ...] | None = None,
                verdict_only: bool = False) -> FastVerdict | None:
    """The ``shared`` question's verdict and bounds for ``system`` with (budget, period, priority) per VM,
    or None where only the whole-model path answers (see the module's docstring). ``prepared`` is
    ``prepare(system, context_switch)`` shared by the schedulers; with ``verdict_only`` the analysis stops at
    the first reason to reject and the bounds are left empty (what an experiment's record needs)."""
    if label not in FAST_SCHEDULERS:
        return None
    bandwidth: dict[int, float] = {}
    for cpu, (budget, period, _) in zip(system.cpus, interfaces, strict=True):
        bandwidth[cpu] = bandwidth.get(cpu, 0.0) + budget / period
    fits = all(total <= 1 + 1e-9 for total in bandwidth.values())  # else design reports an over-subscribed pCPU
    if verdict_only and not fits:
        return FastVerdict(False, ())
    supplies = _supplies(label, system, interfaces, vm_switch)
    bounds: list[tuple[int | None, ...]] = []
    accepted = fits
    for tasks, edp in zip(prepared or prepare(system, context_switch), supplies, strict=True):
        vm_bounds = _vm_bounds(tasks, edp, guest, verdict_only)
        accepted = accepted and all(b is not None and b <= t[2] for b, t in zip(vm_bounds, tasks.charged,
                                                                                 strict=True))
        if verdict_only and not accepted:
            return FastVerdict(False, ())
        bounds.append(tuple(vm_bounds))
    return FastVerdict(accepted, () if verdict_only else tuple(bounds))


def _vm_bounds(guest: _GuestTasks, edp: _Edp | None, scheduler: str, verdict_only: bool) -> list[int | None]:
    if edp is None:
        return [None] * len(guest.charged)
    if scheduler == "edf":
        return [b.wcrt for b in edf_response_times([Task(f"t{k}", w, p, d, priority=q)
                                                    for k, (w, p, d, q) in enumerate(guest.charged)], edp.supply())]
    return _fp_bounds(guest, edp, verdict_only)
