"""Turn a validated model into the compiled core's input, run it, and return the records as Arrow tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import InputError, RunError
from ..model import Model, home_cpu
from ..model.schema import Execution, Task

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["SimResult", "core_config", "optional_columns", "simulate", "supply_table", "supply_window",
           "vcpu_names", "NEVER", "CHUNK_ROWS"]

NEVER = (2**63 - 1) // 4  # the core's "no deadline"
_TYPES = {"periodic": 0, "sporadic": 1, "event": 2}
_DISTRIBUTIONS = {"uniform": 1, "normal": 2}
_GLOBAL = {"rtds": lambda hv: hv.mode == "global", "deadline": lambda hv: True}
_DEFAULT_WEIGHT = {"credit": 256, "fair": 1024}
_RTDS_DEFAULT = (4_000_000, 10_000_000)  # Xen's default budget / period


CHUNK_ROWS = 1 << 18  # jobs per chunk the core hands over (and per Parquet row group of the stored samples)
JobChunk = dict[str, "np.ndarray"]  # the core's job columns: arrival, response, start, [release], [event], task, cpu
SupplyChunk = dict[str, "np.ndarray"]  # supply of the windows ended meanwhile, vCPU-major: vcpu, window_start, supply


@dataclass
class SimResult:
    """Everything one simulation produced; times in ns."""

    model: Model
    duration_ns: int
    end_reason: str
    end_time_ns: int
    job_chunks: list[JobChunk]  # finished jobs as the core handed them over, in finishing order (or none kept)
    chains: pa.Table  # one row per event that left the last stage of its chain
    gaps: pa.Table  # gap probe: every interval the probe did not run, above its threshold
    supply: pa.Table  # per vCPU and supply window: ns the vCPU ran; blocks of windows, vCPU-major (or none kept)
    segments: pa.Table  # what ran where, inside the Gantt window
    vcpu_names: list[str]
    task_names: list[str]
    unfinished: pa.Table  # jobs still queued at the end: task, deadline_ns (overdue ones count as misses)
    task_stats: dict[str, np.ndarray]  # per task (core order), counted by the core: jobs, misses, response_sum/max
    task_deadlines: np.ndarray  # per task: relative deadline, NEVER if none
    counters: dict[str, int] = field(default_factory=dict)

    @cached_property
    def jobs(self) -> pa.Table:
        """One row per finished job with every field (finish, absolute deadline, met derived), built on first
        use: the store writes the core's chunks directly and never needs it."""
        import numpy as np
        import pyarrow as pa

        def joined(key: str, dtype: type) -> np.ndarray:
            return _joined(self.job_chunks, key, dtype)

        arrival, response = joined("arrival", np.int64), joined("response", np.int64)
        task = joined("task", np.int16)
        release = joined("release", np.int64) if self.job_chunks and "release" in self.job_chunks[0] else arrival
        event = (joined("event", np.int64) if self.job_chunks and "event" in self.job_chunks[0]
                 else np.full(arrival.size, -1, np.int64))
        relative = self.task_deadlines[task]
        has_deadline = relative < NEVER
        return pa.table({
            "task": _dictionary(task, self.task_names),
            "arrival_ns": arrival, "release_ns": release, "start_ns": joined("start", np.int64),
            "finish_ns": arrival + response, "response_ns": response,
            "deadline_ns": pa.array(np.where(has_deadline, arrival + relative, 0), mask=~has_deadline),
            "met": pa.array(np.where(has_deadline, response <= relative, True)),
            "cpu": joined("cpu", np.int16), "event": event,
        })


MAX_SUPPLY_WINDOWS = 1_000_000  # per vCPU: bounds the supply records of very long runs


def supply_window(model: Model, duration_ns: int | None = None) -> int:
    """The model's supply window, widened (to a multiple of it) if the run would have more than 1 M windows."""
    width = model.simulation.supply_window
    duration = duration_ns if duration_ns is not None else model.simulation.duration
    return width * max(1, -(-duration // (width * MAX_SUPPLY_WINDOWS)))


def vcpu_names(model: Model) -> list[str]:
    """Every vCPU as VM.INDEX, in core order."""
    return [f"{vm.name}.{c}" for vm in model.vm for c in range(len(vm.vcpu))]


def core_config(model: Model, *, duration_ns: int | None = None, seed: int | None = None,
                gantt: tuple[int, int] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The dict rtvirt._simcore.simulate() takes, and the task names in core order."""
    hv = model.hypervisor
    sim = model.simulation
    vcpus, first_vcpu = _vcpu_entries(model)
    tasks: list[dict[str, Any]] = []
    names: list[str] = []
    index: dict[str, int] = {}
    for v, vm in enumerate(model.vm):
        for task in vm.task:
            index[f"{vm.name}/{task.name}"] = len(tasks)
            tasks.append(_task_entry(task, first_vcpu[v] + task.vcpu))
            names.append(f"{vm.name}/{task.name}")
        work = round(vm.load * vm.load_period)
        if work > 0:  # the VM's background load: a periodic job of that share on each vCPU, not recorded
            for c in range(len(vm.vcpu)):
                tasks.append({"vcpu": first_vcpu[v] + c, "type": 0, "period": vm.load_period, "exec": work,
                              "deadline": vm.load_period, "record": False, "priority": 0})
                names.append(f"{vm.name}/load.{c}")
    chains: list[dict[str, Any]] = []
    for k, chain in enumerate(model.chain):
        stages = [index[stage] for stage in chain.stages]
        for s, task_index in enumerate(stages):
            tasks[task_index].update(chain=k, stage=s)
        chains.append({"period": chain.period, "jitter": chain.jitter, "offset": chain.offset,
                       "deadline": chain.deadline if chain.deadline is not None else NEVER, "stages": stages})
    if (duration_ns if duration_ns is not None else sim.duration) <= 0:
        raise InputError("simulation duration must be larger than 0")
    if len(tasks) + len(chains) + len(vcpus) > 32767:  # the stored kind codes are int16
        raise InputError(f"model {model.name}: more than 32767 tasks, chains and vCPUs together")
    config = {
        "duration": duration_ns if duration_ns is not None else sim.duration,
        "seed": seed if seed is not None else sim.seed,
        "event_cap": sim.event_cap, "supply_window": supply_window(model, duration_ns),
        "scheduler": hv.scheduler, "server": hv.server, "mode": hv.mode, "pcpus": hv.pcpus,
        "quantum": hv.quantum, "context_switch": hv.overheads.context_switch, "vm_switch": hv.overheads.vm_switch,
        "interrupt_delay": hv.overheads.interrupt_delay, "credit_slice": hv.credit.slice,
        "credit_accounting": hv.credit.accounting, "credit_rate_limit": hv.credit.rate_limit,
        "fair_slice": hv.fair.slice, "major_frame": hv.arinc653.major_frame if hv.arinc653 else 0,
        "enforcement_tick": hv.enforcement.tick, "enforcement_phase": hv.enforcement.phase,
        "resume_jitter": hv.enforcement.resume_jitter, "resume_latencies": list(hv.enforcement.resume_latencies),
        "guest": [vm.scheduler for vm in model.vm], "vcpus": vcpus, "tasks": tasks, "chains": chains,
        "gantt_from": gantt[0] if gantt else 0, "gantt_to": gantt[1] if gantt else 0,
    }
    return config, names


def _vcpu_entries(model: Model) -> tuple[list[dict[str, Any]], list[int]]:
    """Every vCPU as the core takes it, in core order, and the index of each VM's first."""
    hv = model.hypervisor
    is_global = _GLOBAL.get(hv.scheduler, lambda _: False)(hv)
    vcpus: list[dict[str, Any]] = []
    first_vcpu: list[int] = []
    for v, vm in enumerate(model.vm):
        first_vcpu.append(len(vcpus))
        for c, vcpu in enumerate(vm.vcpu):
            home = home_cpu(vm, c)
            cpus = vcpu.affinity if (is_global and vcpu.affinity) else (range(hv.pcpus) if is_global else (home,))
            budget, period = vcpu.budget, vcpu.period
            if hv.scheduler == "rtds":
                budget = budget if budget is not None else _RTDS_DEFAULT[0]
                period = period if period is not None else _RTDS_DEFAULT[1]
            vcpus.append({
                "vm": v, "home": home, "affinity": sum(1 << cpu for cpu in cpus), "priority": vcpu.priority,
                "budget": budget or 0, "period": period or 0, "slice": vcpu.slice or 0,
                "runtime": vcpu.runtime or 0, "deadline": vcpu.deadline or 0, "extratime": vcpu.extratime,
                "rt": vcpu.rt, "weight": vcpu.weight or _DEFAULT_WEIGHT.get(hv.scheduler, 256), "cap": vcpu.cap,
                "windows": [(w.start, w.length) for w in vcpu.windows],
                "gap_threshold": vm.gap.threshold if vm.gap is not None and vm.gap.vcpu == c else -1,
            })
    return vcpus, first_vcpu


def _task_entry(task: Task, vcpu: int) -> dict[str, Any]:
    """One task as the core takes it, on the core's vCPU ``vcpu``: its release, deadline and execution time."""
    entry: dict[str, Any] = {"vcpu": vcpu, "type": _TYPES[task.type], "offset": task.offset, "jitter": task.jitter,
                             "priority": task.priority}
    if task.type == "periodic":
        entry["period"] = task.period
    elif task.type == "sporadic":
        entry["min_ia"] = task.min_interarrival
        entry["max_ia"] = task.max_interarrival or 2 * (task.min_interarrival or 0)
    default_deadline = {"periodic": task.period, "sporadic": task.min_interarrival}.get(task.type)
    deadline = task.deadline if task.deadline is not None else default_deadline
    entry["deadline"] = deadline if deadline is not None else NEVER
    if isinstance(task.execution, Execution):
        e = task.execution
        entry.update(dist=_DISTRIBUTIONS[e.distribution], emin=e.min, emax=e.max, emean=e.mean or 0,
                     estdev=e.stdev or 0)
    else:
        entry["exec"] = task.execution
    return entry


def optional_columns(config: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the core keeps each job's release (a task has release jitter) and event (the model has chains);
    otherwise release equals arrival and event is -1 (sim/core.h, JobColumns)."""
    return any(task.get("jitter", 0) > 0 for task in config["tasks"]), bool(config["chains"])


def supply_table(blocks: list[SupplyChunk], vcpus: list[str]) -> pa.Table:
    """supply.parquet's rows (vcpu, window_start_ns, supply_ns) of the core's supply blocks: the one place
    that layout is made (the stored file's schema is that of no blocks)."""
    import numpy as np
    import pyarrow as pa

    return pa.table({"vcpu": _dictionary(_joined(blocks, "vcpu", np.int32), vcpus),
                     "window_start_ns": _joined(blocks, "window_start", np.int64),
                     "supply_ns": _joined(blocks, "supply", np.int64)})


def _joined(parts: list[dict[str, np.ndarray]], key: str, dtype: type) -> np.ndarray:
    """The ``key`` column of every part that has it, end to end (empty when none has)."""
    import numpy as np

    columns = [part[key] for part in parts if key in part]
    return np.concatenate(columns) if columns else np.empty(0, dtype)


def _dictionary(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)), pa.array(names, pa.string()))


def simulate(model: Model, *, duration_ns: int | None = None, seed: int | None = None,
             gantt: tuple[int, int] | None = None, on_chunk: Callable[[JobChunk], None] | None = None,
             on_supply: Callable[[SupplyChunk], None] | None = None, keep_records: bool = True,
             config: tuple[dict[str, Any], list[str]] | None = None) -> SimResult:
    """Run the model in the compiled core. ``on_chunk`` sees each chunk of finished jobs and ``on_supply``
    each block of ended supply windows as soon as the core hands them over (the store writes them while the
    core simulates on); without ``keep_records`` the result holds neither (``job_chunks`` and ``supply``
    empty): their memory is reused once written. ``config`` is core_config()'s result when the caller already
    built it."""
    try:
        from .. import _simcore  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - a broken install
        raise RunError(f"the simulator core is not built ({exc}); reinstall rtvirt with pip") from None
    core_input, task_names = config or core_config(model, duration_ns=duration_ns, seed=seed, gantt=gantt)
    simulation = _simcore.Simulation(core_input)
    chunks: list[JobChunk] = []
    supplies: list[SupplyChunk] = []

    def supplied(block: SupplyChunk) -> None:
        if block["vcpu"].size:
            if keep_records:
                supplies.append(block)
            if on_supply is not None:
                on_supply(block)

    ended = False
    while not ended:
        try:
            chunk, supply, ended = simulation.advance(CHUNK_ROWS)
        except KeyboardInterrupt:  # arrived between two chunks (inside, the core stops by itself): keep them
            simulation.stop()
            break
        if chunk["task"].size:
            if keep_records:
                chunks.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        supplied(supply)
    # here, not at the top: `rtvirt sim` imports them in its writer thread while the core starts
    import numpy as np
    import pyarrow as pa

    out = simulation.results()
    supplied(out["supply"])  # the windows a run stopped between two chunks had left
    vcpus = vcpu_names(model)
    c = out["chains"]
    chain_names = [chain.name for chain in model.chain]
    chain_deadlines = np.array([ch.deadline if ch.deadline is not None else NEVER for ch in model.chain] or [NEVER],
                               dtype=np.int64)
    e2e = c["finish"] - c["arrival"]
    chains = pa.table({
        "chain": _dictionary(c["chain"], chain_names), "event": c["event"], "cpu": c["cpu"].astype(np.int16),
        "arrival_ns": c["arrival"],
        "finish_ns": c["finish"], "response_ns": e2e, "met": e2e <= chain_deadlines[c["chain"]],
    })
    g = out["gaps"]
    gaps = pa.table({"vcpu": _dictionary(g["vcpu"], vcpus), "cpu": g["cpu"].astype(np.int16),
                     "start_ns": g["start"], "gap_ns": g["length"]})
    supply = supply_table(supplies, vcpus)
    s = out["segments"]
    segments = pa.table({"cpu": s["cpu"].astype(np.int16), "vcpu": s["vcpu"], "task": s["task"],
                         "start_ns": s["start"], "end_ns": s["end"]})
    counters = {"steps": int(out["steps"]), "events": int(out["events"]), "jobs": int(out["jobs_done"]),
                "gantt_truncated": int(out["segments_truncated"])}
    counters.update({f"supplied_ns {name}": int(ns) for name, ns in zip(vcpus, out["supplied"], strict=True)})
    u = out["unfinished"]
    unfinished = pa.table({"task": _dictionary(u["task"], task_names), "deadline_ns": u["deadline"]})
    deadlines = np.array([task["deadline"] for task in core_input["tasks"]], np.int64)
    return SimResult(model, int(core_input["duration"]), str(out["end_reason"]), int(out["end_time"]), chunks,
                     chains, gaps, supply, segments, vcpus, task_names, unfinished, out["task_stats"],
                     deadlines, counters)
