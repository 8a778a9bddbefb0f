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
  EDF of deferrable servers per pCPU. Budgets are guaranteed if the servers pass the EDF demand test with
  release jitter P − Q (deferred budgets); each vCPU then has the periodic resource Γ(P, Q).
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..model.schema import Model, VCpu, Vm
from .edf import edf_demand_test
from .supply import (
    Dedicated,
    DelayedSupply,
    ExplicitDeadlinePeriodic,
    LeftoverSupply,
    PeriodicResource,
    Supply,
    WindowSupply,
)
from .taskset import Task, ceil_div

__all__ = ["VcpuRef", "VcpuSupply", "vcpu_supplies", "RTDS_DEFAULT_BUDGET", "RTDS_DEFAULT_PERIOD"]

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


def _edf_servers(model: Model, on_cpu: list[_Placed], params: Callable[[VCpu], tuple[int, int, int, int]],
                 supply_of: Callable[[VCpu, int], Supply]) -> list[VcpuSupply]:
    """EDF of servers (budget, deadline, period, release jitter): guaranteed iff their demand fits the pCPU."""
    hv = model.hypervisor
    switch, quantum = hv.overheads.vm_switch, hv.quantum
    servers = [Task(str(item.ref), params(item.vcpu)[0], params(item.vcpu)[2], params(item.vcpu)[1],
                    jitter=params(item.vcpu)[3] + quantum) for item in on_cpu]
    verdict = edf_demand_test(servers)
    results = []
    for item, server in zip(on_cpu, servers, strict=True):
        # Switches are charged to the budget: once per period and once per possible preemption by another
        # server's job inside that period.
        preemptions = sum(ceil_div(server.period + other.jitter, other.period) for other in servers
                          if other is not server)
        budget = server.wcet - switch * (1 + preemptions)
        if not verdict.schedulable:
            results.append(VcpuSupply(item.ref, item.cpu, None, f"the servers on pCPU {item.cpu} are not EDF-"
                                      f"schedulable ({verdict.reason}): budgets are not guaranteed"))
        elif budget <= 0:
            results.append(VcpuSupply(item.ref, item.cpu, None, "VM switches eat the whole budget"))
        else:
            results.append(VcpuSupply(item.ref, item.cpu, _with_quantum(supply_of(item.vcpu, budget), quantum)))
    return results


def _rtds_budget(vcpu: VCpu) -> tuple[int, int]:
    return vcpu.budget or RTDS_DEFAULT_BUDGET, vcpu.period or RTDS_DEFAULT_PERIOD


def _rtds_server(vcpu: VCpu) -> tuple[int, int, int, int]:
    """(budget, deadline, period, jitter): a deferrable budget may start as late as P − Q."""
    budget, period = _rtds_budget(vcpu)
    return budget, period, period, period - budget


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
                supply = Dedicated()
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
    hv = model.hypervisor
    sched = hv.scheduler
    quantum = hv.quantum
    alone = len(on_cpu) == 1
    if sched == "partitioned" or (alone and sched in ("fifo", "credit", "fair")):
        return [VcpuSupply(item.ref, item.cpu, Dedicated()) for item in on_cpu]
    if sched == "fifo" and hv.server == "none":
        out = []
        for item in on_cpu:
            switch = hv.overheads.vm_switch
            higher = tuple(replace(task, wcet=task.wcet + 2 * switch, jitter=task.jitter + quantum)
                           for other in on_cpu if other is not item and other.vcpu.priority >= item.vcpu.priority
                           for task in demand(other.ref))
            out.append(VcpuSupply(item.ref, item.cpu, _with_quantum(LeftoverSupply(higher), quantum)))
        return out
    if sched == "fifo":
        return _fp_servers(model, on_cpu, lambda v: (v.budget or 0, v.period or 0),
                           lambda v: hv.server == "deferrable")
    if sched == "rtds":
        return _edf_servers(model, on_cpu, _rtds_server,
                            lambda v, budget: PeriodicResource(_rtds_budget(v)[1], budget))
    if sched == "deadline":
        reserved = [item for item in on_cpu if item.vcpu.runtime]
        others = [item for item in on_cpu if not item.vcpu.runtime]
        out = _edf_servers(model, reserved,
                           lambda v: (v.runtime or 0, v.deadline or v.period or 0, v.period or 0, 0),
                           lambda v, budget: ExplicitDeadlinePeriodic(v.period or 0, budget,
                                                                      v.deadline or v.period or 0))
        if len(others) == 1:
            servers = tuple(Task(str(item.ref), item.vcpu.runtime or 0, item.vcpu.period or 0,
                                 item.vcpu.deadline or item.vcpu.period or 0,
                                 jitter=(item.vcpu.deadline or item.vcpu.period or 0) - (item.vcpu.runtime or 0))
                            for item in reserved)
            out.append(VcpuSupply(others[0].ref, others[0].cpu, _with_quantum(LeftoverSupply(servers), quantum)))
        else:
            out.extend(VcpuSupply(item.ref, item.cpu, None, "SCHED_OTHER vCPUs sharing a pCPU have no delay guarantee")
                       for item in others)
        return out
    if sched in ("sedf", "sedf-prime"):
        return _edf_servers(model, on_cpu,
                            lambda v: (v.slice or 0, v.period or 0, v.period or 0,
                                       0 if sched == "sedf" else (v.period or 0) - (v.slice or 0)),
                            _sedf_supply(sched))
    if sched == "psedf":
        realtime = [item for item in on_cpu if item.vcpu.rt]
        rest = [item for item in on_cpu if not item.vcpu.rt]
        out = _fp_servers(model, realtime, lambda v: (v.slice or 0, v.period or 0), lambda v: True)
        if realtime:
            out.extend(VcpuSupply(item.ref, item.cpu, None, "a non-RT domain under PSEDF runs only when no RT domain "
                                  "is ready: no guarantee is analysed") for item in rest)
        else:
            out.extend(_edf_servers(model, rest, lambda v: (v.slice or 0, v.period or 0, v.period or 0, 0),
                                    _sedf_supply("sedf")))
        return out
    if sched == "arinc653":
        assert hv.arinc653 is not None
        out = []
        for item in on_cpu:
            # Each window starts with a VM switch charged to it.
            switch = hv.overheads.vm_switch
            windows = tuple((w.start + switch, w.start + w.length) for w in item.vcpu.windows
                            if w.length > switch)
            if not windows:
                out.append(VcpuSupply(item.ref, item.cpu, None, "the vCPU owns no window in the major frame"))
            else:
                out.append(VcpuSupply(item.ref, item.cpu, _with_quantum(
                    WindowSupply(hv.arinc653.major_frame, windows), quantum)))
        return out
    # credit, fair with company on the pCPU
    return [VcpuSupply(item.ref, item.cpu, None, f"{sched} shares pCPU {item.cpu} by weight without a delay "
                       "guarantee; only a vCPU alone on its pCPU is analysed") for item in on_cpu]
