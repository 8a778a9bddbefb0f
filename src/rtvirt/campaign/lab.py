"""A lab: many SSH targets measured at the same time, each target's runs stored on their own, one report.

Either one probe on every target (:func:`run_lab`) or a whole scenario matrix on every target
(:func:`run_lab_scenario`: one campaign per target, resumable per target). The targets come from a plain
inventory file (TOML)::

    remote_dir = "/var/tmp/rtvirt"          # optional
    labgrid_coordinator = "lab-srv:20408"   # optional (default: LG_COORDINATOR, else labgrid's default)
    [[targets]]
    name = "ecu-a"                          # label in results and the report
    host = "10.0.0.5"                       # or a ~/.ssh/config alias
    user = "root"                           # optional, like port, identity_file, known_hosts, proxy_jump
    [[targets]]
    name = "ecu-b"
    labgrid = "ecu-b-place"                 # a labgrid place you acquired: its NetworkService
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import InputError, RtvirtError
from ..probes import ProbeSpec
from ..procs import stops_deferred
from ..remote.agents import TargetLink
from ..remote.labgrid import PLACE_PATTERN, resolve_place
from ..remote.probe import DEFAULT_REMOTE_DIR, run_probe_on_target
from ..remote.target import HOST_PATTERN, REMOTE_DIR_PATTERN, SshTarget, SshTargetFields
from ..scenario.loader import _error as located_error
from ..store import new_run, write_measured_run

__all__ = ["Inventory", "InventoryTarget", "LabCampaign", "LabResult", "load_inventory", "run_lab",
           "run_lab_scenario", "scenario_for_target"]


class InventoryTarget(SshTargetFields):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64, description="label in results")
    host: str | None = Field(None, pattern=HOST_PATTERN,  # type: ignore[assignment]
                             description="host name, address or ~/.ssh/config alias (or give labgrid)")
    labgrid: str | None = Field(None, pattern=PLACE_PATTERN,
                                description="a labgrid place (PLACE or PLACE/RESOURCE): its NetworkService")

    @model_validator(mode="after")
    def _host_or_place(self) -> InventoryTarget:
        if (self.host is None) == (self.labgrid is None):
            raise ValueError("give either host or labgrid (a labgrid place)")
        return self


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    remote_dir: str = Field(DEFAULT_REMOTE_DIR, pattern=REMOTE_DIR_PATTERN)
    labgrid_coordinator: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:\[\]-]{1,260}$",
                                            description="HOST:PORT (default: LG_COORDINATOR, else labgrid's own)")
    targets: list[InventoryTarget] = Field(min_length=1, max_length=256)

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[InventoryTarget]) -> list[InventoryTarget]:
        names = [t.name for t in targets]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"target name {name!r} is used twice")
        return targets

    def resolve(self, target: InventoryTarget) -> SshTarget:
        """How to reach ``target``: its own fields, or its labgrid place's NetworkService (asked now; the
        target's own fields still apply and win, e.g. identity_file, known_hosts, or another user)."""
        fields = {name: getattr(target, name) for name in SshTargetFields.model_fields
                  if getattr(target, name) is not None}
        if target.labgrid is None:
            return SshTarget.model_validate(fields)
        found = resolve_place(target.labgrid, self.labgrid_coordinator, option=f"target {target.name}")
        return SshTarget.model_validate({**found, **fields, "place": target.labgrid})


def load_inventory(path: Path) -> Inventory:
    """Read and validate an inventory file; errors name the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"inventory {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return Inventory.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"inventory {path}: not valid TOML ({exc})") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        raise located_error(f"inventory {path}", text, tuple(error["loc"]), error["msg"]) from None


@dataclass
class LabResult:
    """What one target gave: its run (None if it failed before measuring) and why it failed, if it did."""

    name: str
    run_id: str | None = None
    status: str = "failed"
    samples: int = 0
    reason: str = ""


def run_lab(inventory: Inventory, spec: ProbeSpec, params: Any, results: Path) -> list[LabResult]:
    """Run ``spec`` with ``params`` on every target at once; Ctrl-C stops them all (samples kept)."""
    stop = threading.Event()
    targets, unreachable = _resolve_all(inventory)
    leftovers = _reclaim_all(inventory, targets, [t for t in inventory.targets if t.name in targets])

    def one(target: InventoryTarget) -> LabResult:
        outcome = LabResult(target.name)
        if target.name in unreachable:
            outcome.reason = unreachable[target.name]
            return outcome
        run = new_run(results, f"{spec.name}-{target.name}")
        try:
            stream, section = run_probe_on_target(spec, params, run.stream_path, targets[target.name],
                                                  remote_dir=inventory.remote_dir, stop=stop, reclaim=False)
            section["leftovers_before"] = leftovers.get(target.name, [])
            manifest = write_measured_run(run, stream, name=f"{spec.name} on {target.name}",
                                          params=params.model_dump(mode="json"), group_by=spec.group_by,
                                          extra={"config": target.name, "target": section,
                                                 **({"error": stream.error} if stream.error else {})})
        except RtvirtError as exc:
            outcome.reason = str(exc)[:500]
            return outcome
        outcome.run_id, outcome.status = run.run_id, manifest["status"]
        outcome.samples = int(stream.records.size)
        if section.get("connection") == "lost":
            outcome.reason = f"connection lost; {section.get('recovered', '')}"
        return outcome

    with ThreadPoolExecutor(max_workers=min(len(inventory.targets), 32), thread_name_prefix="rtvirt-lab") as pool:
        futures = [pool.submit(one, target) for target in inventory.targets]
        try:
            return [future.result() for future in futures]
        except KeyboardInterrupt:
            stop.set()  # every target's agent stops (flushing) and its samples are stored
            return [future.result() for future in futures]


# the fields a target gives the scenario's ssh environments (the rest, e.g. cpus, stays the scenario's)
_CONNECTION = tuple(SshTargetFields.model_fields)


@dataclass
class LabCampaign:
    """One target's campaign of a lab scenario: its id, each run's status, why it failed if it did."""

    name: str
    campaign_id: str | None = None
    runs: dict[str, str] = field(default_factory=dict)  # run key -> status
    unmeasured: list[str] = field(default_factory=list)  # runs that failed or are short by what nothing accounts for
    run_ids: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)  # leftovers of a killed earlier rtvirt, removed
    interrupted: bool = False
    reason: str = ""

    @property
    def status(self) -> str:
        if self.campaign_id is None or self.reason:
            return "failed"
        if self.interrupted:
            return "interrupted"
        # (as `rtvirt run` exits: a short run whose missing periods its probe counted as overran is a measurement)
        finished = all(s in ("complete", "skipped", "short") for s in self.runs.values())
        return "complete" if finished and not self.unmeasured else "failed runs"


def scenario_for_target(text: str, source: str, target: InventoryTarget, ssh: SshTarget, remote_dir: str) -> str:
    """The scenario ``text`` bound to one target: every ``kind = "ssh"`` environment measures ``ssh``
    (its connection fields replaced, the rest kept) and is named after the target, so that the report
    compares targets; references to the renamed environments (groups, hooks) follow. Other kinds: refused."""
    import tomli_w

    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML ({exc})") from None
    environments = document.get("environments")
    if not isinstance(environments, list) or not environments:
        raise InputError(f"{source}: environments: a lab scenario needs kind = \"ssh\" environments")
    renamed: dict[str, str] = {}
    connection = {name: value for name, value in ssh.model_dump(mode="json").items()
                  if name in _CONNECTION and value is not None}
    for index, env in enumerate(environments):
        if not isinstance(env, dict) or env.get("kind") != "ssh":
            kind = env.get("kind") if isinstance(env, dict) else None
            raise InputError(f"{source}: environments[{index}].kind: a lab runs the scenario on its targets, "
                             f"so every environment must be kind = \"ssh\" (not {str(kind)[:40]!r})")
        old = str(env.get("name") or "ssh")
        renamed[old] = target.name if len(environments) == 1 else f"{target.name}-{old}"
        for name in _CONNECTION:
            env.pop(name, None)
        env.update(connection)
        env["name"] = renamed[old]
        env["remote_dir"] = remote_dir  # the inventory's: where the lab cleaned up before starting
    for group in document.get("groups") or []:
        if isinstance(group, dict) and isinstance(group.get("environments"), list):
            group["environments"] = [renamed.get(str(name), name) for name in group["environments"]]
    for stage in ("before_campaign", "before_run", "after_run", "after_campaign"):
        for hook in (document.get("hooks") or {}).get(stage) or []:
            if isinstance(hook, dict) and isinstance(hook.get("environments"), list):
                hook["environments"] = [renamed.get(str(name), name) for name in hook["environments"]]
    return tomli_w.dumps(document)


def _environment_names(text: str) -> list[str]:
    try:
        return sorted(str(env.get("name")) for env in tomllib.loads(text).get("environments", []))
    except (tomllib.TOMLDecodeError, AttributeError):
        return []


def _resumable(results: Path, scenario: str, text: str) -> Any:
    """This target's last unfinished campaign of ``scenario`` (its environments carry the target's name)."""
    from .state import CampaignState

    names = _environment_names(text)
    found = []
    for path in (results / "campaigns").glob("*/state.json"):
        try:
            state = CampaignState.load(path)
        except InputError:
            continue
        if not state.finished and state.scenario == scenario and _environment_names(state.scenario_text) == names:
            found.append((path.stat().st_mtime, state))
    return max(found, key=lambda item: item[0])[1] if found else None


def run_lab_scenario(inventory: Inventory, text: str, source: str, results: Path, *, scale: float = 1.0,
                     resume: bool = False) -> list[LabCampaign]:
    """Run the scenario's whole matrix on every target at the same time, one campaign per target in
    ``results``; returns each target's campaign (the caller reports on their runs).

    With ``resume`` each target continues its last unfinished campaign of this scenario (a target whose
    campaign finished is left alone). Ctrl-C stops every target's run (samples kept, resumable).
    """
    from ..scenario import parse_scenario
    from . import CampaignState

    reachable, unreachable = _resolve_all(inventory)
    outcomes = {t.name: LabCampaign(t.name, reason=unreachable.get(t.name, "")) for t in inventory.targets}
    work: list[tuple[InventoryTarget, Any]] = []  # (target, its campaign's state)
    for target in inventory.targets:
        if target.name not in reachable:
            continue
        bound = scenario_for_target(text, source, target, reachable[target.name], inventory.remote_dir)
        scenario = parse_scenario(bound, f"{source} on target {target.name}")
        if resume:
            state = _resumable(results, scenario.name, bound)
            if state is None:
                outcomes[target.name].reason = "no unfinished campaign of this scenario to resume"
                continue
        else:
            state = CampaignState.create(results, scenario.name, bound, f"{source} on target {target.name}", scale)
        outcomes[target.name].campaign_id = state.campaign_id
        work.append((target, state))
    for name, found in _reclaim_all(inventory, reachable, [target for target, _ in work]).items():
        outcomes[name].reclaimed = found

    # one process per target's campaign: Ctrl-C reaches each campaign as it reaches `rtvirt run` (labworker.py
    # says why not threads); the lab forwards it, once per Ctrl-C, to processes in sessions of their own
    with tempfile.TemporaryDirectory(prefix="rtvirt-lab-") as scratch:
        started = _start_campaigns([(outcomes[target.name], state) for target, state in work], results,
                                   Path(scratch))
        _wait_forwarding_interrupts([proc for _, proc, _ in started])
        for outcome, proc, outcome_path in started:
            _take_outcome(outcome, proc.returncode, outcome_path)
    return list(outcomes.values())


def _start_campaigns(work: list[tuple[LabCampaign, Any]], results: Path,
                     scratch: Path) -> list[tuple[LabCampaign, subprocess.Popen[bytes], Path]]:
    """Start each campaign's process. A Ctrl-C meanwhile takes effect once all are started (none is left
    running unknown to the lab), and is sent on to each."""
    started = []
    try:
        with stops_deferred():
            for outcome, state in work:
                outcome_path = scratch / f"{outcome.name}.json"
                argv = [sys.executable, "-m", "rtvirt.campaign.labworker", str(results), str(state.path),
                        str(outcome_path), str(os.getpid())]
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
                started.append((outcome, process, outcome_path))
    except KeyboardInterrupt:
        _forward_interrupt([process for _, process, _ in started])
    return started


def _wait_forwarding_interrupts(processes: list[subprocess.Popen[bytes]]) -> None:
    """Wait for every campaign process; each Ctrl-C (or SIGTERM) that reaches the lab meanwhile is sent on to
    the ones still running, which stop their run (samples kept) and end."""
    while True:
        try:
            for proc in processes:
                proc.wait()
            return
        except KeyboardInterrupt:
            _forward_interrupt(processes)


def _forward_interrupt(processes: list[subprocess.Popen[bytes]]) -> None:
    """Ctrl-C to each campaign process still running: it stops its run (samples kept) and ends."""
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)


def _take_outcome(outcome: LabCampaign, status: int, path: Path) -> None:
    """What a campaign process wrote to ``path`` (its runs, whether it was interrupted, why it failed)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        outcome.reason = f"its campaign process ended with status {status} without saying how the campaign went"
        return
    outcome.interrupted = bool(found.get("interrupted"))
    outcome.reason = str(found.get("reason", ""))
    outcome.runs = dict(found.get("runs", {}))
    outcome.unmeasured = list(found.get("unmeasured", []))
    outcome.run_ids = list(found.get("run_ids", []))


def _resolve_all(inventory: Inventory) -> tuple[dict[str, SshTarget], dict[str, str]]:
    """Each target's SSH address (labgrid places asked now); a target that cannot be resolved fails alone."""
    targets: dict[str, SshTarget] = {}
    unreachable: dict[str, str] = {}
    for target in inventory.targets:
        try:
            targets[target.name] = inventory.resolve(target)
        except RtvirtError as exc:
            unreachable[target.name] = str(exc)[:500]
    return targets, unreachable


def _reclaim_all(inventory: Inventory, targets: dict[str, SshTarget],
                 wanted: list[InventoryTarget]) -> dict[str, list[str]]:
    """Clean every target before any campaign starts: two targets of a lab may be one machine, and a
    campaign's clean-up must not kill another target's agents. Says what each target had left."""
    found: dict[str, list[str]] = {}

    def clean(target: InventoryTarget) -> None:
        link = TargetLink(targets[target.name], inventory.remote_dir)
        try:
            found[target.name] = link.reclaim()
        except RtvirtError:
            pass  # its campaign will say why this target cannot be reached
        finally:
            link.close()

    if wanted:
        with ThreadPoolExecutor(max_workers=min(len(wanted), 32), thread_name_prefix="rtvirt-lab") as pool:
            list(pool.map(clean, wanted))
    return found
