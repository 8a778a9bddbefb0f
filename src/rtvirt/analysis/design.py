"""Design: the smallest budget per vCPU that keeps every guest task schedulable, per hypervisor scheduler.

For each scheduler the designer keeps the model's placement (each vCPU on its home pCPU) and, per vCPU
with guest tasks:

1. picks candidate periods: the vCPU's own period if the model sets one, the shortest task deadline
   D_min, D_min/2, /4, /8 (shorter server periods shrink the blackout, longer ones the overhead) and the
   periods of its already designed real-time neighbours;
2. for each candidate, searches (bisection, 1 us resolution) the smallest budget for which every task of
   the vCPU is schedulable, analysed exactly as ``rtvirt analyze`` would (same overheads), with the vCPU
   alone on its pCPU (EDF-type schedulers, whose servers do not see each other once the pCPU is not
   over-subscribed) or below the already designed higher-priority vCPUs (fixed-priority schedulers,
   priorities deadline-monotonic); the candidate with the smallest bandwidth Q/P wins;
3. gives vCPUs without deadlines (background load) what the pCPU has left (with extratime on RTDS);
4. analyses the whole designed model (chains included): that verdict is the one reported;
5. when that proves nothing and the model itself runs this scheduler, its own vCPU parameters are analysed as a
   whole (the analysis of ``rtvirt analyze``): a configuration proven so is the design (noted as the model's own).

A design is therefore proven by the same analysis as ``rtvirt analyze``, and the designed model can be
written out and simulated (``rtvirt sim``) to check the prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..model.schema import Arinc653Params, Model, VCpu, Vm, Window
from ..model.schema import Task as ModelTask
from .servers import RTDS_DEFAULT_PERIOD
from .system import NO_DEADLINE, SystemAnalysis, analyse_model

__all__ = ["DESIGNABLE", "VcpuDesign", "Design", "design_model", "design_all", "configure_model"]

US = 1_000
MIN_PERIOD = 100 * US
# scheduler label -> (hypervisor scheduler, fixed-priority server or "none")
DESIGNABLE: dict[str, tuple[str, str]] = {
    "partitioned": ("partitioned", "none"),
    "rtds": ("rtds", "none"),
    "deadline": ("deadline", "none"),
    "fifo-deferrable": ("fifo", "deferrable"),
    "fifo-periodic": ("fifo", "periodic"),
    "sedf": ("sedf", "none"),
    "sedf-prime": ("sedf-prime", "none"),
    "psedf": ("psedf", "none"),
    "arinc653": ("arinc653", "none"),
}
_MINIMUM_BUDGET = {"rtds": 10 * US, "deadline": 2 * US}


@dataclass(frozen=True)
class VcpuDesign:
    vm: str
    vcpu: int
    cpu: int
    budget: int | None
    period: int | None
    priority: int = 0
    window: tuple[int, int] | None = None
    realtime: bool = True
    note: str = ""

    @property
    def bandwidth(self) -> float | None:
        return None if not self.budget or not self.period else self.budget / self.period

    def as_dict(self) -> dict[str, Any]:
        return {"vm": self.vm, "vcpu": self.vcpu, "cpu": self.cpu, "budget_ns": self.budget,
                "period_ns": self.period, "priority": self.priority, "realtime": self.realtime,
                "window_ns": None if self.window is None else list(self.window), "bandwidth": self.bandwidth,
                "note": self.note}


@dataclass
class Design:
    label: str
    vcpus: list[VcpuDesign]
    model: Model | None
    analysis: SystemAnalysis | None
    problems: list[str] = field(default_factory=list)

    @property
    def schedulable(self) -> bool:
        return not self.problems and self.analysis is not None and self.analysis.schedulable

    def cpu_bandwidth(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for v in self.vcpus:
            out[v.cpu] = out.get(v.cpu, 0.0) + (v.bandwidth or 0.0)
        return out

    def as_dict(self) -> dict[str, Any]:
        failing = [] if self.analysis is None else [t.as_dict() for t in self.analysis.tasks if not t.schedulable]
        return {"scheduler": self.label, "schedulable": self.schedulable, "problems": self.problems,
                "vcpus": [v.as_dict() for v in self.vcpus],
                "cpu_bandwidth": {str(cpu): bw for cpu, bw in sorted(self.cpu_bandwidth().items())},
                "failing_tasks": failing,
                "failing_chains": [] if self.analysis is None else
                [c.as_dict() for c in self.analysis.chains if not c.schedulable]}


@dataclass(frozen=True)
class _Slot:
    vm: Vm
    index: int
    cpu: int
    tasks: tuple[ModelTask, ...]
    realtime: bool
    tightest: int  # shortest deadline (or period) among its tasks


def _slots(model: Model) -> list[_Slot]:
    chain_of = {stage: chain for chain in model.chain for stage in chain.stages}
    slots = []
    for vm in model.vm:
        for index, vcpu in enumerate(vm.vcpu):
            tasks = tuple(t for t in vm.task if t.vcpu == index)
            spans = []
            for task in tasks:
                chain = chain_of.get(f"{vm.name}/{task.name}")
                period = task.period or task.min_interarrival or (chain.period if chain else None)
                deadline = task.deadline or (period if task.type != "event" else None) or \
                    (chain.deadline if chain else None)
                spans.append(min(x for x in (deadline, period) if x))
            cpu = vcpu.affinity[0] if vcpu.affinity else 0
            slots.append(_Slot(vm, index, cpu, tasks, bool(tasks), min(spans, default=NO_DEADLINE)))
    return slots


def _standalone_tasks(model: Model, slot: _Slot, chain_scale: float = 1.0) -> list[ModelTask]:
    """The vCPU's tasks, event tasks turned into sporadic ones (their chain is not in the small model).

    A chain's end-to-end deadline is shared out: after the stages' own execution and the interrupt delays,
    each stage gets an equal share s; stage k (from 0) is released up to k·s late (jitter) and must finish
    within k·s + s of its earliest release, which keeps the whole chain within its deadline.
    """
    chain_of = {stage: chain for chain in model.chain for stage in chain.stages}
    wcet = {f"{vm.name}/{task.name}": task.execution if isinstance(task.execution, int) else task.execution.max
            for vm in model.vm for task in vm.task}
    delay = model.hypervisor.overheads.interrupt_delay
    out = []
    for task in slot.tasks:
        update: dict[str, Any] = {"vcpu": 0}
        key = f"{slot.vm.name}/{task.name}"
        if task.type == "event":
            chain = chain_of[key]
            end_to_end = int((chain.deadline or chain.period) * chain_scale)
            spare = end_to_end - sum(wcet[stage] + delay for stage in chain.stages)
            share = max(spare // len(chain.stages), 1) // US * US or US
            position = chain.stages.index(key)
            jitter = chain.jitter + position * share
            update |= {"type": "sporadic", "min_interarrival": chain.period, "jitter": jitter,
                       "deadline": min(task.deadline or end_to_end, jitter + share + wcet[key])}
        out.append(task.model_copy(update=update))
    return out


def _window(start: int, length: int) -> Window:
    # The schema reads bare numbers as milliseconds: hand it exact nanoseconds.
    return Window.model_validate({"start": f"{start}ns", "length": f"{length}ns"})


def _server_vcpu(label: str, vcpu: VCpu, cpu: int, budget: int, period: int, priority: int) -> VCpu:
    scheduler = DESIGNABLE[label][0]
    # Start from a clean slate: parameters of the model's own scheduler would contradict the design.
    update: dict[str, Any] = {"affinity": (cpu,), "priority": priority, "budget": None, "slice": None,
                              "runtime": None, "deadline": None, "windows": [], "rt": False, "extratime": False}
    if scheduler in ("rtds", "fifo"):
        update |= {"budget": budget, "period": period}
    elif scheduler == "deadline":
        update |= {"runtime": budget, "period": period, "deadline": None}
    elif scheduler in ("sedf", "sedf-prime", "psedf"):
        update |= {"slice": budget, "period": period, "rt": True}
    elif scheduler == "arinc653":
        update |= {"windows": [_window(0, budget)]}
    return vcpu.model_copy(update=update)


def _hypervisor(model: Model, label: str, frames: dict[int, int] | None = None) -> Any:
    scheduler, server = DESIGNABLE[label]
    update: dict[str, Any] = {"scheduler": scheduler, "server": server, "mode": "partitioned"}
    if scheduler == "arinc653":
        frame = min((frames or {}).values(), default=RTDS_DEFAULT_PERIOD)
        update["arinc653"] = Arinc653Params.model_validate({"major_frame": f"{frame}ns"})
    return model.hypervisor.model_copy(update=update)


def _smallest(predicate: Callable[[int], bool], low: int, high: int) -> int | None:
    """Smallest budget in [low, high] (1 us grid) where the predicate holds, None if none does.

    More budget always helps the vCPU's own tasks, but near a full budget a server may no longer fit below
    higher-priority servers; so the first feasible point is found on a coarse grid of sixteenths first,
    then bisected down from there.
    """
    low, high = -(-low // US), high // US
    if high < low:
        return None
    grid = sorted({max(low, high * k // 16) for k in range(1, 17)})
    below = low - 1
    for point in grid:
        if predicate(point * US):
            high = point
            break
        below = point
    else:
        return None
    low = below + 1
    while low < high:
        middle = (low + high) // 2
        if predicate(middle * US):
            high = middle
        else:
            low = middle + 1
    return low * US


def _candidate_periods(slot: _Slot, label: str, peers: list[VcpuDesign]) -> list[int]:
    """The model's own period (if any), fractions of the tightest deadline, and the periods of the real-time
    neighbours (equal periods keep deferred budgets of EDF servers from piling up at period ends)."""
    vcpu = slot.vm.vcpu[slot.index]
    given = {vcpu.period} if vcpu.period and DESIGNABLE[label][0] != "arinc653" else set()
    base = slot.tightest // US * US
    shared = {peer.period for peer in peers if peer.realtime and peer.period and peer.period <= base}
    return sorted(given | shared | {max(MIN_PERIOD, base // div // US * US) for div in (1, 2, 4, 8)})


def design_model(model: Model, label: str) -> Design:
    """Budgets (or windows) for every vCPU of ``model`` under the scheduler ``label`` (see DESIGNABLE).

    Chains are designed stage by stage with a share of their deadline; when the whole-chain analysis still
    misses, the shares are tightened (80 %, 60 %, 40 % of the deadline) before giving up.
    """
    if label not in DESIGNABLE:
        raise ValueError(f"unknown scheduler {label!r}")
    first = _design(model, label, 1.0)
    if first.schedulable:
        return first
    for scale in (0.8, 0.6, 0.4) if model.chain else ():
        attempt = _design(model, label, scale)
        if attempt.schedulable:
            return attempt
    return _as_given(model, label) or first


def _as_given(model: Model, label: str) -> Design | None:
    """The model's own vCPU parameters, when the model runs ``label``'s scheduler and the whole-model analysis
    proves them: a design too. The search sees one vCPU at a time (chains cut into stages with a share of their
    deadline), so it can miss what the whole model's analysis proves, e.g. the phased-chain bounds of PSEDF's
    event chains (docs/analysis.md); ``rtvirt analyze`` and ``rtvirt design`` then agree on the model itself."""
    scheduler, server = DESIGNABLE[label]
    if model.hypervisor.scheduler != scheduler or (server != "none" and model.hypervisor.server != server):
        return None
    given: dict[tuple[str, int], tuple[int, int, int]] = {}
    for slot in _slots(model):
        vcpu = slot.vm.vcpu[slot.index]
        budget = vcpu.slice or vcpu.budget or vcpu.runtime
        if slot.realtime and budget and vcpu.period:
            given[(slot.vm.name, slot.index)] = (int(budget), int(vcpu.period), vcpu.priority)
    if not given:
        return None
    design = configure_model(model, label, given)
    if not design.schedulable:
        return None
    note = "the model's own: no smaller budget proven one vCPU at a time"
    design.vcpus = [replace(v, note=note) if (v.vm, v.vcpu) in given else v for v in design.vcpus]
    return design


def _design(model: Model, label: str, chain_scale: float) -> Design:
    scheduler = DESIGNABLE[label][0]
    slots = _slots(model)
    if scheduler == "partitioned":
        problems: list[str] = []
        cpus = [slot.cpu for slot in slots]
        duplicates = sorted({cpu for cpu in cpus if cpus.count(cpu) > 1})
        designed = [VcpuDesign(s.vm.name, s.index, s.cpu, None, None, realtime=s.realtime) for s in slots]
        if duplicates:
            problems.append(f"partitioning needs one pCPU per vCPU; pCPU(s) {duplicates} are shared")
            return Design(label, designed, None, None, problems)
        return _finish(model, label, slots, designed, problems)
    fixed_priority = scheduler in ("fifo", "psedf")
    # Deadline-monotonic ranks: the tightest vCPU gets the highest priority.
    ordered = sorted([s for s in slots if s.realtime], key=lambda s: s.tightest)
    ranks = {(s.vm.name, s.index): len(ordered) - position + 1 for position, s in enumerate(ordered)}
    designed_by_slot: dict[tuple[str, int], VcpuDesign] = {}
    peers_of: Callable[[_Slot], list[VcpuDesign]] = lambda slot: [  # noqa: E731 - first pass: higher priority only
        designed_by_slot[(s.vm.name, s.index)] for s in ordered
        if fixed_priority and s.cpu == slot.cpu and (s.vm.name, s.index) in designed_by_slot
        and designed_by_slot[(s.vm.name, s.index)].budget is not None]
    problems = _design_each(model, label, ordered, ranks, peers_of, designed_by_slot, chain_scale)
    designed = [designed_by_slot.get((s.vm.name, s.index)) or _background(s, label, designed_by_slot)
                for s in slots]
    if not fixed_priority and scheduler != "arinc653":
        # EDF servers charge VM switches per possible preemption by the other servers of their pCPU: design
        # again with the first pass's neighbours present.
        first_pass = {(d.vm, d.vcpu): d for d in designed}
        redesigned: dict[tuple[str, int], VcpuDesign] = {}
        problems = _design_each(model, label, ordered, ranks, lambda slot: [
            d for key, d in first_pass.items() if d.cpu == slot.cpu and key != (slot.vm.name, slot.index)
            and d.budget is not None and d.period is not None], redesigned, chain_scale)
        designed = [redesigned.get((d.vm, d.vcpu), d) for d in designed]
    return _finish(model, label, slots, designed, problems)


def _design_each(model: Model, label: str, ordered: list[_Slot], ranks: dict[tuple[str, int], int],
                 peers_of: Callable[[_Slot], list[VcpuDesign]], designed_by_slot: dict[tuple[str, int], VcpuDesign],
                 chain_scale: float) -> list[str]:
    """Smallest-bandwidth (budget, period) per real-time vCPU, next to ``peers_of(slot)`` on its pCPU."""
    scheduler = DESIGNABLE[label][0]
    problems = []
    for slot in ordered:
        key = (slot.vm.name, slot.index)
        peers = peers_of(slot)
        best: VcpuDesign | None = None
        for period in _candidate_periods(slot, label, peers):
            def fits(budget: int, period: int = period, slot: _Slot = slot, priority: int = ranks[key],
                     peers: list[VcpuDesign] = peers) -> bool:
                return _alone_schedulable(model, label, slot, budget, period, priority, peers, chain_scale)

            budget = _smallest(fits, _MINIMUM_BUDGET.get(scheduler, US), period)
            if budget is None:
                continue
            candidate = VcpuDesign(slot.vm.name, slot.index, slot.cpu, budget, period, ranks[key])
            if best is None or (candidate.bandwidth or 0) < (best.bandwidth or 0):
                best = candidate
        if best is None:
            problems.append(f"{slot.vm.name}.vcpu{slot.index}: no budget makes its tasks schedulable under {label} "
                            "(even a full budget)")
            best = VcpuDesign(slot.vm.name, slot.index, slot.cpu, None, None, ranks[key], note="infeasible")
        designed_by_slot[key] = best
    return problems


def _background(slot: _Slot, label: str, designed: dict[tuple[str, int], VcpuDesign]) -> VcpuDesign:
    """A vCPU without deadlines runs on what is left: below every other vCPU where the scheduler has a
    lower level (fixed priority, RTDS extratime, SCHED_OTHER under SCHED_DEADLINE), else with half the
    remaining bandwidth so that the EDF servers keep their guarantee."""
    scheduler = DESIGNABLE[label][0]
    used = sum(d.bandwidth or 0 for d in designed.values() if d.cpu == slot.cpu)
    period = slot.vm.vcpu[slot.index].period or RTDS_DEFAULT_PERIOD
    if scheduler == "rtds":
        return VcpuDesign(slot.vm.name, slot.index, slot.cpu, _MINIMUM_BUDGET["rtds"], period, 0, realtime=False,
                          note="background: minimal budget, runs in extratime")
    if scheduler == "deadline":
        return VcpuDesign(slot.vm.name, slot.index, slot.cpu, None, None, 0, realtime=False,
                          note="background: SCHED_OTHER below every reservation")
    share = 1.0 if scheduler in ("fifo", "psedf", "arinc653") else 0.5
    budget = int(max(0.0, 1 - used) * share * period) // US * US
    note = "background: the pCPU's remaining bandwidth" if budget > 0 else "background: no bandwidth left"
    return VcpuDesign(slot.vm.name, slot.index, slot.cpu, budget or None, period, 0, realtime=False, note=note)


def _alone_schedulable(model: Model, label: str, slot: _Slot, budget: int, period: int, priority: int,
                       peers: list[VcpuDesign], chain_scale: float) -> bool:
    """Whether the vCPU's tasks are schedulable with this budget, alone on a pCPU with ``peers``."""
    vcpu = _server_vcpu(label, slot.vm.vcpu[slot.index], 0, budget, period, priority)
    vms = [slot.vm.model_copy(update={"vcpu": [vcpu], "task": _standalone_tasks(model, slot, chain_scale)})]
    for position, other in enumerate(peers):
        assert other.budget is not None and other.period is not None
        other_vcpu = _server_vcpu(label, VCpu.model_validate({}), 0, other.budget, other.period, other.priority)
        vms.append(Vm.model_validate({"name": f"peer{position}", "vcpu": [other_vcpu]}))
    frames = {0: period}
    small = model.model_copy(update={"hypervisor": _hypervisor(model, label, frames).model_copy(update={"pcpus": 1}),
                                     "vm": vms, "chain": []})
    analysis = analyse_model(small)
    return all(task.schedulable for task in analysis.tasks if task.vm == slot.vm.name)


def _finish(model: Model, label: str, slots: list[_Slot], designed: list[VcpuDesign],
            problems: list[str]) -> Design:
    scheduler = DESIGNABLE[label][0]
    if scheduler == "arinc653":
        designed, frame_problems = _lay_out_windows(designed)
        problems.extend(frame_problems)
    for cpu, bandwidth in _bandwidth(designed).items():
        if bandwidth > 1 + 1e-9:
            problems.append(f"pCPU {cpu} is over-subscribed: the designed budgets need {bandwidth:.3f} of it")
    vms = []
    by_vm: dict[str, list[VcpuDesign]] = {}
    for d in designed:
        by_vm.setdefault(d.vm, []).append(d)
    for vm in model.vm:
        vcpus = []
        for d in sorted(by_vm[vm.name], key=lambda d: d.vcpu):
            original = vm.vcpu[d.vcpu]
            if scheduler == "partitioned":
                vcpus.append(original.model_copy(update={"affinity": (d.cpu,)}))
            elif d.budget is None or d.period is None:
                # No budget: SCHED_OTHER under SCHED_DEADLINE, else the smallest reservation the scheduler takes.
                vcpus.append(original.model_copy(update={"affinity": (d.cpu,), "priority": 0, "rt": False,
                                                         "windows": [], "runtime": None, "deadline": None,
                                                         "budget": _MINIMUM_BUDGET.get(scheduler, 10 * US),
                                                         "slice": 10 * US, "period": RTDS_DEFAULT_PERIOD}))
            else:
                vcpu = _server_vcpu(label, original, d.cpu, d.budget, d.period, d.priority)
                update: dict[str, Any] = {"rt": d.realtime}
                if scheduler == "rtds" and not d.realtime:
                    update["extratime"] = True
                if scheduler == "deadline" and not d.realtime:
                    update |= {"runtime": None, "deadline": None}
                if scheduler == "arinc653" and d.window is not None:
                    update["windows"] = [_window(d.window[0], d.window[1] - d.window[0])]
                vcpus.append(vcpu.model_copy(update=update))
        vms.append(vm.model_copy(update={"vcpu": vcpus}))
    frames = {d.cpu: d.period for d in designed if d.period and d.realtime}
    designed_model = model.model_copy(update={"hypervisor": _hypervisor(model, label, frames), "vm": vms})
    return Design(label, designed, designed_model, analyse_model(designed_model), problems)


def _bandwidth(designed: list[VcpuDesign]) -> dict[int, float]:
    out: dict[int, float] = {}
    for d in designed:
        out[d.cpu] = out.get(d.cpu, 0.0) + (d.bandwidth or 0.0)
    return out


def _lay_out_windows(designed: list[VcpuDesign]) -> tuple[list[VcpuDesign], list[str]]:
    """One window per vCPU in a major frame: the shortest designed period, windows back to back per pCPU."""
    frame = min((d.period for d in designed if d.period and d.realtime), default=RTDS_DEFAULT_PERIOD)
    problems: list[str] = []
    out = []
    cursor: dict[int, int] = {}
    for d in sorted(designed, key=lambda d: not d.realtime):
        if d.budget is None:
            out.append(d)
            continue
        # A window designed for a longer period still works in a shorter frame: rescale the budget.
        length = d.budget if d.period == frame else -(-d.budget * frame // (d.period or frame) // US) * US
        if not d.realtime:
            length = frame - cursor.get(d.cpu, 0)
        start = cursor.get(d.cpu, 0)
        if length <= 0:
            out.append(VcpuDesign(d.vm, d.vcpu, d.cpu, None, frame, d.priority, None, d.realtime, "no window left"))
            continue
        if start + length > frame:
            problems.append(f"{d.vm}.vcpu{d.vcpu}: its window does not fit in the major frame of {frame} ns "
                            f"on pCPU {d.cpu}")
            out.append(VcpuDesign(d.vm, d.vcpu, d.cpu, None, frame, d.priority, None, d.realtime, "no room"))
            continue
        cursor[d.cpu] = start + length
        out.append(VcpuDesign(d.vm, d.vcpu, d.cpu, length, frame, d.priority, (start, start + length), d.realtime,
                              d.note))
    return out, problems


def configure_model(model: Model, label: str, parameters: dict[tuple[str, int], tuple[int, int, int]]) -> Design:
    """The model under scheduler ``label`` with given (budget or slice, period, priority) per (vm, vCPU index),
    e.g. parameters derived by a configuration rule; the other vCPUs run in the background as in a design."""
    slots = _slots(model)
    given = {key: VcpuDesign(key[0], key[1], slot.cpu, budget, period, priority)
             for slot in slots for key, (budget, period, priority) in parameters.items()
             if key == (slot.vm.name, slot.index)}
    designed = [given.get((s.vm.name, s.index)) or _background(s, label, given) for s in slots]
    return _finish(model, label, slots, designed, [])


def design_all(model: Model, labels: list[str] | None = None) -> list[Design]:
    return [design_model(model, label) for label in (labels or list(DESIGNABLE))]
