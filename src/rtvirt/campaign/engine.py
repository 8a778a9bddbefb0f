"""Running a campaign: every planned run in turn, each in a fresh environment, watched and recorded.

Per run: start the environment, start the disturbance (before or after the workload, or on timeline
events), run the probe with its stream written straight into the run directory, watch it (guest boot,
crash, hang), stop everything, write the manifest (with the system audit), update the campaign state.
A failed run is recorded with its reason and the campaign moves on; one whose lab (a machine rtvirt booted to
host the platform) stopped under it is run again, on the lab's fresh boot. Ctrl-C / SIGTERM (KeyboardInterrupt)
stops every process and VM of the current run, keeps its samples (partial) and ends the campaign;
``--resume`` picks up from the state file.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..consoles import make_console
from ..environments import ENVIRONMENTS, Environment, Launched, SharedResources
from ..environments.lab_machine import MAX_REBOOTS
from ..errors import InputError, RtvirtError
from ..explain.tracefs import reclaim_instances
from ..params import CommonParams
from ..probes import PROBES
from ..procs import Supervisor
from ..scenario.matrix import PlannedRun, expand, scaled_params
from ..scenario.schema import Scenario
from ..scenario.studies import study_provenance
from ..store import RunDir, new_run, write_failed_run, write_measured_run
from ..stores.provenance import content_sha256
from ..stream import SampleStream, StreamReader, recover_from_copy
from ..sysaudit import audit_system
from .delivery import delivery_problem, delivery_record, expectation_record
from .disturbance import POLL_S, Disturbance, Teardown, bounded
from .hooks import HookRunner
from .hosttune import tuned_host
from .state import FINISHED, CampaignState

if TYPE_CHECKING:
    from ..explain.session import ExplainSession

__all__ = ["CampaignResult", "run_campaign", "execute_run"]



@dataclass
class RunOutcome:
    status: str  # complete | short | failed | interrupted | skipped
    reason: str = ""
    run_id: str | None = None
    manifest: dict[str, Any] | None = None
    platform_lost: str | None = None  # a failed run's lab stopped under it (Environment.platform_lost): why

    @property
    def measured(self) -> bool:
        """Whether the run measured what it was asked to (docs/scenarios.md, "Exit status"): not failed, and not
        short of samples that were neither taken nor counted as overran periods (a starved probe's missed
        periods are a measurement, which its table row and report show as short)."""
        if self.status == "failed":
            return False
        expectation = (self.manifest or {}).get("expectation") or {}
        return self.status != "short" or not expectation.get("unaccounted", True)


@dataclass
class CampaignResult:
    state: CampaignState
    results: Path
    outcomes: dict[str, RunOutcome] = field(default_factory=dict)
    interrupted: bool = False
    report: Path | None = None


@dataclass
class _RunRecord:
    """What one run gathers on its way, from its start to its manifest."""

    run: RunDir
    marks: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, event), made relative later
    started_at: float = 0.0  # when the environment was made (monotonic)
    workload_start: float | None = None  # when the agent's header arrived
    reason: str = ""
    interrupted: bool = False
    params: CommonParams | None = None
    launched: Launched | None = None
    explaining: ExplainSession | None = None
    hook_log: list[dict[str, Any]] = field(default_factory=list)
    env_description: dict[str, Any] = field(default_factory=dict)
    env_warnings: list[str] = field(default_factory=list)
    platform_delivery: dict[str, Any] = field(default_factory=dict)
    platform_audit: dict[str, Any] = field(default_factory=dict)
    copy: Path | None = None  # the guest's own copy of its stream
    platform_lost: str | None = None  # the lab under a failed run stopped: why (Environment.platform_lost)

    def mark(self, action: str) -> None:
        self.marks.append((time.monotonic(), action))


@dataclass
class _Judgement:
    """How a finished run went: its campaign status, why (a failure's reason, or a note on a run that stands),
    and what its manifest records beside the samples."""

    status: str
    reason: str
    note: str
    extra: dict[str, Any]


class _RunExecution:
    """One planned run in a fresh environment, in the steps a reader names: set up, measure (watched), tear down
    (:meth:`measure`); take the stream (:meth:`take_stream`); judge it and store it (:meth:`store`)."""

    def __init__(self, scenario: Scenario, plan: PlannedRun, results: Path, *, run_timeout_ns: int,
                 system: dict[str, Any], on_progress: Callable[[float, int, int | None], None] | None,
                 shared: SharedResources | None, hooks: HookRunner | None) -> None:
        self.scenario, self.plan, self.system = scenario, plan, system
        self.run_timeout_ns, self.on_progress, self.shared, self.hooks = run_timeout_ns, on_progress, shared, hooks
        self.env_config = scenario.environments[plan.environment]
        self.disturbance_spec = scenario.disturbances[plan.disturbance]
        self.workload = scenario.probe_workloads()[plan.workload]
        self.probe = PROBES[self.workload.probe]
        self.record = _RunRecord(new_run(results, plan.key.replace("/", "_")))
        self.run = self.record.run
        self.hook_values = {"environment": self.env_config.label, "disturbance": self.disturbance_spec.name,
                            "repetition": str(plan.repetition), "key": plan.key, "run_id": self.run.run_id}
        self.stressor_results: list[dict[str, Any]] = []

    # ---- measure: set up, watch, tear down --------------------------------------------------------------------

    def measure(self) -> None:
        """Set up, run and watch the probe, tear everything down; never raises for run failures, and Ctrl-C or
        SIGTERM ends it as ``record.interrupted``."""
        record = self.record
        workdir = self.run.path / "work"
        with Supervisor() as supervisor:
            env = ENVIRONMENTS[self.env_config.kind](self.env_config, supervisor, workdir, self.shared)
            disturbance = Disturbance(self.disturbance_spec.stressors, env, supervisor)
            record.started_at = time.monotonic()  # the watchdog counts the set-up too (a lab's, a guest's boot)
            try:
                self._set_up(env, disturbance)
                record.reason = self._watch(env, disturbance)
            except KeyboardInterrupt:
                record.interrupted = True
                record.reason = "interrupted (Ctrl-C or SIGTERM)"
            except RtvirtError as exc:
                record.reason = str(exc)
            finally:
                teardown = self._tear_down(env, disturbance, supervisor)
        if teardown.problems:  # the measurement may be whole, but what surrounded it did not end as it should
            record.reason = record.reason or f"teardown: {'; '.join(teardown.problems)}"
        # the per-run initramfs is a copy of the cached image plus a few bytes of jobs: not worth keeping
        for leftover in workdir.glob("**/initramfs.cpio"):
            leftover.unlink(missing_ok=True)

    def _set_up(self, env: Environment, disturbance: Disturbance) -> None:
        """Hooks, the environment, the probe's parameters, the tracing and the disturbance that starts first."""
        record, plan = self.record, self.plan
        if self.hooks is not None:
            record.hook_log += self.hooks.run("before_run", self.hook_values, self.env_config.label)
        env.start()
        try:
            record.params = self.probe.params(**{**scaled_params(self.workload.params, plan.scale),
                                                 "duration": f"{plan.duration_ns}ns", **env.probe_overrides()})
        except ValidationError as exc:
            raise InputError(f"workload.params: {exc.errors()[0]['msg']}") from None
        if env.on_host:
            record.params.check_host(env.platform_cpus())  # a v2 partition root took its CPUs from us
        if self.scenario.explain is not None and self.scenario.explain.enabled:
            from ..explain.sources import session_for  # the explanation's layers: for an explained run only

            record.explaining = session_for(env, self.scenario.explain)
            record.explaining.start(self.run.stream_path)  # before any stressor: the trace covers the whole run
        if plan.events:
            disturbance.prepare()
        if plan.start_order == "stress-first":
            disturbance.start()
            record.mark("stress-on")
            time.sleep(plan.settle_ns / 1e9)

    def _watch(self, env: Environment, disturbance: Disturbance) -> str:
        """Launch the probe and follow it to its end: samples counted as they come, the timeline's stress
        switched, the platform and the watchdog asked; returns why the run failed ("" when it did not)."""
        record, plan = self.record, self.plan
        assert record.params is not None
        record.launched = launched = env.launch("rtvirt-probe", self.probe.command(record.params, "")[1:],
                                                self.run.stream_path)
        reader = StreamReader(self.run.stream_path)
        pending = list(plan.events)
        samples, peak = 0, None
        while launched.poll() is None:
            time.sleep(POLL_S)
            new = reader.poll()
            if new.size:
                samples += int(new.size)
                top = int(np.max(new["value"]))
                peak = top if peak is None else max(peak, top)
            if reader.ended:
                launched.confirm_end(samples)  # a guest's agent waits for it before the guest powers off
            if record.workload_start is None and reader.header is not None:
                record.workload_start = time.monotonic()
                record.mark("workload-start")
            if record.workload_start is not None:
                self._follow_timeline(disturbance, pending, time.monotonic() - record.workload_start)
                if self.on_progress:
                    elapsed_ns = (time.monotonic() - record.workload_start) * 1e9
                    self.on_progress(min(elapsed_ns / plan.duration_ns, 1.0), samples, peak)
            env.after_launch(launched)
            problem = env.check() or disturbance.check()
            if problem:
                return problem
            if overrun := self._watchdog():
                return overrun
        reason = env.check() or ""
        status = launched.returncode
        if not reason and status not in (0, None):
            reason = f"probe exited with status {status}: {launched.error_tail() or 'no message'}"
        return reason

    def _watchdog(self) -> str:
        """Why the watchdog stops the run now ("" while it may go on). Until the workload starts the run is in
        set-up and its guest's boot, which the environment bounds by boot_timeout (and says when a boot overran
        it): the watchdog allows that much more than run_timeout; from the workload's start, its duration plus
        run_timeout."""
        timeout_s = self.run_timeout_ns / 1e9
        if self.record.workload_start is None:
            boot_s = getattr(self.env_config, "boot_timeout", 0) / 1e9
            if time.monotonic() - self.record.started_at > boot_s + timeout_s:
                return f"watchdog: the workload did not start within {boot_s + timeout_s:.0f}s of the run's start"
            return ""
        allowed_s = self.plan.duration_ns / 1e9 + timeout_s
        if time.monotonic() - self.record.workload_start > allowed_s:
            return f"watchdog: the run did not end within {allowed_s:.0f}s of its workload's start"
        return ""

    def _follow_timeline(self, disturbance: Disturbance, pending: list[tuple[int, str]], elapsed_s: float) -> None:
        """Switch the stress on and off as the timeline says, ``elapsed_s`` into the workload."""
        plan, elapsed_ns = self.plan, elapsed_s * 1e9
        if plan.start_order == "test-first" and not disturbance.on and elapsed_ns >= plan.settle_ns:
            disturbance.start()
            self.record.mark("stress-on")
        while pending and elapsed_ns >= pending[0][0]:
            _, action = pending.pop(0)
            if action == "stress-on":
                disturbance.start()
            else:
                disturbance.stop()
            self.record.mark(action)

    def _tear_down(self, env: Environment, disturbance: Disturbance, supervisor: Supervisor) -> Teardown:
        """Stop the tracing, the disturbance and the environment, keeping what they said; every step is tried."""
        record, teardown = self.record, Teardown()
        if record.explaining is not None:
            record.explaining.stop()  # as soon as the agent ended: never raises, the trace is bounded
        if disturbance.on:
            teardown.attempt(disturbance.stop)
            record.mark("stress-off")
        teardown.attempt(disturbance.close_guests)
        self.stressor_results = disturbance.summaries
        record.env_description = teardown.attempt(env.describe) or {}
        record.platform_delivery = teardown.attempt(env.delivery) or {}
        record.copy = teardown.attempt(env.stream_copy)
        record.platform_audit = teardown.attempt(env.platform_audit) or {}
        record.env_warnings = env.warnings()
        if record.reason and not record.interrupted:
            record.platform_lost = teardown.attempt(lambda: env.platform_lost(record.reason))
            if record.platform_lost and record.platform_lost not in record.reason:  # the cause before its symptom
                record.reason = f"{record.platform_lost} ({record.reason})"
        teardown.attempt(env.close)
        supervisor.stop_all()
        if self.hooks is not None:
            hooks = self.hooks
            record.hook_log += teardown.attempt(
                lambda: hooks.run("after_run", self.hook_values, self.env_config.label)) or []
        return teardown

    # ---- the stream, its verdict, the store -------------------------------------------------------------------

    def take_stream(self) -> SampleStream | None:
        """The run's stream as the host holds it, or the guest's own copy when the live one fell short (None: no
        readable stream; the record's reason then says why)."""
        record = self.record
        unreadable = ""
        stream: SampleStream | None
        try:
            stream = StreamReader(self.run.stream_path).finish()
        except InputError as exc:
            stream, unreadable = None, f"no samples: {exc}"
        if record.copy is not None:  # the guest's own copy: the run's stream if the live one fell short
            recovered = recover_from_copy(record.copy, self.run.stream_path)
            record.copy.unlink()
            if recovered is not None:
                record.platform_delivery["recovered"] = (
                    f"from the guest's copy: {recovered.records.size} records, the live stream held "
                    f"{0 if stream is None else stream.records.size}")
                stream, unreadable = recovered, ""
        record.reason = record.reason or unreadable
        return stream

    def judge(self, stream: SampleStream | None) -> _Judgement:
        """Did every sample arrive, were there as many as promised: the run's status and what its manifest says
        of its delivery and expectation. A run short of its promise stands, as ``short``, with why."""
        record, extra = self.record, {}
        reason, note = record.reason, ""
        if stream is not None:
            extra["delivery"] = delivery_record(stream, record.launched.confirmation if record.launched else None,
                                                record.platform_delivery)
            reason = reason or delivery_problem(extra["delivery"]) or ""
            promised = self.probe.expected_samples(record.params) if self.probe.expected_samples and \
                record.params else None
            expectation = expectation_record(stream, promised, self.plan.duration_ns)
            if expectation is not None:
                extra["expectation"] = expectation
                if expectation.get("short"):
                    note = f"{expectation['taken']} of {expectation['expected']} samples expected: {expectation['why']}"
        elif record.platform_delivery:
            extra["delivery"] = {"agent_records": None, "host_records": 0, **record.platform_delivery}
        status = "interrupted" if record.interrupted else "failed" if reason else "short" if note else "complete"
        return _Judgement(status, reason, note, extra | self._provenance(status, reason or note))

    def _provenance(self, status: str, said: str) -> dict[str, Any]:
        """The manifest's account of where the run came from and what happened around it."""
        record, plan, scenario = self.record, self.plan, self.scenario
        # events before the workload started (stress-first) get negative times
        origin = record.workload_start if record.workload_start is not None else \
            (record.marks[0][0] if record.marks else 0.0)
        timeline = [{"t_ns": int((at - origin) * 1e9), "event": event} for at, event in record.marks]
        run_system = {**self.system, "warnings": [*self.system.get("warnings", []), *record.env_warnings],
                      **({"platform": record.platform_audit} if record.platform_audit else {})}
        return {"scenario": scenario.name,
                "scenario_sha256": content_sha256(scenario.model_dump(mode="json", exclude={"repetitions"})),
                "environment": self.env_config.label, "config": plan.config,
                "repetition": plan.repetition, "timeline": timeline, "system": run_system,
                "environment_detail": record.env_description,
                "study": study_provenance(scenario, plan),
                "hooks": record.hook_log,
                "campaign": {**_run_identity(scenario, plan),
                             "events": [{"t_ns": at, "action": action} for at, action in plan.events],
                             "stressors": [u.model_dump(mode="json") for u in self.disturbance_spec.stressors],
                             "stressor_results": self.stressor_results,
                             "outcome": status, "reason": bounded(said) or None,
                             **({"platform_lost": bounded(record.platform_lost)} if record.platform_lost else {})}}

    def store(self, stream: SampleStream | None, verdict: _Judgement) -> RunOutcome:
        """Write the run: its samples, explanation and manifest, or, without samples, a failed run's manifest."""
        record, extra, status, reason = self.record, verdict.extra, verdict.status, verdict.reason
        run_params = record.params.model_dump(mode="json") if record.params else {}
        # a probe that ran to its END and saw nothing (a gap probe without interruptions above its threshold) is a
        # measurement and is stored; a run that got no samples otherwise still leaves its manifest: why, and what
        # the platform said
        if stream is None or (stream.records.size == 0 and (reason or record.interrupted
                                                            or stream.end_reason != "complete")):
            reason = reason or "the probe produced no samples"
            status = "interrupted" if record.interrupted else "failed"
            extra["campaign"] |= {"outcome": status, "reason": bounded(reason)}
            write_failed_run(self.run, name=self.scenario.name, params=run_params, extra=extra)
            return RunOutcome(status, bounded(reason), self.run.run_id, platform_lost=self._lost(status))
        if record.explaining is not None and stream.records.size:
            extra["explain"] = record.explaining.explain_into(self.run.path, stream, record.launched.agent_pids()
                                                              if record.launched else ())
            if extra["explain"].get("interrupted") and not record.interrupted:  # Ctrl-C while explaining
                status = "interrupted"
                extra["campaign"] |= {"outcome": status}
        manifest = write_measured_run(self.run, stream, name=self.scenario.name, params=run_params,
                                      group_by=self.probe.group_by, extra=extra, short=status == "short")
        return RunOutcome(status, bounded(reason or verdict.note), self.run.run_id, manifest, self._lost(status))

    def _lost(self, status: str) -> str | None:
        return self.record.platform_lost if status == "failed" else None


def execute_run(scenario: Scenario, plan: PlannedRun, results: Path, *, run_timeout_ns: int,
                system: dict[str, Any], on_progress: Callable[[float, int, int | None], None] | None = None,
                on_run_dir: Callable[[str], None] | None = None,
                shared: SharedResources | None = None, hooks: HookRunner | None = None) -> RunOutcome:
    """Run one planned run in a fresh environment; never raises for run failures (only Ctrl-C).

    ``shared`` carries what runs of one campaign reuse (a Xen lab boot, connections); without it the
    run makes and closes its own.
    """
    execution = _RunExecution(scenario, plan, results, run_timeout_ns=run_timeout_ns, system=system,
                              on_progress=on_progress, shared=shared, hooks=hooks)
    if on_run_dir:
        on_run_dir(execution.run.run_id)
    execution.measure()
    stream = execution.take_stream()
    return execution.store(stream, execution.judge(stream))


def _availability(scenario: Scenario) -> dict[int, str | None]:
    return {i: ENVIRONMENTS[env.kind].available() for i, env in enumerate(scenario.environments)}


def _reclaim(scenario: Scenario, availability: dict[int, str | None], shared: SharedResources,
             console: Console) -> None:
    """Remove what a killed earlier campaign left on each platform (domains, cpupools, remote agents)."""
    for index, env in enumerate(scenario.environments):
        if availability[index]:
            continue
        try:
            removed = ENVIRONMENTS[env.kind].reclaim(env, shared)
        except RtvirtError as exc:
            console.print(f"[yellow]warning:[/] {env.label}: leftovers not reclaimed: {bounded(str(exc))}",
                          markup=True, highlight=False)
            continue
        for what in removed:
            console.print(f"reclaimed {bounded(what)}", markup=False, highlight=False)
    for what in reclaim_instances():  # the tracefs instances of a killed explained run
        console.print(f"reclaimed {bounded(what)}", markup=False, highlight=False)


def run_campaign(scenario: Scenario, state: CampaignState, results: Path, *, console: Console | None = None,
                 show_progress: bool = True, write_report: bool = True, reclaim: bool = True,
                 shared: SharedResources | None = None,
                 on_run_end: Callable[[RunOutcome], None] | None = None) -> CampaignResult:
    """Run every unfinished run of ``state``'s campaign; returns what happened to each.

    ``reclaim=False``: the caller already cleaned the platforms (a lab cleans all its targets before any
    campaign starts, since two targets may be one machine). ``shared``: the caller's, kept open after this
    campaign (several campaigns on one Xen lab boot); by default the campaign's own, closed at its end.
    ``on_run_end``: called with each run's outcome once its manifest and the state are written, before the
    next run starts (a shared store delivers the run there)."""
    console = console or make_console(stderr=True)
    plans = expand(scenario, state.scale)
    if scenario.predict is not None:  # a bad explicit model is bad input: refused before measuring
        from ..predict.campaign import check_predict

        check_predict(scenario, state)
    result = CampaignResult(state, results)
    availability = _availability(scenario)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"))
    progress = Progress(*columns, console=console, disable=not show_progress, transient=False)
    with progress, (SharedResources() if shared is None else contextlib.nullcontext(shared)) as shared, \
            tuned_host(scenario, progress.console) as checklist:  # [host] tune: restored whatever happens
        system = {**audit_system(), "checklist": checklist}
        if reclaim:
            _reclaim(scenario, availability, shared, progress.console)
        hooks = HookRunner(scenario.hooks, shared)
        campaign_values = {"key": scenario.name}
        hooks.run("before_campaign", campaign_values)
        try:
            _run_plans(scenario, state, results, plans, availability, system, progress, hooks, shared, result,
                       on_run_end)
        finally:
            for record in hooks.run("after_campaign", campaign_values):
                if record["status"] != 0:
                    progress.console.print(f"[yellow]warning:[/] after_campaign hook {record['argv'][0][:100]!r} "
                                           f"failed ({record['status']})", markup=True, highlight=False)
    if result.interrupted:
        return result
    if scenario.predict is not None:  # the model's answers beside the measured ones (docs/predictions.md)
        from ..predict.campaign import predict_campaign

        for message in predict_campaign(scenario, plans, results, state):
            console.print(message, markup=False, highlight=False)
    state.finished = True
    state.save()
    if write_report:
        result.report = _write_report(results, state)
    return result


def _run_plans(scenario: Scenario, state: CampaignState, results: Path, plans: list[PlannedRun],
               availability: dict[int, str | None], system: dict[str, Any], progress: Progress,
               hooks: HookRunner, shared: SharedResources, result: CampaignResult,
               on_run_end: Callable[[RunOutcome], None] | None = None) -> None:
    """Every unfinished run of the matrix in turn (the body of :func:`run_campaign`); a run whose lab stopped
    under it is run again (on the lab's fresh boot)."""
    expected_s = sum(p.duration_ns for p in plans if not state.is_finished(p.key)) / 1e9
    matrix: TaskID = progress.add_task(f"campaign {scenario.name}", total=max(expected_s, 1e-9), status="")
    measure = _PlanMeasurement(scenario, state, results, system, progress, matrix, hooks, shared)
    for index, plan in enumerate(plans, 1):
        _adopt_finished_run(state, plan.key, results)
        if state.is_finished(plan.key):
            result.outcomes[plan.key] = _finished_outcome(state.runs[plan.key], results)
            continue
        unavailable = availability[plan.environment]
        if unavailable and scenario.skip_unavailable:
            state.record(plan.key, status="skipped", reason=bounded(unavailable), config=plan.config)
            result.outcomes[plan.key] = RunOutcome("skipped", unavailable)
            progress.advance(matrix, plan.duration_ns / 1e9)
            continue
        killed = state.runs.get(plan.key, {})
        if killed.get("status") == "running" and killed.get("run_id") and \
                _salvage_killed_run(scenario, plan, results, str(killed["run_id"])):
            state.record(plan.key, salvaged=[*killed.get("salvaged", []), killed["run_id"]])
        outcome = measure(plan, f"{index}/{len(plans)}")
        # each attempt lost with its lab is made again in the lab's next boot (open_lab bounds the boots)
        for _ in range(MAX_REBOOTS):
            if not outcome.platform_lost:
                break
            state.record(plan.key, lost=[*state.runs[plan.key].get("lost", []), outcome.run_id])
            if on_run_end is not None:  # (a shared store keeps the lost attempt too)
                on_run_end(outcome)
            progress.console.print(f"[yellow]again[/] {plan.key}: its lab stopped under it; running it once more",
                                   markup=True, highlight=False)
            outcome = measure(plan, f"{index}/{len(plans)} again")
        result.outcomes[plan.key] = outcome
        if on_run_end is not None:
            on_run_end(outcome)
        if outcome.status == "interrupted":
            result.interrupted = True
            return


@dataclass
class _PlanMeasurement:
    """One measurement of a planned run within the campaign's progress display and state."""

    scenario: Scenario
    state: CampaignState
    results: Path
    system: dict[str, Any]
    progress: Progress
    matrix: TaskID
    hooks: HookRunner
    shared: SharedResources

    def __call__(self, plan: PlannedRun, label: str) -> RunOutcome:
        progress, state = self.progress, self.state
        run_task = progress.add_task(f"{label} {plan.key}", total=1.0, status="starting")
        done_before = progress.tasks[self.matrix].completed

        def show(fraction: float, samples: int, peak: int | None) -> None:
            top = "-" if peak is None else f"{peak / 1000:.1f} us"
            progress.update(run_task, completed=fraction, status=f"{samples} samples, max {top}")
            progress.update(self.matrix, completed=done_before + fraction * plan.duration_ns / 1e9)

        def remember_run_dir(run_id: str) -> None:
            state.record(plan.key, run_id=run_id)  # so a killed campaign's state names the unfinished run

        state.record(plan.key, status="running", config=plan.config)
        outcome = execute_run(self.scenario, plan, self.results, run_timeout_ns=self.scenario.run_timeout,
                              system=self.system, on_progress=show, on_run_dir=remember_run_dir,
                              shared=self.shared, hooks=self.hooks)
        progress.remove_task(run_task)
        progress.update(self.matrix, completed=done_before + plan.duration_ns / 1e9)
        state.record(plan.key, status=outcome.status, run_id=outcome.run_id, reason=outcome.reason)
        colour = {"complete": "green", "failed": "red"}.get(outcome.status, "yellow")
        progress.console.print(f"[{colour}]{outcome.status}[/] {plan.key}"
                               + (f": {outcome.reason}" if outcome.reason else ""), markup=True,
                               highlight=False)
        return outcome


def _finished_outcome(entry: dict[str, Any], results: Path) -> RunOutcome:
    """A run a resumed campaign finished before; a short one with its manifest (whether its missing samples are
    accounted for decides the exit status)."""
    manifest = _stored_manifest(results, entry) if entry.get("status") == "short" else None
    return RunOutcome(entry["status"], entry.get("reason", ""), entry.get("run_id"), manifest)


def _stored_manifest(results: Path, entry: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the state ``entry``'s run, or None: no run id, no manifest (killed mid-run), unreadable."""
    if not entry.get("run_id"):
        return None
    run = RunDir(str(entry["run_id"]), Path(results) / "runs" / str(entry["run_id"]))
    try:
        manifest = json.loads(run.manifest_path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _adopt_finished_run(state: CampaignState, key: str, results: Path) -> None:
    """A run still "running" in the state whose manifest says it finished: the interrupt came after its manifest
    was written and before the state was (seen: Ctrl-C of `rtvirt lab` as a run ended). The state takes the
    manifest's outcome, so that --resume does not measure it a second time."""
    entry = state.runs.get(key, {})
    if entry.get("status") != "running":
        return
    campaign = (_stored_manifest(results, entry) or {}).get("campaign")
    if not isinstance(campaign, dict) or "outcome" not in campaign:
        return  # no manifest (killed mid-run: salvaged below) or not one we can read
    outcome, reason = str(campaign["outcome"]), str(campaign.get("reason") or "")
    if outcome in FINISHED:
        state.record(key, status=outcome, reason=reason)


def _run_identity(scenario: Scenario, plan: PlannedRun) -> dict[str, Any]:
    """Where a run stands in its campaign's matrix, as every manifest of it says (a salvaged partial run's too:
    the study tables read its configuration's group, workload and disturbance from whichever run comes first)."""
    return {"key": plan.key, "group": plan.group, "workload": scenario.probe_workloads()[plan.workload].name,
            "disturbance": scenario.disturbances[plan.disturbance].name, "start_order": plan.start_order}


def _salvage_killed_run(scenario: Scenario, plan: PlannedRun, results: Path, run_id: str) -> bool:
    """Keep the samples of a run whose campaign was killed (kill -9, power loss) as a partial run.

    The stream on disk ends at the kill, without END; the run is redone afterwards, and this partial
    one stays beside it, labelled with the same configuration. Returns whether a partial run was kept.
    """
    run = RunDir(run_id, Path(results) / "runs" / run_id)
    for copy in (run.path / "work").glob("**/stream-copy.img"):  # a guest's copy of its stream (sparse)
        if not run.manifest_path.exists():
            recover_from_copy(copy, run.stream_path)
        copy.unlink()
    if run.manifest_path.exists() or not run.stream_path.exists():
        return False
    try:
        stream = StreamReader(run.stream_path).finish()
    except InputError:
        return False  # killed before the header was written: nothing was measured
    if stream.records.size == 0:
        return False
    extra = {"scenario": scenario.name, "environment": scenario.environments[plan.environment].label,
             "config": plan.config, "repetition": plan.repetition,
             "campaign": {**_run_identity(scenario, plan), "outcome": "killed",
                          "reason": "the campaign was killed while this run was in progress"}}
    write_measured_run(run, stream, name=scenario.name, params=stream.header.get("params", {}),
                       group_by=PROBES[scenario.probe_workloads()[plan.workload].probe].group_by, extra=extra)
    return True


def _write_report(results: Path, state: CampaignState) -> Path | None:
    from ..results.report import write_report

    out = Path(results) / "campaigns" / state.campaign_id / "report.html"
    run_ids = {str(entry["run_id"]) for entry in state.runs.values() if entry.get("run_id")}
    run_ids.update(str(salvaged) for entry in state.runs.values() for salvaged in entry.get("salvaged", []))
    return write_report(results, out, "html", run_ids=run_ids)
