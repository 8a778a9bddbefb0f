"""The scenario schema (docs/scenarios.md): platforms, the measured workload, its disturbance, a timeline."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..environments import ENVIRONMENTS
from ..environments.host import HostConfig
from ..environments.libvirt import LibvirtConfig
from ..environments.partition import PartitionConfig
from ..environments.qemu import QemuConfig
from ..environments.ssh import SshConfig
from ..environments.xen import XenConfig
from ..explain.config import ExplainConfig
from ..host.profiles import ProfileName
from ..params import CpuList
from ..probes import PROBES
from ..remote.target import SshTargetFields
from ..stressors import STRESSORS
from ..units import duration_field
from .predict import PredictSpec

__all__ = ["Scenario", "Hook", "Hooks", "HostTuning", "Workload", "NamedWorkload", "RunGroup", "Disturbance",
           "StressorUse", "Timeline", "TimelineEvent", "EnvironmentEntry"]

Seconds = duration_field("s")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# study name -> the built-in scenario reproducing it (they share the name; results/studies has their tables)
STUDY_NAMES = ("cots-hypervisor", "guest-isolation", "interrupt-latency", "rt-xen-servers")

# One variant per environment module, told apart by ``kind`` (ENVIRONMENTS is the table of record).
EnvironmentEntry = Annotated[HostConfig | PartitionConfig | QemuConfig | LibvirtConfig | SshConfig
                             | XenConfig,
                             Field(discriminator="kind")]
assert {HostConfig.model_fields["kind"].default, PartitionConfig.model_fields["kind"].default,
        QemuConfig.model_fields["kind"].default, LibvirtConfig.model_fields["kind"].default,
        SshConfig.model_fields["kind"].default, XenConfig.model_fields["kind"].default} == set(ENVIRONMENTS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Workload(_Strict):
    """The measured workload: a probe and its parameters (checked by the probe's own model)."""

    probe: str = Field("timer", description="a probe from `rtvirt probe --help`")
    params: dict[str, Any] = Field(default_factory=dict, description="the probe's parameters (long option names)")

    @field_validator("probe")
    @classmethod
    def _known_probe(cls, probe: str) -> str:
        if probe not in PROBES:
            raise ValueError(f"unknown probe {probe!r} (known: {', '.join(PROBES)})")
        return probe

    @field_validator("params")
    @classmethod
    def _campaign_decides(cls, params: dict[str, Any]) -> dict[str, Any]:
        for decided in ("duration", "affinity"):
            if decided in params:
                raise ValueError(f"'{decided}' is decided by the campaign (the scenario's duration and the "
                                 "environment's cpus); remove it")
        return params


class NamedWorkload(Workload):
    """One of several measured workloads (``workloads = [...]``); run groups pick one by name."""

    name: str = Field(pattern=_NAME, max_length=48)


class StressorUse(_Strict):
    """One stressor: which, where it runs, how many, on which engine."""

    stressor: str = Field(description="a stressor from `rtvirt stress --help`")
    where: Literal["same-core", "other-core", "all-cores", "other-vm", "inside"] = Field(
        description="same-core: on the measured workload's host CPU; other-core: on the others; "
                    "other-vm: inside extra QEMU guests; inside: within the measured system (a guest: on its "
                    "own vCPUs, started with it; the host: on all its cores)")
    workers: int = Field(1, ge=1, le=256, description="worker threads (per VM for other-vm)")
    vms: int = Field(1, ge=1, le=8, description="other-vm only: how many disturbing guests")
    engine: Literal["native", "stress-ng"] = "native"
    params: dict[str, Any] = Field(default_factory=dict, description="the stressor's own parameters")
    guest_cpus: Literal["same-core", "other-core"] | None = Field(
        None, description="other-vm only: pin the disturbing guests to the measured workload's host core or to "
                          "the others (default: the others when the measured environment is pinned, else unpinned)")
    guest: Literal["linux", "baremetal"] | None = Field(
        None, description="other-vm only, QEMU and libvirt disturbing guests: their kernel; baremetal (rtvirt's "
                          "own, boots in about a second) runs the cpu and cache stressors (default: linux)")

    @field_validator("stressor")
    @classmethod
    def _known_stressor(cls, stressor: str) -> str:
        if stressor not in STRESSORS:
            raise ValueError(f"unknown stressor {stressor!r} (known: {', '.join(STRESSORS)})")
        return stressor

    @field_validator("params")
    @classmethod
    def _campaign_decides(cls, params: dict[str, Any]) -> dict[str, Any]:
        for decided in ("duration", "cpus", "workers"):
            if decided in params:
                raise ValueError(f"'{decided}' is decided by the campaign (use the fields 'workers' and 'where')")
        return params

    @model_validator(mode="after")
    def _engine_fits_place(self) -> StressorUse:
        if self.where in ("other-vm", "inside") and self.engine != "native":
            raise ValueError(f"{self.where} stressors run our native agent inside the guest; use engine = 'native'")
        if self.guest_cpus is not None and self.where != "other-vm":
            raise ValueError("'guest_cpus' places disturbing guests: it needs where = 'other-vm'")
        if self.guest is not None and self.where != "other-vm":
            raise ValueError("'guest' chooses the disturbing guests' kernel: it needs where = 'other-vm'")
        if self.guest == "baremetal":
            from ..environments.baremetal import stressor_unsupported

            problem = stressor_unsupported(self.stressor, self.params, self.workers)
            if problem:
                raise ValueError(f"guest 'baremetal': {problem}")
        return self


class TimelineEvent(_Strict):
    at: Seconds = Field(description="time after the workload started (bare numbers in s)")  # type: ignore[valid-type]
    action: Literal["stress-on", "stress-off"]


def check_alternating(events: list[TimelineEvent]) -> None:
    previous_at, expected = -1, "stress-on"
    for event in events:
        if event.at <= previous_at:
            raise ValueError("events must be in increasing order of 'at'")
        if event.action != expected:
            raise ValueError(f"events must alternate stress-on / stress-off, starting with stress-on "
                             f"(found {event.action} at {event.at / 1e9:g}s)")
        previous_at, expected = event.at, "stress-off" if expected == "stress-on" else "stress-on"


class Disturbance(_Strict):
    """A named set of stressors; the empty set is the solo (undisturbed) case."""

    name: str = Field(pattern=_NAME, max_length=48)
    stressors: list[StressorUse] = Field(default_factory=list)
    events: list[TimelineEvent] | None = Field(None, description="this disturbance's own stress-on/off events "
                                                                 "(instead of timeline.events)")

    @field_validator("events")
    @classmethod
    def _events_alternate(cls, events: list[TimelineEvent] | None) -> list[TimelineEvent] | None:
        check_alternating(events or [])
        return events


class Hook(_Strict):
    """A command run around runs, as an argument vector (never through a shell): e.g. start, pin or stop a
    VM with its hypervisor's own tool (virsh, xl, jailhouse, a vendor CLI)."""

    argv: list[Annotated[str, Field(max_length=4096)]] = Field(
        min_length=1, max_length=256, description="the command and its arguments; {environment}, {disturbance}, "
        "{repetition}, {key} and {run_id} in an argument are replaced by the run's values")
    timeout: Seconds = Field(60_000_000_000, gt=0, description="time the command may take")  # type: ignore[valid-type]
    environments: list[str] | None = Field(None, min_length=1, description="only around runs of these "
                                                                           "environments (default: all)")


class HostTuning(_Strict):
    """``[host]``: tune this machine for the whole campaign (rtvirt host tune), restored at its end whatever
    happens (also after a kill -9: the next campaign's start, or ``--resume``, puts it back)."""

    tune: ProfileName | None = Field(None, description="tuning profile (rtvirt host tune --profile)")
    cpus: CpuList | None = Field(None, description="the real-time CPUs it tunes for (default: every pinned "
                                 "environment's measured CPUs)")



class Hooks(_Strict):
    """Lifecycle hooks: commands run on a control host (default: this machine) around the matrix.

    A failing ``before_*`` hook fails the run (or the campaign); a failing ``after_*`` hook is recorded.
    """

    control: SshTargetFields | None = Field(None, description="run the hooks on this SSH host instead of here")
    before_campaign: list[Hook] = Field(default_factory=list)
    before_run: list[Hook] = Field(default_factory=list)
    after_run: list[Hook] = Field(default_factory=list)
    after_campaign: list[Hook] = Field(default_factory=list)


StartOrder = Literal["test-first", "stress-first"]


class Timeline(_Strict):
    """When disturbance runs. Without events it runs throughout, started before or after the workload."""

    start_order: list[StartOrder] = Field(["test-first"], min_length=1)
    settle: Seconds = Field(1_000_000_000, description="gap between the first and the second start")  # type: ignore[valid-type]
    events: list[TimelineEvent] = Field(default_factory=list)

    @field_validator("events")
    @classmethod
    def _events_alternate(cls, events: list[TimelineEvent]) -> list[TimelineEvent]:
        check_alternating(events)
        return events


class RunGroup(_Strict):
    """A part of the matrix: one workload over some environments and disturbances (default: all of them)."""

    name: str = Field(pattern=_NAME, max_length=48)
    workload: str | None = Field(None, description="a name from 'workloads' (default: the first workload)")
    environments: list[str] | None = Field(None, min_length=1, description="environment names (default: all)")
    disturbances: list[str] | None = Field(None, min_length=1, description="disturbance names (default: all)")
    start_order: list[StartOrder] | None = Field(None, min_length=1,
                                                 description="instead of timeline.start_order; also for other-vm")
    duration: Seconds | None = Field(None, gt=0, description="instead of the scenario's duration")  # type: ignore[valid-type]


class Scenario(_Strict):
    name: str = Field(pattern=_NAME, max_length=64)
    description: str = Field("", max_length=2000)
    study: str | None = Field(None, description="the published study this scenario reproduces (docs/studies.md)")
    duration: Seconds = Field(description="measured time per run (bare numbers in s)", gt=0)  # type: ignore[valid-type]
    repetitions: int = Field(1, ge=1, le=1000, description="runs per configuration, each with a fresh start")
    run_timeout: Seconds = Field(300_000_000_000, gt=0,  # type: ignore[valid-type]
                                 description="watchdog: extra time a run may take beyond its duration "
                                             "and its guest's boot_timeout")
    skip_unavailable: bool = Field(True, description="leave out environments that cannot run here "
                                                     "(recorded as skipped); false makes them fail")
    workload: Workload = Field(default_factory=lambda: Workload.model_validate({}))
    workloads: list[NamedWorkload] = Field(default_factory=list, description="several measured workloads, "
                                           "each run in the groups that name it (instead of 'workload')")
    groups: list[RunGroup] = Field(default_factory=list, description="parts of the matrix (default: one group, "
                                   "every environment x every disturbance)")
    environments: list[EnvironmentEntry] = Field(min_length=1)
    disturbances: list[Disturbance] = Field(default_factory=lambda: [Disturbance.model_validate({"name": "solo"})],
                                           min_length=1)
    timeline: Timeline = Field(default_factory=lambda: Timeline.model_validate({}))
    hooks: Hooks = Field(default_factory=lambda: Hooks.model_validate({}))
    host: HostTuning = Field(default_factory=lambda: HostTuning.model_validate({}))
    predict: PredictSpec | None = Field(None, description="simulate and analyse each measured configuration "
                                        "beside measuring it (docs/predictions.md)")
    explain: ExplainConfig | None = Field(None, description="trace beside each run and store a cause for each "
                                          "outlier (docs/explain.md)")

    def probe_workloads(self) -> list[NamedWorkload]:
        """The measured workloads: ``workloads``, else the single ``workload`` (named "workload")."""
        return self.workloads or [NamedWorkload.model_validate({"name": "workload", **self.workload.model_dump()})]

    def run_groups(self) -> list[RunGroup]:
        """The matrix's groups: ``groups``, else one group of everything per workload."""
        if self.groups:
            return self.groups
        if self.workloads:
            return [RunGroup.model_validate({"name": w.name, "workload": w.name}) for w in self.workloads]
        return [RunGroup.model_validate({"name": "all"})]

    def cross_field_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Checks spanning several fields, as (field path, message) pairs."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        if self.workloads and "workload" in self.model_fields_set:
            errors.append((("workload",), "give either 'workload' or 'workloads', not both"))
        if self.study is not None and self.study not in STUDY_NAMES:
            errors.append((("study",), f"unknown study {self.study!r} (known: {', '.join(STUDY_NAMES)})"))
        errors += self._group_errors() + self._inside_errors() + self._guest_errors() + self._stressor_guest_errors()
        labels = {env.label for env in self.environments}
        for stage in ("before_campaign", "before_run", "after_run", "after_campaign"):
            for index, hook in enumerate(getattr(self.hooks, stage)):
                for name in hook.environments or []:
                    if name not in labels:
                        errors.append((("hooks", stage, index, "environments"), f"unknown environment {name!r}"))
        seen: set[str] = set()
        for index, env in enumerate(self.environments):
            if env.label in seen:
                errors.append((("environments", index, "name"),
                               f"environment name {env.label!r} is used twice: give each a distinct 'name'"))
            seen.add(env.label)
        names: set[str] = set()
        for index, disturbance in enumerate(self.disturbances):
            if disturbance.name in names:
                errors.append((("disturbances", index, "name"), f"disturbance name {disturbance.name!r} is used twice"))
            names.add(disturbance.name)
        for group in self.run_groups():
            duration = int(group.duration if group.duration is not None else self.duration)
            used = [d for d in self.disturbances if group.disturbances is None or d.name in group.disturbances]
            if self.timeline.events and any(d.stressors and d.events is None for d in used) \
                    and int(self.timeline.events[-1].at) >= duration:
                errors.append((("timeline", "events", len(self.timeline.events) - 1, "at"),
                               "the last event must come before the end of the run (duration)"))
            for index, disturbance in enumerate(self.disturbances):
                if disturbance in used and disturbance.events and int(disturbance.events[-1].at) >= duration:
                    errors.append((("disturbances", index, "events", len(disturbance.events) - 1, "at"),
                                   "the last event must come before the end of the run (duration)"))
        return errors

    def _guest_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Workloads a bare-metal guest cannot run (what only a Linux agent does), before anything boots."""
        from ..environments.baremetal import unsupported

        errors: list[tuple[tuple[str | int, ...], str]] = []
        bare = {e.label for e in self.environments if getattr(e, "guest", None) == "baremetal"}
        for group in self.run_groups() if bare else []:
            if not bare & set(group.environments or bare):
                continue
            index = self.workload_of(group)
            workload = self.probe_workloads()[index]
            problem = unsupported(workload.probe, workload.params)
            path: tuple[str | int, ...] = ("workloads", index, "params") if self.workloads else ("workload", "params")
            if problem and (path, problem) not in errors:
                errors.append((path, f"{problem} (guest = 'baremetal' in {', '.join(sorted(bare))})"))
        return errors

    def _stressor_guest_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """A disturbing guest's kernel is chosen only where the disturbing guests are QEMU guests (host,
        partition, qemu; libvirt's are QEMU guests of its libvirtd); Xen and SSH targets make guests of their own
        (Environment.stressor_guest)."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        for group in self.run_groups():
            kinds = {e.kind for e in self.environments if group.environments is None or e.label in group.environments}
            for index, disturbance in enumerate(self.disturbances):
                if group.disturbances is not None and disturbance.name not in group.disturbances:
                    continue
                for use_index, use in enumerate(disturbance.stressors):
                    other = sorted(kinds - {"host", "partition", "qemu", "libvirt"})
                    path: tuple[str | int, ...] = ("disturbances", index, "stressors", use_index, "guest")
                    if use.guest is not None and other and not any(p == path for p, _ in errors):
                        errors.append((path, f"the disturbing guests of {', '.join(other)} environments are guests "
                                             "of their own hypervisor: 'guest' applies to QEMU and libvirt "
                                             "disturbing guests"))
        return errors

    def _inside_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Stressors "inside" the measured system start with it (a guest's own job): no events, no test-first."""
        errors: list[tuple[tuple[str | int, ...], str]] = []
        inside = {d.name for d in self.disturbances if any(u.where == "inside" for u in d.stressors)}
        for index, disturbance in enumerate(self.disturbances):
            if disturbance.name in inside and (disturbance.events or self.timeline.events):
                errors.append((("disturbances", index, "events"), "stressors with where = 'inside' run from the "
                               "measured system's start to its end: no stress-on/off events"))
        for index, group in enumerate(self.groups):
            if "test-first" in (group.start_order or []) and \
                    inside & set(group.disturbances or [d.name for d in self.disturbances]):
                errors.append((("groups", index, "start_order"), "stressors with where = 'inside' start with the "
                               "measured system: use start_order = ['stress-first']"))
        return errors

    def _group_errors(self) -> list[tuple[tuple[str | int, ...], str]]:
        errors: list[tuple[tuple[str | int, ...], str]] = []
        workload_names = [w.name for w in self.workloads]
        for index, name in enumerate(workload_names):
            if name in workload_names[:index]:
                errors.append((("workloads", index, "name"), f"workload name {name!r} is used twice"))
        known = {"environments": [e.label for e in self.environments],
                 "disturbances": [d.name for d in self.disturbances]}
        group_names: set[str] = set()
        for index, group in enumerate(self.groups):
            if group.name in group_names:
                errors.append((("groups", index, "name"), f"group name {group.name!r} is used twice"))
            group_names.add(group.name)
            if group.workload is not None and group.workload not in workload_names:
                errors.append((("groups", index, "workload"), f"no workload named {group.workload!r} "
                               f"(workloads: {', '.join(workload_names) or 'none; add [[workloads]]'})"))
            for field_name, names in known.items():
                for name in getattr(group, field_name) or []:
                    if name not in names:
                        errors.append((("groups", index, field_name), f"no {field_name[:-1]} named {name!r} "
                                       f"(have: {', '.join(names)})"))
        return errors

    def workload_of(self, group: RunGroup) -> int:
        """Index into :meth:`probe_workloads` of ``group``'s workload."""
        names = [w.name for w in self.probe_workloads()]
        return names.index(group.workload) if group.workload is not None else 0
