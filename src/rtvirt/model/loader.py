"""Read a model file: TOML syntax, then the pydantic schema, then the cross-field rules of each scheduler.
Every error names the file, the field path (``vm[1].task[0].period``) and, where it can be found, the line."""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import InputError
from .overrides import apply_override
from .schema import Hypervisor, Model, Task, VCpu, Vm

__all__ = ["load_model", "model_from_dict", "check_model", "field_path", "home_cpu"]

Loc = tuple[str | int, ...]
_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-]+)\s*=")


def field_path(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _key_lines(text: str) -> dict[Loc, int]:
    """Map field locations to 1-based line numbers by following the TOML table headers."""
    lines: dict[Loc, int] = {}
    counters: dict[Loc, int] = {}
    current: Loc = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names = [n.strip().strip('"') for n in header.group(2).split(".")]
            loc: Loc = ()
            for name in names[:-1]:  # parents of an array of tables refer to their last element
                loc += (name,)
                if loc in counters:
                    loc += (counters[loc] - 1,)
            loc += (names[-1],)
            if header.group(1) == "[[":
                counters[loc] = counters.get(loc, 0) + 1
                loc += (counters[loc] - 1,)
            current = loc
            lines.setdefault(current, number)
            continue
        key = _KEY.match(line)
        if key:
            lines.setdefault(current + (key.group(1),), number)
    return lines


def _where(loc: Loc, lines: dict[Loc, int]) -> str:
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return f" (line {lines[loc[:end]]})"
    return ""


def _fail(source: str, problems: list[tuple[Loc, str]], lines: dict[Loc, int]) -> InputError:
    shown = [f"{field_path(loc)}{_where(loc, lines)}: {message}" for loc, message in problems[:5]]
    more = f"; ... and {len(problems) - 5} more" if len(problems) > 5 else ""
    return InputError(f"model {source}: " + "; ".join(shown) + more)  # one line, as every error (docs/output.md)


def model_from_dict(data: dict[str, Any], source: str = "<model>", text: str = "") -> Model:
    lines = _key_lines(text) if text else {}
    try:
        model = Model.model_validate(data)
    except ValidationError as exc:
        problems = [(tuple(e["loc"]), e["msg"].removeprefix("Value error, ")) for e in exc.errors()]
        raise _fail(source, problems, lines) from None
    problems = list(check_model(model))
    if problems:
        raise _fail(source, problems, lines)
    return model


def load_model(path: Path | str, overrides: Sequence[tuple[str, Any]] = ()) -> Model:
    """Read and validate a model file; ``overrides`` (key, value) are applied before validation (--set)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"model {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"model {path}: not valid TOML: {exc}") from None
    for key, value in overrides:
        data = apply_override(data, key, value)
    return model_from_dict(data, str(path), text)


def home_cpu(vm: Vm, vcpu_index: int) -> int:
    """The pCPU a vCPU lives on under per-CPU schedulers: the first of its affinity."""
    affinity = vm.vcpu[vcpu_index].affinity
    return affinity[0] if affinity else 0


_NEEDS = {  # scheduler -> vCPU fields every vCPU must set
    "sedf": ("slice", "period"), "sedf-prime": ("slice", "period"), "psedf": ("slice", "period"),
}


def check_model(model: Model) -> Iterator[tuple[Loc, str]]:
    """Cross-field rules the schema cannot express, as (location, message)."""
    hv = model.hypervisor
    yield from _check_hypervisor(hv)
    seen_vms: set[str] = set()
    owned: dict[int, Loc] = {}  # pCPU -> the vCPU the partitioned scheduler gave it
    event_tasks: dict[str, Loc] = {}  # "vm/task" -> where it is declared
    windows_by_cpu: dict[int, list[tuple[int, int, Loc]]] = {}
    for v, vm in enumerate(model.vm):
        if vm.name in seen_vms:
            yield ("vm", v, "name"), f"VM name {vm.name!r} is used twice"
        seen_vms.add(vm.name)
        for c, vcpu in enumerate(vm.vcpu):
            yield from _check_vcpu(hv, vcpu, ("vm", v, "vcpu", c), owned)
            if hv.scheduler == "arinc653" and hv.arinc653 is not None:
                for w, window in enumerate(vcpu.windows):
                    loc: Loc = ("vm", v, "vcpu", c, "windows", w)
                    if window.start + window.length > hv.arinc653.major_frame:
                        yield loc, "window ends after the major frame"
                    windows_by_cpu.setdefault(home_cpu(vm, c), []).append(
                        (window.start, window.start + window.length, loc))
        names: set[str] = set()
        for t, task in enumerate(vm.task):
            loc = ("vm", v, "task", t)
            if task.name in names:
                yield loc + ("name",), f"task name {task.name!r} is used twice in VM {vm.name!r}"
            names.add(task.name)
            if task.vcpu >= len(vm.vcpu):
                yield loc + ("vcpu",), f"VM {vm.name!r} has {len(vm.vcpu)} vCPU(s)"
            if task.type == "event":
                event_tasks[f"{vm.name}/{task.name}"] = loc
            yield from _check_task(task, loc)
        if vm.gap is not None and vm.gap.vcpu >= len(vm.vcpu):
            yield ("vm", v, "gap", "vcpu"), f"VM {vm.name!r} has {len(vm.vcpu)} vCPU(s)"
    for cpu, windows in windows_by_cpu.items():
        windows.sort()
        for (_, end, _), (start, _, loc) in itertools.pairwise(windows):
            if start < end:
                yield loc, f"window overlaps another window on CPU {cpu}"
    yield from _check_chains(model, event_tasks)


def _check_hypervisor(hv: Hypervisor) -> Iterator[tuple[Loc, str]]:
    """The hypervisor's own rules: a scheduler's required table, the enforcement tick's."""
    if hv.scheduler == "arinc653" and hv.arinc653 is None:
        yield ("hypervisor", "arinc653"), "the arinc653 scheduler needs [hypervisor.arinc653] major_frame"
    if hv.enforcement.tick and hv.scheduler != "deadline":
        yield ("hypervisor", "enforcement", "tick"), "only the deadline scheduler has an enforcement tick"
    if hv.enforcement.tick and hv.enforcement.phase >= hv.enforcement.tick:
        yield ("hypervisor", "enforcement", "phase"), "the phase must be shorter than the tick"


def _check_vcpu(hv: Hypervisor, vcpu: VCpu, loc: Loc, owned: dict[int, Loc]) -> Iterator[tuple[Loc, str]]:
    """One vCPU's placement and reservation against the hypervisor's scheduler; ``owned`` collects the pCPUs the
    partitioned scheduler has handed out so far."""
    sched = hv.scheduler
    for cpu in vcpu.affinity or ():
        if cpu >= hv.pcpus:
            yield loc + ("affinity",), f"CPU {cpu} does not exist (hypervisor.pcpus = {hv.pcpus})"
    if sched == "partitioned":
        if not vcpu.affinity or len(vcpu.affinity) != 1:
            yield loc + ("affinity",), "the partitioned scheduler needs exactly one CPU per vCPU"
        elif vcpu.affinity[0] in owned:
            owner = field_path(owned[vcpu.affinity[0]])
            yield loc + ("affinity",), f"CPU {vcpu.affinity[0]} already belongs to {owner}"
        else:
            owned[vcpu.affinity[0]] = loc
    if sched == "fifo" and hv.server != "none" and (vcpu.budget is None or vcpu.period is None):
        yield loc, f"the {hv.server} server needs budget and period"
    for field in _NEEDS.get(sched, ()):
        if getattr(vcpu, field) is None:
            yield loc + (field,), f"the {sched} scheduler needs {field} for every vCPU"
    if vcpu.budget is not None and vcpu.period is not None and vcpu.budget > vcpu.period:
        yield loc + ("budget",), "budget is larger than period"
    if vcpu.slice is not None and vcpu.period is not None and vcpu.slice > vcpu.period:
        yield loc + ("slice",), "slice is larger than period"
    for field in ("period", "budget", "slice", "runtime", "deadline"):
        if getattr(vcpu, field) == 0:
            yield loc + (field,), f"{field} must be larger than 0"
    if sched == "rtds" and vcpu.budget is not None and vcpu.budget < 10_000:
        yield loc + ("budget",), "RTDS budgets are at least 10us"
    if sched == "deadline" and vcpu.runtime is not None:
        deadline = vcpu.deadline or vcpu.period
        if vcpu.period is None:
            yield loc + ("period",), "a SCHED_DEADLINE vCPU needs period with runtime"
        elif deadline is not None and not vcpu.runtime <= deadline <= vcpu.period:
            yield loc, "SCHED_DEADLINE needs runtime <= deadline <= period"


def _check_task(task: Task, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """One task's release and execution-time fields against its type."""
    if task.type == "periodic" and not task.period:
        yield loc + ("period",), "a periodic task needs a period larger than 0"
    if task.type == "sporadic":
        if not task.min_interarrival:
            yield loc + ("min_interarrival",), "a sporadic task needs min_interarrival larger than 0"
        elif task.max_interarrival is not None and task.max_interarrival < task.min_interarrival:
            yield loc + ("max_interarrival",), "max_interarrival is below min_interarrival"
    if task.type == "event" and task.period is not None:
        yield loc + ("period",), "an event task is released by its chain, not by a period"
    if task.type != "periodic" and task.type != "event" and task.period is not None:
        yield loc + ("period",), "a sporadic task uses min_interarrival, not period"
    execution = task.execution
    if isinstance(execution, int):
        if execution <= 0:
            yield loc + ("execution",), "execution time must be larger than 0"
    else:
        if not 0 < execution.min <= execution.max:
            yield loc + ("execution",), "needs 0 < min <= max"
        if execution.distribution == "normal" and (execution.mean is None or execution.stdev is None):
            yield loc + ("execution",), "a normal distribution needs mean and stdev"


def _check_chains(model: Model, event_tasks: dict[str, Loc]) -> Iterator[tuple[Loc, str]]:
    """Each chain's stages are event tasks, each event task a stage of exactly one chain."""
    used: set[str] = set()
    for k, chain in enumerate(model.chain):
        for s, stage in enumerate(chain.stages):
            loc: Loc = ("chain", k, "stages", s)
            if stage not in event_tasks:
                yield loc, f"{stage!r} is not an event task (write \"vm/task\" of a task with type = \"event\")"
            elif stage in used:
                yield loc, f"{stage!r} is already a stage of a chain"
            used.add(stage)
    for stage, loc in event_tasks.items():
        if stage not in used:
            yield loc + ("type",), f"event task {stage!r} is not a stage of any chain"
