"""From a measured configuration to a simulation model: what each environment, probe and stressor *is*.

- host, or a partition without bandwidth, probe at SCHED_FIFO: a dedicated CPU (``partitioned``);
- partition with CPU bandwidth quota/period: a server of budget quota per period on a ``fifo`` CPU (CFS/RT
  bandwidth is refilled every period and usable anywhere in it: a deferrable server);
- partition with SCHED_DEADLINE runtime/period: a constant-bandwidth server (``deadline``);
- qemu/libvirt vCPU threads at fifo:p / deadline / other: ``fifo`` with vCPU priority p / ``deadline`` / ``fair``;
- xen domU under rtds / credit / null: ``rtds`` (budget, period, extratime) / ``credit`` (weight, cap) /
  ``partitioned``;
- timer probe: a periodic task (period = interval, execution = probe_cost), compared by start - arrival;
- gap probe: ``[vm.gap]`` on the measured vCPU, compared by gap length;
- stressors on the measured core: a VM on the same CPU with background load (duty slice/period, or 100 %)
  at the stressor's priority.

Stressors on other cores or in other VMs on other cores do not interfere in the model (it has no caches,
memory bus or interrupts): the derivation says so in its notes rather than inventing an effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..environments.base import EnvironmentConfig
from ..model import Model, model_from_dict
from ..scenario.schema import NamedWorkload, StressorUse
from ..units import parse_duration
from . import PredictSpec
from .tick import EnforcementTick

__all__ = ["Derived", "NotPredictable", "derive_model", "PROBE_VM"]

PROBE_VM = "probe"
_LOAD_PERIOD = 10_000_000  # ns: background load of a spinning stressor, in 10 ms pieces (any value gives 100 %)


class NotPredictable(Exception):
    """The configuration has no model (a probe or platform the model cannot express); the text says why."""


@dataclass
class Derived:
    model: Model
    compare: str  # the simulated record kind matched with the measurement ("probe/timer", "gap:probe.0")
    metric: str  # "latency" (start - arrival of a job) or "gap" (gap length)
    mapping: list[str] = field(default_factory=list)  # one line per decision, for the report
    notes: list[str] = field(default_factory=list)  # what the model leaves out


@dataclass
class _Platform:
    hypervisor: dict[str, Any]
    vcpus: list[dict[str, Any]]  # the probe VM's vCPUs, vCPU 0 carries the probe
    stress_vcpu: dict[str, Any]  # template for a same-core stressor's vCPU (without priority)
    guest_priority: int  # the probe task's priority inside its VM
    mapping: list[str]
    notes: list[str]


def _probe_priority(env: EnvironmentConfig, params: dict[str, Any]) -> int:
    """The probe's SCHED_FIFO priority as the run sets it (0 = SCHED_OTHER)."""
    sched = getattr(env, "sched", None)
    if env.kind == "partition" and sched is not None:
        return sched.priority if sched.policy == "fifo" else 0
    return int(params.get("priority", 99))


def _host_like(env: EnvironmentConfig, priority: int, crowded: bool, what: str) -> _Platform:
    if not crowded and priority > 0:
        return _Platform({"scheduler": "partitioned"}, [{"affinity": [0]}], {}, 99,
                         [f"{what}: the probe at SCHED_FIFO {priority} owns its CPU -> dedicated CPU "
                          "(partitioned)"], [])
    if priority > 0:
        return _Platform({"scheduler": "fifo"}, [{"affinity": [0], "priority": priority}], {"affinity": [0]}, 99,
                         [f"{what}: SCHED_FIFO {priority} threads on one CPU -> fixed priority over vCPUs (fifo)"], [])
    return _Platform({"scheduler": "fair"}, [{"affinity": [0]}], {"affinity": [0]}, 99,
                     [f"{what}: SCHED_OTHER threads on one CPU -> weighted round robin (fair, 4 ms turns)"],
                     ["CFS is modelled as weighted round robin, not by virtual runtime"])


def _deadline_enforcement(tick: EnforcementTick | None) -> tuple[dict[str, Any], list[str], list[str]]:
    """The hypervisor table's enforcement, its mapping line and notes, for SCHED_DEADLINE on the measured
    kernel: at its tick (and where it falls in the period, when measured), or exact when nothing says so.

    The model charges runtime only while its reservation is seen running: the runtime the kernel charged
    unseen each resumption moves the model's ticks that much later, where the kernel's accounting sees them."""
    if tick is None:
        return {}, [], ["SCHED_DEADLINE runtimes modelled as enforced exactly: the measured kernel's tick is "
                        "not known (HZ not in its audit) or HRTICK_DL is on"]
    phase = tick.measured
    enforcement: dict[str, Any] = {"tick": f"{tick.tick_ns}ns", "phase": "0ns"}
    if phase is not None:
        enforcement["phase"] = f"{(phase.phase_ns + phase.unseen_charge_ns) % tick.tick_ns}ns"
        enforcement["resume_latencies"] = [f"{latency}ns" for latency in phase.resume_latencies_ns]
    return {"enforcement": enforcement}, [f"SCHED_DEADLINE {tick.describe()}"], []


def _partition(env: Any, priority: int, crowded: bool, tick: EnforcementTick | None) -> _Platform:
    label = f"partition {env.label}"
    if env.sched.policy == "deadline":
        enforcement, lines, notes = _deadline_enforcement(tick)
        return _Platform({"scheduler": "deadline", **enforcement},
                         [{"runtime": f"{env.sched.runtime}ns", "period": f"{env.sched.period}ns"}], {}, 99,
                         [f"{label}: SCHED_DEADLINE runtime {env.sched.runtime / 1e6:g} ms / period "
                          f"{env.sched.period / 1e6:g} ms -> constant-bandwidth server (deadline)", *lines], notes)
    if env.quota is not None:
        mapping = [f"{label}: CPU bandwidth {env.quota / 1e6:g} ms per {env.period / 1e6:g} ms -> deferrable "
                   "server on a fixed-priority CPU (fifo, server deferrable)"]
        notes = ["cgroup bandwidth is enforced at the scheduler tick: a group may overrun its quota by up to a "
                 "tick (the model enforces it exactly)"]
        if priority == 0:
            notes.append("SCHED_OTHER inside the quota: other SCHED_OTHER work on the CPU shares it by CFS, "
                         "modelled with the partition above it")
        return _Platform({"scheduler": "fifo", "server": "deferrable"},
                         [{"affinity": [0], "priority": max(priority, 1), "budget": f"{env.quota}ns",
                           "period": f"{env.period}ns"}],
                         {"affinity": [0], "budget": f"{env.period}ns", "period": f"{env.period}ns"}, 99,
                         mapping, notes)
    return _host_like(env, priority, crowded, label)


def _vcpu_cpus(env: Any) -> list[int]:
    """Model pCPU index of each vCPU: vCPU i on the i-th of the environment's CPUs (cycling), as they pin."""
    cpus = list(env.cpus) if env.cpus else [0]
    index = {cpu: i for i, cpu in enumerate(dict.fromkeys(cpus))}
    return [index[cpus[i % len(cpus)]] for i in range(env.vcpus)]


def _kvm_guest(env: Any, policy: str, priority: int, deadline: tuple[int, int] | None,
               tick: EnforcementTick | None = None) -> _Platform:
    cpus = _vcpu_cpus(env)
    label = f"{env.kind} {env.label}"
    notes = ["the guest kernel, QEMU's device emulation and the exits of a virtualised CPU are not modelled"]
    if deadline is not None:
        runtime, period = deadline
        enforcement, lines, tick_notes = _deadline_enforcement(tick)
        return _Platform({"scheduler": "deadline", "pcpus": max(cpus) + 1, **enforcement},
                         [{"affinity": [c], "runtime": f"{runtime}ns", "period": f"{period}ns"} for c in cpus],
                         {}, 99, [f"{label}: vCPU threads at SCHED_DEADLINE {runtime / 1e6:g}/{period / 1e6:g} ms "
                                  "-> constant-bandwidth servers (deadline)", *lines], [*notes, *tick_notes])
    if policy in ("fifo", "rr"):
        return _Platform({"scheduler": "fifo", "pcpus": max(cpus) + 1},
                         [{"affinity": [c], "priority": priority} for c in cpus], {}, 99,
                         [f"{label}: vCPU threads at SCHED_{policy.upper()} {priority} -> fixed priority over "
                          "vCPUs (fifo)"], notes)
    return _Platform({"scheduler": "fair", "pcpus": max(cpus) + 1}, [{"affinity": [c]} for c in cpus], {}, 99,
                     [f"{label}: vCPU threads at SCHED_OTHER -> weighted round robin (fair)"],
                     [*notes, "CFS is modelled as weighted round robin, not by virtual runtime"])


def _xen(env: Any) -> _Platform:
    vcpus = env.vcpus
    label = f"xen {env.label}"
    notes = ["Xen's own overheads (hypercalls, event channels, dom0) are not modelled"]
    affinity = [list(env.affinity[i % len(env.affinity)])[:1] for i in range(vcpus)] if env.affinity else \
        [[0]] * vcpus
    base = {cpu for a in affinity for cpu in a}
    remap = {cpu: i for i, cpu in enumerate(sorted(base))}
    affinity = [[remap[a[0]]] for a in affinity]
    pcpus = len(base)
    if env.scheduler == "rtds":
        params = env.rtds if isinstance(env.rtds, list) else [env.rtds] * vcpus
        out = []
        for i in range(vcpus):
            p = params[i % len(params)]
            out.append({"affinity": affinity[i]} if p is None else
                       {"affinity": affinity[i], "budget": f"{p.budget}ns", "period": f"{p.period}ns",
                        "extratime": p.extratime})
        # disturbing domUs get stressor_rtds, else Xen's default reservation (4 ms every 10 ms)
        stress = env.stressor_rtds
        stress_vcpu = {"budget": "4ms", "period": "10ms"} if stress is None else \
            {"budget": f"{stress.budget}ns", "period": f"{stress.period}ns", "extratime": stress.extratime}
        return _Platform({"scheduler": "rtds", "pcpus": pcpus, "mode": "partitioned"}, out,
                         stress_vcpu, 99,
                         [f"{label}: RTDS budget/period per vCPU -> rtds (partitioned on the first pCPU of each "
                          "affinity)"], notes)
    if env.scheduler == "null":
        return _Platform({"scheduler": "partitioned", "pcpus": pcpus}, [{"affinity": a} for a in affinity], {}, 99,
                         [f"{label}: null scheduler -> partitioned"], notes)
    credit = env.credit
    weight, cap = (credit.weight, credit.cap) if credit is not None else (256, 0)
    return _Platform({"scheduler": "credit", "pcpus": pcpus},
                     [{"affinity": a, "weight": weight, "cap": min(cap, 100)} for a in affinity], {"weight": 256}, 99,
                     [f"{label}: {env.scheduler} weight {weight} cap {cap} -> credit"],
                     [*notes, *(["credit2 is modelled by credit1 rules"] if env.scheduler != "credit" else [])])


def _platform(env: Any, priority: int, crowded: bool, tick: EnforcementTick | None) -> _Platform:
    if env.kind == "host":
        return _host_like(env, priority, crowded, f"host {env.label}")
    if env.kind == "partition":
        return _partition(env, priority, crowded, tick)
    if env.kind == "qemu":
        sched = env.vcpu_sched
        deadline = (sched.runtime, sched.period) if sched.policy == "deadline" else None
        return _kvm_guest(env, sched.policy, sched.priority, deadline, tick)
    if env.kind == "libvirt":
        platform = _kvm_guest(env, env.vcpu_sched.policy, env.vcpu_sched.priority, None)
        if env.cputune:
            platform.notes.append("the raw <cputune> XML (vcpu_period/vcpu_quota, vcpusched) is not read: the "
                                  "model follows vcpu_sched only")
        return platform
    if env.kind == "xen":
        return _xen(env)
    raise NotPredictable(f"environment kind {env.kind!r} has no model mapping (its platform is not known here)")


def _stressor_vm(index: int, use: StressorUse, platform: _Platform, cpu: int) -> tuple[dict[str, Any], str]:
    params = use.params
    slice_, period = params.get("slice"), params.get("period")
    priority = int(params.get("priority", 0))
    if use.stressor == "cpu" and slice_ and period:
        slice_ns, period_ns = parse_duration(slice_, "us"), parse_duration(period, "us")
        load, load_period = min(1.0, slice_ns / period_ns), period_ns
        what = f"{slice_ns / 1e6:g} ms every {period_ns / 1e6:g} ms"
    else:
        load, load_period = 1.0, _LOAD_PERIOD
        what = "100 % CPU"
    vcpu = {**platform.stress_vcpu, "affinity": [cpu]}
    scheduler = platform.hypervisor["scheduler"]
    policy = f"SCHED_FIFO {priority}" if priority else "SCHED_OTHER"
    if scheduler == "fifo":
        # SCHED_FIFO never preempts an equal priority, the model's fifo lets the earlier vCPU (the probe) win:
        # an equal-priority stressor is placed just above the probe, which delays a waking probe the same way
        probe = int(platform.vcpus[0].get("priority", 0))
        vcpu["priority"] = priority + 1 if priority and priority >= probe else priority
        if priority and priority == probe:
            policy += " (equal to the probe's: modelled one above it)"
    # any number of workers on one CPU add up to at most that CPU: one vCPU with the load
    vm = {"name": f"stress{index}", "vcpu": [vcpu], "load": load, "load_period": f"{load_period}ns"}
    return vm, f"stressor {use.stressor} ({use.where}, {policy}): background load {what} on the measured CPU"


def _shares_measured_cpu(env: Any, use: StressorUse) -> bool:
    """Whether a stressor competes for the measured CPU (the model holds only that CPU's contention)."""
    if use.where in ("same-core", "all-cores"):
        return True
    if use.where != "other-vm":
        return False
    if env.kind == "xen":  # disturbing domUs go on stressor_cpus, by default the measuring domU's own pCPUs
        measured = {cpu for cpus in env.affinity for cpu in cpus} if env.affinity else set(env.cpus or ())
        return env.stressor_cpus is None or not measured or bool(measured & set(env.stressor_cpus))
    return use.guest_cpus == "same-core"


def derive_model(env: EnvironmentConfig, workload: NamedWorkload, stressors: list[StressorUse],
                 duration_ns: int, spec: PredictSpec, name: str = "derived",
                 tick: EnforcementTick | None = None) -> Derived:
    """The model of one measured configuration; raises NotPredictable with the reason when there is none.
    ``tick``: the measured kernel's enforcement tick (:mod:`.tick`), None where budgets are exact."""
    params = workload.params
    same_core = [u for u in stressors if _shares_measured_cpu(env, u)]
    priority = _probe_priority(env, params)
    platform = _platform(env, priority, bool(same_core), tick)
    mapping, notes = list(platform.mapping), list(platform.notes)
    probe_vm: dict[str, Any] = {"name": PROBE_VM, "scheduler": "fp", "vcpu": platform.vcpus}
    if workload.probe == "timer":
        interval = parse_duration(params.get("interval", "1ms"), "us")
        probe_vm["task"] = [{"name": "timer", "period": f"{interval}ns", "execution": f"{spec.probe_cost}ns",
                             "priority": platform.guest_priority, "deadline": f"{interval}ns"}]
        compare, metric = f"{PROBE_VM}/timer", "latency"
        mapping.append(f"timer probe: periodic task every {interval / 1e6:g} ms, {spec.probe_cost / 1e3:g} us per "
                       "wake-up; latency = start - planned wake-up")
        notes.append("the wake-up path itself (timer interrupt, scheduler, context switch) costs nothing in the "
                     "model: every measured latency carries it on top")
        if int(params.get("threads", 1)) > 1:
            notes.append("only the first probe thread is modelled")
    elif workload.probe == "gap":
        threshold = parse_duration(params.get("threshold", "1us"), "ns")
        probe_vm["gap"] = {"vcpu": 0, "threshold": f"{threshold}ns"}
        compare, metric = f"gap:{PROBE_VM}.0", "gap"
        mapping.append(f"gap probe: [vm.gap] on vCPU 0, threshold {threshold / 1e3:g} us")
        if params.get("work"):
            raise NotPredictable("gap probe with --work measures busy-work durations, which the model has no "
                                 "cost for")
    else:
        raise NotPredictable(f"probe {workload.probe!r} has no model (only timer and gap have one)")
    vms = [probe_vm]
    for index, use in enumerate(same_core, 1):
        if platform.hypervisor["scheduler"] == "partitioned":
            raise NotPredictable("same-core stress on a partitioned platform")  # _platform never does this
        home = platform.vcpus[0].get("affinity", [0])[0]
        vm, line = _stressor_vm(index, use, platform, home)
        vms.append(vm)
        mapping.append(line)
    for use in stressors:
        if use.where == "inside":
            notes.append(f"stressor {use.stressor} (inside the guest): runs below the probe in the guest; the "
                         "model has no shared caches or memory bus, so it predicts no effect")
        elif use not in same_core:
            notes.append(f"stressor {use.stressor} ({use.where}): runs on other CPUs; the model has no shared "
                         "caches, memory bus or interrupts, so it predicts no effect")
    hypervisor = {"pcpus": 1, **platform.hypervisor,
                  "quantum": f"{spec.tick}ns", "overheads": {"vm_switch": f"{spec.vm_switch}ns"}}
    data = {"name": name[:40], "simulation": {"duration": f"{duration_ns}ns", "seed": 1},
            "hypervisor": hypervisor, "vm": vms}
    model = model_from_dict(data, f"derived model of {env.label}")
    return Derived(model, compare, metric, mapping, notes)
