"""End-to-end bounds for synchronous event chains through fixed-priority deferrable servers (the ESC case).

The holistic analysis (``system.py``) treats every stage as a sporadic task with release jitter and every
server's supply at its worst phase. When all chains fire together (one period T, one offset, no source
jitter) and run through domains that hold only their stages, the events can be analysed one at a time.

Setting: hypervisor ``psedf`` (real-time domains) or ``fifo`` with ``server = "deferrable"``. Every vCPU that
runs a stage (a *stage vCPU*) runs nothing else (no other task, no background load, no gap probe), and every
vCPU of equal or higher priority on a stage vCPU's pCPU is itself a stage vCPU; PSEDF non-RT domains (they
run only when no RT domain is ready) and lower-priority vCPUs only ever wait.

Induction on the events. Suppose every stage job of the events before k finished within B of its event,
B < T. Then at kT (event k) no earlier job is pending. For a stage vCPU v with budget Q and period P, the
earlier events' work ended by kT − T + B; its server period containing kT began at least kT − m_v, with
m_v = 0 when P divides T and P − gcd(T, P) otherwise; if B ≤ T − m_v that period's budget is still whole at
kT (deferrable: kept while idle). Event k's jobs on v need D_v = Σ C_j + switch·(own jobs + higher jobs on
its pCPU) (a VM switch is charged to the budget at each start and each resumption after a preemption); if
D_v ≤ Q, no replenishment ever finds v short, so v is never throttled while event k's jobs run and the
pCPU serves stage vCPUs by plain fixed priority. A job j of vCPU v on pCPU c released at the latest l_j
then ends by

    f_j ≤ l_j + quantum + switch + C_j + switch + Σ_{i ∈ I_j} (C_i + 2·switch)

where I_j are the other event-k jobs on c that may run before j ends (those of higher- or equal-priority
stage vCPUs, and those of v that its guest scheduler may run first: all of them for ``fifo`` and ``edf``,
equal or higher priority for ``fp``); each runs at most once per event (one-shot), costing at most two VM
switches; the first ``switch`` covers a switch in progress, the second j's own start. Releases follow the
chains: the first stage at the event plus the interrupt delay, each next one at the previous stage's end
plus the delay (earliest: plus its BCET). B is the largest f_j − kT; the bound holds if B < T, B ≤ T − m_v
and D_v ≤ Q for every stage vCPU, which closes the induction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.loader import home_cpu
from ..model.schema import Model, Task, Vm

__all__ = ["PhasedChains", "phased_chain_bounds"]


@dataclass(frozen=True)
class PhasedChains:
    stage_bound: dict[str, int]  # "vm/task" -> latest finish minus its earliest release (as the holistic bounds)
    stage_release: dict[str, tuple[int, int]]  # earliest, latest release after the event
    chain_bound: dict[str, int]  # end to end, from the event


def _exec(task: Task, worst: bool) -> int:
    if isinstance(task.execution, int):
        return task.execution
    return task.execution.max if worst else task.execution.min


def _server(model: Model, vm: Vm, index: int) -> tuple[int, int] | None:
    vcpu, hv = vm.vcpu[index], model.hypervisor
    if hv.scheduler == "psedf" and vcpu.rt and vcpu.slice and vcpu.period:
        return vcpu.slice, vcpu.period
    if hv.scheduler == "fifo" and hv.server == "deferrable" and vcpu.budget and vcpu.period:
        return vcpu.budget, vcpu.period
    return None


def phased_chain_bounds(model: Model) -> tuple[PhasedChains | None, str]:
    """Bounds by the event-at-a-time argument above, or None and why it does not apply."""
    why_not = _why_not_synchronous(model)
    if why_not:
        return None, why_not
    stages = _Stages(model)
    why_not = _why_not_dedicated(stages)
    if why_not:
        return None, why_not
    release, finish, chain_bound = _one_event(stages)
    why_not = _why_not_closed(stages, max(finish.values()))
    if why_not:
        return None, why_not
    return PhasedChains({s: finish[s] - release[s][0] for s in stages.names}, release, chain_bound), ""


def _why_not_synchronous(model: Model) -> str:
    """Why the model's chains are outside the argument's setting, or "" when they are in it."""
    if not model.chain or model.hypervisor.scheduler not in ("psedf", "fifo"):
        return "needs chains on psedf or fifo servers"
    first = model.chain[0]
    if any(c.period != first.period or c.offset != first.offset or c.jitter for c in model.chain):
        return "chains are not synchronous (one period, one offset, no jitter)"
    return ""


class _Stages:
    """The chains' stages of a model: the vCPU each runs on, what may run before it and what it costs."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tasks = {f"{vm.name}/{t.name}": (vm, t) for vm in model.vm for t in vm.task}
        # in the chains' order, not a set's: a model whose argument fails in two places names the same one each run
        self.names = tuple(dict.fromkeys(stage for chain in model.chain for stage in chain.stages))
        self.vcpus = tuple(dict.fromkeys(self.vcpu_of(stage) for stage in self.names))
        self.vms = {vm.name: vm for vm in model.vm}

    def vcpu_of(self, stage: str) -> tuple[str, int]:
        vm, task = self.tasks[stage]
        return vm.name, task.vcpu

    def above(self, vm: Vm, index: int) -> list[tuple[str, int]]:
        """vCPUs of equal or higher priority on the same pCPU (that may run before it)."""
        vcpu, cpu = vm.vcpu[index], home_cpu(vm, index)
        out = []
        for other in self.model.vm:
            for i, o in enumerate(other.vcpu):
                if (other.name, i) == (vm.name, index) or home_cpu(other, i) != cpu:
                    continue
                if self.model.hypervisor.scheduler == "psedf" and not o.rt:
                    continue
                if o.priority >= vcpu.priority:
                    out.append((other.name, i))
        return out

    def cost(self, stage: str) -> int:
        vm, task = self.tasks[stage]
        alone = sum(t.vcpu == task.vcpu for t in vm.task) == 1
        context = self.model.hypervisor.overheads.context_switch
        return _exec(task, True) + context * (1 if alone else 2)  # as system.py charges guest switches

    def may_precede(self, stage: str) -> list[str]:
        """The other stages that may run on the stage's pCPU before it ends."""
        vm, task = self.tasks[stage]
        ahead = self.above(vm, task.vcpu)
        out = []
        for other in self.names:
            if other == stage:
                continue
            other_task, where = self.tasks[other][1], self.vcpu_of(other)
            same_guest_first = where == (vm.name, task.vcpu) and (vm.scheduler != "fp"
                                                                  or other_task.priority >= task.priority)
            if where in ahead or same_guest_first:
                out.append(other)
        return out


def _why_not_dedicated(stages: _Stages) -> str:
    """Why a stage vCPU, or one that may run before it, is not a server that runs only stages; or ""."""
    for name, index in stages.vcpus:
        vm = stages.vms[name]
        if _server(stages.model, vm, index) is None:
            return f"{name}.vcpu{index} is not a deferrable fixed-priority server"
        if vm.load > 0 or vm.gap is not None or any(f"{vm.name}/{t.name}" not in stages.names for t in vm.task
                                                     if t.vcpu == index):
            return f"{name}.vcpu{index} runs more than chain stages"
    for name, index in stages.vcpus:
        for other in stages.above(stages.vms[name], index):
            if other not in stages.vcpus:
                return f"{other[0]}.vcpu{other[1]} above a stage runs other work"
    return ""


def _one_event(stages: _Stages) -> tuple[dict[str, tuple[int, int]], dict[str, int], dict[str, int]]:
    """Each stage's earliest and latest release and its latest finish after an event, and each chain's bound."""
    overheads = stages.model.hypervisor.overheads
    switch, delay = overheads.vm_switch, overheads.interrupt_delay
    release: dict[str, tuple[int, int]] = {}
    finish: dict[str, int] = {}
    chain_bound: dict[str, int] = {}
    for chain in stages.model.chain:
        earliest = latest = delay
        for stage in chain.stages:
            release[stage] = (earliest, latest)
            interference = sum(stages.cost(other) + 2 * switch for other in stages.may_precede(stage))
            finish[stage] = (latest + stages.model.hypervisor.quantum + 2 * switch + stages.cost(stage)
                             + interference)
            earliest += _exec(stages.tasks[stage][1], False) + delay
            latest = finish[stage] + delay
        chain_bound[chain.name] = finish[chain.stages[-1]]
    return release, finish, chain_bound


def _why_not_closed(stages: _Stages, horizon: int) -> str:
    """Why an event's work (ending ``horizon`` after it) may reach into the next event's, or ""."""
    period, switch = stages.model.chain[0].period, stages.model.hypervisor.overheads.vm_switch
    if horizon >= period:
        return f"an event's work may take {horizon} ns, not less than the chain period {period} ns"
    for name, index in stages.vcpus:
        vm = stages.vms[name]
        budget, server_period = _server(stages.model, vm, index) or (0, 0)
        carry = 0 if period % server_period == 0 else server_period - math.gcd(period, server_period)
        if horizon > period - carry:
            return f"{name}.vcpu{index}: the previous event's work may still use the budget at the next event"
        ahead = stages.above(vm, index)
        own = [s for s in stages.names if stages.vcpu_of(s) == (name, index)]
        higher = [s for s in stages.names if stages.vcpu_of(s) in ahead]
        need = sum(stages.cost(s) for s in own) + switch * (len(own) + len(higher))
        if need > budget:
            return f"{name}.vcpu{index} needs {need} ns per event, more than its budget {budget} ns"
    return ""
