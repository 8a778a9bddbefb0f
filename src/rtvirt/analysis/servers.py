"""The supply each vCPU receives from its hypervisor scheduler, as a supply bound function.

One function per scheduler family, all reading the shared model (docs/model.md). A vCPU gets either a
``Supply`` or a reason why none can be guaranteed (credit sharing a core, global scheduling of more vCPUs
than pCPUs, an overloaded server set...). The rules, with references, are in docs/analysis.md:

- partitioned: the vCPU owns its pCPU (``Dedicated``).
- fifo without servers: the vCPU gets what higher/equal-priority vCPUs on its pCPU leave (``LeftoverSupply``).
- fifo with servers (RT-Xen; Bernat & Burns 1999 for the deferrable server's back-to-back effect): a server
  of budget Q, period P has, by response-time analysis among the servers of its pCPU, R_s =
  Q + Σ_hp ⌈(R_s + J_j)/P_j⌉·Q_j with J_j = P_j − Q_j for deferrable servers (they may run their budget at
  the end of one period and the start of the next) and 0 for periodic ones; R_s ≤ P gives the explicit-
  deadline periodic supply EDP(P, Q, R_s). Work-conserving and slack-stealing servers only add supply on
  top of the pure periodic guarantee, so they share its bound.
- rtds (Xen RTDS, Xi et al., "Real-time multi-core virtual machine scheduling in Xen", EMSOFT 2014):
  EDF of deferrable servers per pCPU. Budgets are guaranteed to a backlogged vCPU if the servers pass the
  carry-in test of ``deferrable_edf_guarantee``; each vCPU then has the periodic resource Γ(P, Q).
- deadline (Linux SCHED_DEADLINE, a hard constant-bandwidth server, Abeni & Buttazzo RTSS 1998): EDF demand
  test of (runtime, deadline, period); each vCPU then has EDP(period, runtime, deadline).
- sedf / sedf-prime / psedf (Masrur et al. RTCSA 2010): EDF of (slice, period) domains; with the short-
  unblocking rule a woken domain may first wait up to one period, hence sbf(t) = EDP(p, s, s)(t − p); without
  it (sedf-prime) the periodic resource Γ(p, s). psedf runs RT domains as fixed-priority servers above.
- arinc653: the exact window supply (``WindowSupply``).
- credit / fair: proportional share without a delay guarantee: only a vCPU alone on its pCPU is analysed.

Overheads, as the simulator charges them: a VM switch is charged to the budget of the vCPU switched to,
so a server loses one switch per period plus one per possible preemption; without servers each
higher-priority job costs two switches. With a scheduler ``quantum``, a vCPU that wakes while every pCPU is
busy waits for the next tick: every shared supply is delayed by one quantum and every interfering server
gets one quantum of extra release jitter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from ..model.schema import Model, VCpu, Vm
from .edf import edf_demand_test
from .supply import (
    Dedicated,
    DelayedSupply,
    ExplicitDeadlinePeriodic,
    LeftoverSupply,
    OverrunSupply,
    PeriodicResource,
    Supply,
    WindowSupply,
)
from .taskset import Task, ceil_div

__all__ = ["VcpuRef", "VcpuSupply", "vcpu_supplies", "deferrable_edf_guarantee", "RTDS_DEFAULT_BUDGET",
           "RTDS_DEFAULT_PERIOD"]

RTDS_DEFAULT_BUDGET = 4_000_000
RTDS_DEFAULT_PERIOD = 10_000_000


@dataclass(frozen=True)
class VcpuRef:
    vm: str
    index: int

    def __str__(self) -> str:
        return f"{self.vm}.vcpu{self.index}"


@dataclass(frozen=True)
class VcpuSupply:
    ref: VcpuRef
    cpu: int | None
    supply: Supply | None
    reason: str = ""
    server_response: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"vm": self.ref.vm, "vcpu": self.ref.index, "cpu": self.cpu,
                "supply": None if self.supply is None else self.supply.describe(),
                "rate": None if self.supply is None else float(self.supply.rate),
                "server_response_ns": self.server_response, "reason": self.reason}


@dataclass(frozen=True)
class _Placed:
    ref: VcpuRef
    vm: Vm
    vcpu: VCpu
    cpu: int


TaskDemand = Callable[[VcpuRef], Sequence[Task]]
"""The guest work a vCPU may run (its tasks and background load): what it takes from vCPUs below it."""


def _placement(model: Model) -> tuple[list[_Placed], str]:
    """Home pCPU of every vCPU, or a reason why per-pCPU analysis does not hold.

    Per-pCPU schedulers keep a vCPU on its home (first CPU of its affinity, else CPU 0); SCHED_DEADLINE and
    global RTDS schedule vCPUs over their whole affinity (as the simulator does).
    """
    hv = model.hypervisor
    is_global = hv.scheduler == "deadline" or (hv.scheduler == "rtds" and hv.mode == "global")
    placed = []
    floating = 0
    pinned: list[int] = []
    for vm in model.vm:
        for index, vcpu in enumerate(vm.vcpu):
            cpus = vcpu.affinity or (tuple(range(hv.pcpus)) if is_global else (0,))
            if is_global and len(cpus) > 1:
                floating += 1
            else:
                pinned.append(cpus[0])
            placed.append(_Placed(VcpuRef(vm.name, index), vm, vcpu, cpus[0]))
    if floating:
        if len(placed) <= hv.pcpus and len(set(pinned)) == len(pinned):
            return placed, "every-vcpu-has-a-core"
        return placed, (f"global {hv.scheduler} scheduling of {len(placed)} vCPUs over {hv.pcpus} pCPUs with "
                        "migrating vCPUs is not analysed; pin every vCPU to one pCPU (affinity) or use "
                        "mode = \"partitioned\"")
    return placed, ""


def _with_quantum(supply: Supply, quantum: int) -> Supply:
    """``supply`` starting ``quantum`` later (a tick-delayed wake-up, or a one-off switch)."""
    return DelayedSupply(supply, quantum) if quantum else supply


def _fp_servers(model: Model, on_cpu: list[_Placed], budget_of: Callable[[VCpu], tuple[int, int]],
                deferrable: Callable[[VCpu], bool]) -> list[VcpuSupply]:
    hv = model.hypervisor
    switch, quantum = hv.overheads.vm_switch, hv.quantum
    results = []
    for item in on_cpu:
        budget, period = budget_of(item.vcpu)
        higher = [other for other in on_cpu if other is not item and other.vcpu.priority >= item.vcpu.priority]

        def activations(window: int, higher: list[_Placed] = higher) -> list[tuple[int, int]]:
            """(count, budget) of every higher server inside a window; a late wake-up (quantum) is jitter too."""
            out = []
            for other in higher:
                other_budget, other_period = budget_of(other.vcpu)
                jitter = (other_period - other_budget if deferrable(other.vcpu) else 0) + quantum
                out.append((ceil_div(window + jitter, other_period), other_budget))
            return out

        response = budget + quantum
        while True:
            following = budget + quantum + sum(count * other for count, other in activations(response))
            if following == response or following > period:
                break
            response = following
        # VM switches are charged to the budget of the vCPU switched to: once per period, once per preemption.
        usable = budget - switch * (1 + sum(count for count, _ in activations(response)))
        if following > period:
            results.append(VcpuSupply(item.ref, item.cpu, None, f"the server cannot get its budget of {budget} ns "
                                      f"within its period of {period} ns below higher-priority servers"))
        elif usable <= 0:
            results.append(VcpuSupply(item.ref, item.cpu, None, "VM switches eat the whole budget"))
        else:
            results.append(VcpuSupply(item.ref, item.cpu, ExplicitDeadlinePeriodic(period, usable, response),
                                      server_response=response))
    return results


def deferrable_edf_guarantee(servers: Sequence[tuple[int, int]], quantum: int = 0) -> tuple[bool, str]:
    """Whether EDF of deferrable servers (budget Q_j, period = deadline P_j) delivers every budget to a server
    that has work from the start of its period.

    Deferred budgets make some server jobs lose budget (two idle servers that wake late cannot both finish),
    so the plain demand test is not the right condition, and the demand test with release jitter P − Q
    rejects any two servers with equal periods. What a backlogged server needs: let t0 be the last instant
    before its deadline d at which the pCPU was idle or ran a later deadline. In (t0, d] run only jobs with
    deadlines ≤ d; a job of server j whose period began before t0 ("carry-in") had no work at t0 and must
    finish by its deadline t0 + x_j, so all carry-ins together fit in max_j x_j, and a carry-in job exists
    only if x_j ≤ L mod P_j (else its place is a whole job). With L = d − t0 that bounds the demand by

        Σ_j ⌊L/P_j⌋·Q_j + min(Σ_j min(Q_j, L mod P_j), max_j (L mod P_j))

    which must not exceed L − quantum (a late wake-up). Between multiples of a period the bound grows with
    slope ≤ 1, so only L = k·P_j needs checking, up to min(max P / (1 − U), H) + max P.
    """
    if not servers:
        return True, ""
    total = sum(Fraction(budget, period) for budget, period in servers)
    if total > 1:
        return False, f"the budgets need {float(total):.3f} of the pCPU"
    longest = max(period for _, period in servers)
    # The bound repeats with the hyperperiod H (minus (1 − U)·H), so windows beyond H + max P add nothing.
    horizon = math.lcm(*(p for _, p in servers)) + longest
    if total < 1:
        horizon = min(horizon, int(longest / (1 - total)) + longest)
    points = sorted({k * period for _, period in servers for k in range(1, horizon // period + 1)})
    if len(points) > 1_000_000:
        return False, "too many test points: undetermined"
    for window in points:
        rests = [window % period for _, period in servers]
        demand = sum(window // period * budget for budget, period in servers)
        demand += min(sum(min(budget, rest) for (budget, _), rest in zip(servers, rests, strict=True)), max(rests))
        if demand > window - quantum:
            return False, f"deferred budgets can need {demand} ns within {window} ns"
    return True, ""


def _edf_servers(model: Model, on_cpu: list[_Placed], params: Callable[[VCpu], tuple[int, int, int, bool]],
                 supply_of: Callable[[VCpu, int], Supply]) -> list[VcpuSupply]:
    """EDF of servers (budget, deadline, period, deferrable): guaranteed if their demand fits the pCPU."""
    hv = model.hypervisor
    switch, quantum = hv.overheads.vm_switch, hv.quantum
    servers = [Task(str(item.ref), params(item.vcpu)[0], params(item.vcpu)[2], params(item.vcpu)[1],
                    jitter=quantum) for item in on_cpu]
    if any(params(item.vcpu)[3] for item in on_cpu):
        schedulable, reason = deferrable_edf_guarantee([(t.wcet, t.period) for t in servers], quantum)
    else:
        verdict = edf_demand_test(servers)
        schedulable, reason = verdict.schedulable, verdict.reason
    results = []
    for item, server in zip(on_cpu, servers, strict=True):
        # Switches are charged to the budget: once per period and once per job of another server that can
        # preempt it inside that period.
        preemptions = sum(ceil_div(server.period, other.period) + 1 for other in servers if other is not server)
        budget = server.wcet - switch * (1 + preemptions)
        if not schedulable:
            results.append(VcpuSupply(item.ref, item.cpu, None, f"the servers on pCPU {item.cpu} do not fit "
                                      f"({reason}): budgets are not guaranteed"))
        elif budget <= 0:
            results.append(VcpuSupply(item.ref, item.cpu, None, "VM switches eat the whole budget"))
        else:
            results.append(VcpuSupply(item.ref, item.cpu, _with_quantum(supply_of(item.vcpu, budget), quantum)))
    return results


def _rtds_budget(vcpu: VCpu) -> tuple[int, int]:
    return vcpu.budget or RTDS_DEFAULT_BUDGET, vcpu.period or RTDS_DEFAULT_PERIOD


def _rtds_server(vcpu: VCpu) -> tuple[int, int, int, bool]:
    budget, period = _rtds_budget(vcpu)
    return budget, period, period, True


def _sedf_supply(rule: str) -> Callable[[VCpu, int], Supply]:
    def build(vcpu: VCpu, budget: int) -> Supply:
        assert vcpu.period is not None
        if rule == "sedf":
            return DelayedSupply(ExplicitDeadlinePeriodic(vcpu.period, budget, budget), vcpu.period)
        return PeriodicResource(vcpu.period, budget)
    return build


def vcpu_supplies(model: Model, demand: TaskDemand) -> dict[VcpuRef, VcpuSupply]:
    """Supply of every vCPU of the model under its hypervisor scheduler."""
    hv = model.hypervisor
    placed, global_note = _placement(model)
    if global_note == "every-vcpu-has-a-core":
        # Work-conserving global scheduling with no more vCPUs than pCPUs: a ready vCPU always finds a core.
        out = {}
        for item in placed:
            if hv.scheduler in ("rtds", "deadline"):
                budget, period = (_rtds_budget(item.vcpu) if hv.scheduler == "rtds"
                                  else (item.vcpu.runtime or 0, item.vcpu.period or 0))
                supply: Supply | None = (ExplicitDeadlinePeriodic(period, budget, budget) if budget else Dedicated())
            else:
                supply = _with_quantum(Dedicated(), hv.overheads.vm_switch)
            out[item.ref] = VcpuSupply(item.ref, None, supply)
        return out
    if global_note:
        return {item.ref: VcpuSupply(item.ref, None, None, global_note) for item in placed}
    by_cpu: dict[int, list[_Placed]] = {}
    for item in placed:
        by_cpu.setdefault(item.cpu, []).append(item)
    results: list[VcpuSupply] = []
    for on_cpu in by_cpu.values():
        results.extend(_per_cpu(model, on_cpu, demand))
    return {result.ref: result for result in results}


def _per_cpu(model: Model, on_cpu: list[_Placed], demand: TaskDemand) -> list[VcpuSupply]:
    """Supply of each vCPU placed on one pCPU, by the hypervisor's scheduler."""
    hv = model.hypervisor
    sched = hv.scheduler
    alone = len(on_cpu) == 1
    if sched == "partitioned" or (alone and (sched in ("credit", "fair") or (sched == "fifo" and hv.server == "none"))):
        # The vCPU's first dispatch on its pCPU pays one VM switch; later ones find it already there.
        return [VcpuSupply(item.ref, item.cpu, _with_quantum(Dedicated(), hv.overheads.vm_switch))
                for item in on_cpu]
    if sched == "fifo" and hv.server == "none":
        return _fifo_leftovers(model, on_cpu, demand)
    if sched == "fifo":
        return _fp_servers(model, on_cpu, lambda v: (v.budget or 0, v.period or 0),
                           lambda v: hv.server == "deferrable")
    if sched == "rtds":
        return _edf_servers(model, on_cpu, _rtds_server,
                            lambda v, budget: PeriodicResource(_rtds_budget(v)[1], budget))
    if sched == "deadline":
        return _deadline_supplies(model, on_cpu)
    if sched in ("sedf", "sedf-prime"):
        return _edf_servers(model, on_cpu,
                            lambda v: (v.slice or 0, v.period or 0, v.period or 0, sched == "sedf-prime"),
                            _sedf_supply(sched))
    if sched == "psedf":
        return _psedf_supplies(model, on_cpu)
    if sched == "arinc653":
        return _window_supplies(model, on_cpu)
    # credit, fair with company on the pCPU
    return [VcpuSupply(item.ref, item.cpu, None, f"{sched} shares pCPU {item.cpu} by weight without a delay "
                       "guarantee; only a vCPU alone on its pCPU is analysed") for item in on_cpu]


def _fifo_leftovers(model: Model, on_cpu: list[_Placed], demand: TaskDemand) -> list[VcpuSupply]:
    """Fixed-priority vCPUs without servers: each gets what its equal- and higher-priority neighbours' tasks leave."""
    switch, quantum = model.hypervisor.overheads.vm_switch, model.hypervisor.quantum
    out = []
    for item in on_cpu:
        higher = tuple(replace(task, wcet=task.wcet + 2 * switch, jitter=task.jitter + quantum)
                       for other in on_cpu if other is not item and other.vcpu.priority >= item.vcpu.priority
                       for task in demand(other.ref))
        # Its own busy window starts with a switch to it (the pCPU ran another vCPU meanwhile).
        own = _with_quantum(Dedicated(), switch)
        out.append(VcpuSupply(item.ref, item.cpu, _with_quantum(LeftoverSupply(higher, own), quantum)))
    return out


def _deadline_supplies(model: Model, on_cpu: list[_Placed]) -> list[VcpuSupply]:
    """SCHED_DEADLINE reservations, and one SCHED_OTHER vCPU beside them (what they leave), or none analysed."""
    reserved = [item for item in on_cpu if item.vcpu.runtime]
    others = [item for item in on_cpu if not item.vcpu.runtime]
    tick = model.hypervisor.enforcement.tick  # runtimes checked at the tick: an overrun of up to a tick

    def reservation(v: VCpu, budget: int) -> Supply:
        supply = ExplicitDeadlinePeriodic(v.period or 0, budget, v.deadline or v.period or 0)
        return OverrunSupply(supply, tick) if tick else supply

    out = _edf_servers(model, reserved,
                       lambda v: (v.runtime or 0, v.deadline or v.period or 0, v.period or 0, False), reservation)
    if len(others) == 1:
        servers = tuple(Task(str(item.ref), item.vcpu.runtime or 0, item.vcpu.period or 0,
                             item.vcpu.deadline or item.vcpu.period or 0,
                             jitter=(item.vcpu.deadline or item.vcpu.period or 0) - (item.vcpu.runtime or 0))
                        for item in reserved)
        out.append(VcpuSupply(others[0].ref, others[0].cpu,
                              _with_quantum(LeftoverSupply(servers), model.hypervisor.quantum)))
    else:
        out.extend(VcpuSupply(item.ref, item.cpu, None, "SCHED_OTHER vCPUs sharing a pCPU have no delay guarantee")
                   for item in others)
    return out


def _psedf_supplies(model: Model, on_cpu: list[_Placed]) -> list[VcpuSupply]:
    """PSEDF: RT domains as deferrable fixed-priority servers; non-RT domains by SEDF when no RT domain is there."""
    realtime = [item for item in on_cpu if item.vcpu.rt]
    rest = [item for item in on_cpu if not item.vcpu.rt]
    out = _fp_servers(model, realtime, lambda v: (v.slice or 0, v.period or 0), lambda v: True)
    if realtime:
        out.extend(VcpuSupply(item.ref, item.cpu, None, "a non-RT domain under PSEDF runs only when no RT domain "
                              "is ready: no guarantee is analysed") for item in rest)
    else:
        out.extend(_edf_servers(model, rest, lambda v: (v.slice or 0, v.period or 0, v.period or 0, False),
                                _sedf_supply("sedf")))
    return out


def _window_supplies(model: Model, on_cpu: list[_Placed]) -> list[VcpuSupply]:
    """ARINC 653: each vCPU is supplied in its windows of the major frame."""
    hv = model.hypervisor
    assert hv.arinc653 is not None
    switch = hv.overheads.vm_switch
    out = []
    for item in on_cpu:
        # Each window starts with a VM switch charged to it.
        windows = tuple((w.start + switch, w.start + w.length) for w in item.vcpu.windows if w.length > switch)
        if not windows:
            out.append(VcpuSupply(item.ref, item.cpu, None, "the vCPU owns no window in the major frame"))
        else:
            # A vCPU woken inside its window pays the switch where it wakes, not at the window start.
            out.append(VcpuSupply(item.ref, item.cpu, _with_quantum(
                WindowSupply(hv.arinc653.major_frame, windows), hv.quantum + switch)))
    return out
