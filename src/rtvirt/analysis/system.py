"""Whole-model analysis: vCPU supplies, guest tasks against their vCPU's supply, event chains end to end.

Guest tasks (docs/model.md) become sporadic tasks: WCET = the largest execution time plus two guest
context switches (one when the task is alone on its vCPU), period = period or min_interarrival (event
tasks: their chain's period), deadline = the task's deadline or its period (event tasks without one have
none), release jitter = the task's jitter. Background load of a VM is a task of utilisation ``load`` and
period ``load_period`` on every vCPU, below every real task (fp) or with its period as deadline (edf).
Guest schedulers: ``fp`` (preemptive fixed priority, larger first), ``edf``, and ``fifo`` (served in
arrival order: analysed as fixed priority with every other task interfering, which covers any order).

Event chains use holistic analysis (Tindell & Clark, "Holistic schedulability analysis for distributed hard
real-time systems", 1994): stage k+1 is released when stage k completes, after the interrupt delay, so
its earliest release is φ_{k+1} = φ_k + BCET_k + delay and its release jitter J_{k+1} = R_k − BCET_k
(R_k measured from stage k's earliest release). The analysis repeats until the jitters stop changing; the
end-to-end bound from the event's nominal arrival is φ_last + R_last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model.schema import Model, Vm
from ..model.schema import Task as ModelTask
from .automotive import RtDomain, RuleResult, derive_rules
from .edf import edf_demand_test, edf_response_times
from .fp import ResponseBound, fp_analysis
from .phased import phased_chain_bounds
from .servers import VcpuRef, VcpuSupply, vcpu_supplies
from .supply import Supply
from .taskset import Task
from .utilization import utilization_tests

__all__ = ["TaskResult", "ChainResult", "SystemAnalysis", "analyse_model", "derive_automotive", "LOAD_TASK"]

LOAD_TASK = "(load)"
NO_DEADLINE = 2**62
"""Deadline of a task that has none: it never demands by a deadline and, under EDF, runs last."""
_MAX_ROUNDS = 64


@dataclass(frozen=True)
class TaskResult:
    vm: str
    task: str
    vcpu: int
    wcrt: int | None
    deadline: int | None
    method: str
    reason: str = ""

    @property
    def schedulable(self) -> bool:
        return self.wcrt is not None and (self.deadline is None or self.wcrt <= self.deadline)

    @property
    def slack(self) -> int | None:
        return None if self.wcrt is None or self.deadline is None else self.deadline - self.wcrt

    def as_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "task": self.task, "vcpu": self.vcpu, "wcrt_bound_ns": self.wcrt,
                "deadline_ns": self.deadline, "schedulable": self.schedulable, "slack_ns": self.slack,
                "method": self.method, "reason": self.reason}


@dataclass(frozen=True)
class ChainResult:
    name: str
    stages: tuple[str, ...]
    bound: int | None
    deadline: int
    stage_release: tuple[int, ...]
    stage_jitter: tuple[int, ...]
    stage_response: tuple[int | None, ...]

    @property
    def schedulable(self) -> bool:
        return self.bound is not None and self.bound <= self.deadline

    def as_dict(self) -> dict[str, Any]:
        return {"chain": self.name, "stages": list(self.stages), "e2e_bound_ns": self.bound,
                "deadline_ns": self.deadline, "schedulable": self.schedulable,
                "slack_ns": None if self.bound is None else self.deadline - self.bound,
                "stage_earliest_release_ns": list(self.stage_release), "stage_jitter_ns": list(self.stage_jitter),
                "stage_wcrt_ns": list(self.stage_response)}


@dataclass
class SystemAnalysis:
    model: str
    scheduler: str
    supplies: dict[VcpuRef, VcpuSupply]
    tasks: list[TaskResult]
    chains: list[ChainResult]
    utilization: dict[str, dict[str, Any]]
    automotive: dict[str, RuleResult] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def schedulable(self) -> bool:
        return all(task.schedulable for task in self.tasks) and all(chain.schedulable for chain in self.chains)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "hypervisor_scheduler": self.scheduler, "schedulable": self.schedulable,
            "tasks": [task.as_dict() for task in self.tasks],
            "chains": [chain.as_dict() for chain in self.chains],
            "vcpus": [supply.as_dict() for supply in self.supplies.values()],
            "utilization": self.utilization,
            "automotive_rules": None if self.automotive is None else
            {rule: result.as_dict() for rule, result in self.automotive.items()},
            "notes": self.notes,
        }


def _wcet(task: ModelTask) -> int:
    return task.execution if isinstance(task.execution, int) else task.execution.max


def _bcet(task: ModelTask) -> int:
    return task.execution if isinstance(task.execution, int) else task.execution.min


@dataclass(frozen=True)
class _Chains:
    """Which chain (and stage index) releases each event task."""

    stage_of: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, model: Model) -> _Chains:
        return cls({stage: (c, s) for c, chain in enumerate(model.chain) for s, stage in enumerate(chain.stages)})


def _guest_tasks(model: Model, vm: Vm, vcpu: int, jitters: dict[str, int | None], chains: _Chains) -> list[Task]:
    # The guest pays a context switch whenever a job starts or resumes after another job: twice per job
    # when tasks share the vCPU, once when a task is alone on it.
    sharing = sum(task.vcpu == vcpu for task in vm.task) + (vm.load > 0) > 1
    switch = model.hypervisor.overheads.context_switch * (2 if sharing else 1)
    tasks = []
    for task in vm.task:
        if task.vcpu != vcpu:
            continue
        key = f"{vm.name}/{task.name}"
        if task.type == "event":
            chain = model.chain[chains.stage_of[key][0]]
            stage_jitter = jitters.get(key, chain.jitter)
            if stage_jitter is None:  # an earlier stage has no bound: this one cannot be released predictably
                continue
            period, jitter = chain.period, stage_jitter
        else:
            given = task.period if task.type == "periodic" else task.min_interarrival
            assert given is not None  # the loader rejects tasks without one
            period, jitter = given, task.jitter
        deadline = task.deadline or (period if task.type != "event" else NO_DEADLINE)
        tasks.append(Task(task.name, _wcet(task) + switch, period, deadline, jitter=jitter,
                          priority=task.priority, bcet=_bcet(task)))
    if vm.load > 0:
        load_wcet = round(vm.load * vm.load_period)
        if load_wcet > 0:
            lowest = min((task.priority for task in tasks), default=0) - 1
            # load jobs are simulated like any job, so they pay the guest's context switch too
            tasks.append(Task(LOAD_TASK, load_wcet + switch, vm.load_period, vm.load_period, priority=lowest))
    return tasks


def _analyse_guest(scheduler: str, tasks: Sequence[Task], supply: Supply) -> list[ResponseBound]:
    if scheduler == "edf":
        return edf_response_times(tasks, supply)
    if scheduler == "fifo":
        return fp_analysis([Task(t.name, t.wcet, t.period, t.deadline, t.jitter, t.blocking, 0, t.bcet)
                            for t in tasks], supply)
    return fp_analysis(tasks, supply)


def derive_automotive(model: Model, job_overhead: int = 0) -> dict[str, RuleResult] | None:
    """Apply the automotive rules when chains run driver → RT domain (→ driver) as in the study.

    ``job_overhead`` is added to every job's WCET (e_i and each pass of e_N): the rules' slices then also
    cover the switch costs a simulated or real system charges per job."""
    domains = []
    driver_costs = []
    for chain in model.chain:
        if len(chain.stages) < 2:
            return None
        vms = [stage.split("/", 1)[0] for stage in chain.stages]
        rt_vm = vms[1]
        task_name = chain.stages[1].split("/", 1)[1]
        vm = next(vm for vm in model.vm if vm.name == rt_vm)
        task = next(task for task in vm.task if task.name == task_name)
        domains.append(RtDomain(f"{rt_vm}/{task_name}", _wcet(task) + job_overhead, chain.deadline or chain.period,
                                chain.period))
        # e_N: the driver's work per packet, every pass through it (in and out) counted.
        driver_vm = next(v for v in model.vm if v.name == vms[0])
        driver_costs.append(sum(_wcet(t) + job_overhead for t in driver_vm.task
                                if f"{driver_vm.name}/{t.name}" in chain.stages))
    if not domains:
        return None
    return derive_rules(domains, max(driver_costs))


def analyse_model(model: Model) -> SystemAnalysis:
    """Every guest task's response bound, every chain's end-to-end bound, and the supplies behind them."""
    chains = _Chains.of(model)
    jitters: dict[str, int | None] = {}
    delay = model.hypervisor.overheads.interrupt_delay
    for _ in range(_MAX_ROUNDS):
        def demand(ref: VcpuRef, jitters: dict[str, int | None] = jitters) -> list[Task]:
            vm = next(vm for vm in model.vm if vm.name == ref.vm)
            return _guest_tasks(model, vm, ref.index, jitters, chains)

        supplies = vcpu_supplies(model, demand)
        results: list[TaskResult] = []
        response_of: dict[str, int | None] = {}
        utilization: dict[str, dict[str, Any]] = {}
        for vm in model.vm:
            for index in range(len(vm.vcpu)):
                tasks = demand(VcpuRef(vm.name, index))
                if not tasks:
                    continue
                vcpu_supply = supplies[VcpuRef(vm.name, index)]
                method = {"edf": "edf-spuri", "fifo": "fifo-window"}.get(vm.scheduler, "fp-rta")
                if vcpu_supply.supply is None:
                    bounds = [ResponseBound(task, None, vcpu_supply.reason) for task in tasks]
                else:
                    bounds = _analyse_guest(vm.scheduler, tasks, vcpu_supply.supply)
                    verdict = utilization_tests(tasks, float(vcpu_supply.supply.rate))
                    utilization[f"{vm.name}.vcpu{index}"] = {
                        **verdict.as_dict(), "supply_rate": float(vcpu_supply.supply.rate),
                        **({"edf_demand_test": edf_demand_test(
                            [t for t in tasks if t.deadline != NO_DEADLINE], vcpu_supply.supply).schedulable}
                           if vm.scheduler == "edf" else {})}
                for bound in bounds:
                    if bound.task.name == LOAD_TASK:
                        continue
                    response_of[f"{vm.name}/{bound.task.name}"] = bound.wcrt
                    deadline = None if bound.task.deadline == NO_DEADLINE else bound.task.deadline
                    results.append(TaskResult(vm.name, bound.task.name, index, bound.wcrt, deadline,
                                              method, bound.reason))
        for vm in model.vm:
            for task in vm.task:
                if f"{vm.name}/{task.name}" not in response_of:
                    response_of[f"{vm.name}/{task.name}"] = None
                    results.append(TaskResult(vm.name, task.name, task.vcpu, None, task.deadline, "holistic",
                                              "an earlier stage of its chain has no bound"))
        chain_results, next_jitters = _chain_bounds(model, response_of, delay)
        if next_jitters == jitters:
            break
        jitters = next_jitters
    else:
        for result in list(results):
            if f"{result.vm}/{result.task}" in chains.stage_of:
                results[results.index(result)] = TaskResult(result.vm, result.task, result.vcpu, None,
                                                             result.deadline, result.method,
                                                             "chain jitters did not converge")
        chain_results = [ChainResult(c.name, c.stages, None, c.deadline, c.stage_release, c.stage_jitter,
                                     c.stage_response) for c in chain_results]
    tainted = _taint_unbounded_stages(model, results, supplies)
    if tainted != results:
        results = tainted
        chain_results, _ = _chain_bounds(model, {f"{r.vm}/{r.task}": r.wcrt for r in results}, delay)
    results, chain_results = _with_phased(model, results, chain_results)
    return SystemAnalysis(model.name, model.hypervisor.scheduler, supplies, results, chain_results, utilization,
                          derive_automotive(model) if model.chain else None)


def _with_phased(model: Model, results: list[TaskResult],
                 chains: list[ChainResult]) -> tuple[list[TaskResult], list[ChainResult]]:
    """Where the event-at-a-time argument applies (``phased.py``), its bounds replace larger or missing ones."""
    phased, _ = phased_chain_bounds(model)
    if phased is None:
        return results, chains
    tasks = []
    for r in results:
        bound = phased.stage_bound.get(f"{r.vm}/{r.task}")
        if bound is not None and (r.wcrt is None or bound < r.wcrt):
            r = TaskResult(r.vm, r.task, r.vcpu, bound, r.deadline, "phased-chains")
        tasks.append(r)
    out = []
    for c in chains:
        bound = phased.chain_bound[c.name]
        if c.bound is None or bound < c.bound:
            c = ChainResult(c.name, c.stages, bound, c.deadline,
                            tuple(phased.stage_release[s][0] for s in c.stages),
                            tuple(phased.stage_release[s][1] - phased.stage_release[s][0] for s in c.stages),
                            tuple(phased.stage_bound[s] for s in c.stages))
        out.append(c)
    return tasks, out


def _taint_unbounded_stages(model: Model, results: list[TaskResult],
                            supplies: dict[VcpuRef, VcpuSupply]) -> list[TaskResult]:
    """A stage whose release jitter has no bound may load its pCPU at any moment: nothing sharing that pCPU
    (or, when placement is global, any pCPU) keeps a bound."""
    cpu_of = {(ref.vm, ref.index): supply.cpu for ref, supply in supplies.items()}
    unbounded = {(r.vm, r.vcpu) for r in results if r.method == "holistic" and r.wcrt is None}
    cpus = {cpu_of[key] for key in unbounded}
    if not cpus:
        return results
    tainted = []
    for r in results:
        cpu = cpu_of[(r.vm, r.vcpu)]
        if r.wcrt is not None and (cpu in cpus or None in cpus):
            r = TaskResult(r.vm, r.task, r.vcpu, None, r.deadline, r.method,
                           f"shares pCPU {cpu} with a chain stage whose release has no bound")
        tainted.append(r)
    return tainted


def _chain_bounds(model: Model, response_of: dict[str, int | None],
                  delay: int) -> tuple[list[ChainResult], dict[str, int | None]]:
    bcet = {f"{vm.name}/{task.name}": _bcet(task) for vm in model.vm for task in vm.task}
    results = []
    jitters: dict[str, int | None] = {}
    for chain in model.chain:
        earliest = delay
        jitter = chain.jitter
        releases, stage_jitters, responses = [], [], []
        bound: int | None = None
        for stage in chain.stages:
            jitters[stage] = jitter
            releases.append(earliest)
            stage_jitters.append(jitter)
            response = response_of.get(stage)
            responses.append(response)
            if response is None:
                bound = None
                for later in chain.stages[len(responses):]:
                    jitters[later] = None
                break
            bound = earliest + response
            jitter = max(0, response - bcet[stage])
            earliest += bcet[stage] + delay
        results.append(ChainResult(chain.name, tuple(chain.stages), bound, chain.deadline or chain.period,
                                   tuple(releases), tuple(stage_jitters), tuple(responses)))
    return results, jitters
