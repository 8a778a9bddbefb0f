"""Start, follow and stop a stressor, on our own agent or on stress-ng.

The library API the campaign engine and the CLI share::

    running = start_stressor("cpu", {"cpus": [1], "slice": "2ms", "period": "10ms", "priority": 80,
                                     "duration": 0}, supervisor)
    ...                         # measure something meanwhile
    summary = running.stop()    # StressSummary: bogo-ops, elapsed, CPU time per part and worker

    summary = run_stressor("mem", {"duration": "5s"})   # blocking; Ctrl-C stops it and still summarises
"""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import yaml
from pydantic import ValidationError

from ..agents import agent_path
from ..errors import InputError, PrivilegeError, RunError, first_validation_error
from ..procs import Supervisor, owned_temp_dir
from .base import PartSummary, StressorSpec, StressParams, StressSummary
from .registry import stressor_spec
from .running import StressorClock, native_summary

__all__ = ["ENGINES", "Engine", "StressProgress", "RunningStressor", "StoppedWhileStarting", "start_stressor",
           "run_stressor", "follow_stressor", "resolve_params", "stress_ng_command"]

Engine = Literal["native", "stress-ng"]
ENGINES: tuple[Engine, ...] = ("native", "stress-ng")
# stress-ng stressor name -> our part name, for reading its metrics back.
_STRESS_NG_PARTS = {"cpu": "cpu", "cache": "cache", "vm": "mem", "hdd": "io", "timer": "irq"}
_TAIL_CHARS = 2000  # bound on what we keep of a child's stderr for messages
# + <pid>-<start time>-<random>: a stressor's files (its output, stress-ng's), removed by the next one if we were killed
WORKDIR_PREFIX = "rtvirt-stress-"


@dataclass
class StressProgress:
    elapsed_s: float
    duration_s: float | None


def resolve_params(spec: StressorSpec, params: StressParams | Mapping[str, Any] | None) -> StressParams:
    """Validate library input into the stressor's model; an error names the field."""
    if isinstance(params, spec.params):
        return params
    values = params.model_dump() if isinstance(params, StressParams) else dict(params or {})
    try:
        return spec.params(**values)
    except ValidationError as exc:
        where, message = first_validation_error(exc, "parameters")
        raise InputError(f"stressor {spec.name}: {where}: {message}") from None


def _check_privilege(params: StressParams) -> None:
    if params.priority and os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_RTPRIO)[0] < params.priority:
        raise PrivilegeError(f"option -p/--priority {params.priority}: SCHED_FIFO needs root or CAP_SYS_NICE "
                             "(or an RLIMIT_RTPRIO that allows it); use --priority 0")


def stress_ng_command(spec: StressorSpec, params: StressParams, yaml_path: Path, temp_dir: Path) -> list[str]:
    """The stress-ng command standing in for ``spec`` (argv list, never a shell string)."""
    executable = shutil.which("stress-ng")
    if executable is None:
        raise InputError("option --engine stress-ng: stress-ng is not installed here (Debian package stress-ng); "
                         "use --engine native")
    if spec.stress_ng is None:
        raise InputError(f"option --engine stress-ng: stressor {spec.name} has no stress-ng equivalent")
    argv = [executable, *spec.stress_ng(params, params.worker_count())]
    # stress-ng counts whole seconds: it gets a rounded-up safety timeout, and we stop it on time.
    argv += ["--timeout", f"{math.ceil(params.duration / 1e9)}s" if params.duration else "0"]
    argv += ["--metrics-brief", "--yaml", str(yaml_path)]
    if "--temp-path" not in argv:  # stress-ng's scratch files go to our private directory
        argv += ["--temp-path", str(temp_dir)]
    if params.cpus:
        argv += ["--taskset", ",".join(map(str, params.cpus))]
    if params.priority:
        argv += ["--sched", "fifo", "--sched-prio", str(params.priority)]
    return argv


def _hold_stop_signals() -> None:
    # In the child before exec (the mask survives exec): a stop that comes before the agent's main() blocks these
    # itself waits for it instead of killing it without a summary (seen: SIGTERM while the loader ran, exit -15)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class StoppedWhileStarting(KeyboardInterrupt):
    """Ctrl-C/SIGTERM came while the stressor started: it was stopped, and ``summary`` is what it did."""

    def __init__(self, summary: StressSummary):
        super().__init__()
        self.summary = summary


class RunningStressor(StressorClock):
    """A stressor that is running; ``stop()`` or ``wait()`` ends it and returns its summary."""

    def __init__(self, spec: StressorSpec, params: StressParams, engine: Engine, supervisor: Supervisor | None):
        self.spec, self.params, self.engine = spec, params, engine
        self._own_supervisor = supervisor is None
        self.supervisor = supervisor or Supervisor()
        self._workdir = owned_temp_dir(WORKDIR_PREFIX)
        work = Path(self._workdir.name)
        self._yaml_path = work / "metrics.yaml"
        try:
            if engine == "native":
                self.argv = spec.command(params, str(agent_path("rtvirt-stress")))
            else:
                (work / "files").mkdir()
                self.argv = stress_ng_command(spec, params, self._yaml_path, work / "files")
        except Exception:
            self._workdir.cleanup()
            raise
        # Files, not pipes, so a chatty child never blocks; they live as long as the run (closed in _finish).
        self._stdout: IO[bytes] = open(work / "stdout", "w+b")  # noqa: SIM115
        self._stderr: IO[bytes] = open(work / "stderr", "w+b")  # noqa: SIM115
        self._summary: StressSummary | None = None
        self._failure: Exception | None = None  # kept so that a second stop() reports the same failure
        self._stopped_early = False
        self.process = self.supervisor.start(self.argv, stdout=self._stdout, stderr=self._stderr,
                                             before_exec=_hold_stop_signals if engine == "native" else None)
        self.started = time.monotonic()
        if engine == "native":
            try:
                self._await_start()
            except KeyboardInterrupt:
                raise StoppedWhileStarting(self.stop()) from None

    def _await_start(self, timeout: float = 10.0) -> None:
        """Return once the agent says every worker runs; bad options surface here as InputError."""
        limit = time.monotonic() + timeout
        with open(self._stdout.name, "rb") as out:
            while not out.readline().endswith(b"\n"):
                out.seek(0)
                if self.process.poll() is not None:
                    self._finish(early=False)  # raises the agent's own message
                    raise RunError(f"rtvirt-stress {self.spec.name} ended at start-up ({self.process.returncode})")
                if time.monotonic() > limit:
                    self.stop()
                    raise RunError(f"rtvirt-stress {self.spec.name} did not start within {timeout:.0f} s")
                time.sleep(0.002)
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self._summary is None and self.process.poll() is None and not self._deadline_passed()

    def _deadline_passed(self) -> bool:
        # Only stress-ng needs us to keep time: our agent ends itself on the nanosecond.
        return self.engine == "stress-ng" and self.duration_s is not None and self.elapsed_s >= self.duration_s

    def wait(self, timeout: float | None = None) -> StressSummary:
        """Block until the run reaches its duration; raises TimeoutError after ``timeout`` seconds."""
        if self._summary is not None:
            return self._summary
        limit = None if timeout is None else time.monotonic() + timeout
        while self.process.poll() is None:
            if self._deadline_passed():
                return self._finish(early=False)
            if limit is not None and time.monotonic() >= limit:
                raise TimeoutError(f"stressor {self.spec.name} still running after {timeout} s")
            time.sleep(0.05)
        return self._finish(early=False)

    def stop(self, grace: float = 5.0) -> StressSummary:
        """Stop now (SIGTERM to its process group, SIGKILL after ``grace`` s) and summarise."""
        if self._summary is not None:
            return self._summary
        return self._finish(early=self.process.poll() is None and not self._deadline_passed(), grace=grace)

    def _finish(self, early: bool, grace: float = 5.0) -> StressSummary:
        if self._failure is not None:
            raise self._failure
        self._stopped_early = early
        status = self.supervisor.stop(self.process, grace=grace)
        elapsed_ns = int(self.elapsed_s * 1e9)
        try:
            self._summary = self._parse(status, elapsed_ns)
        except Exception as exc:
            self._failure = exc
            raise
        finally:
            self._stdout.close()
            self._stderr.close()
            if self._own_supervisor:
                self.supervisor.stop_all()
            self._workdir.cleanup()
        return self._summary

    def _stderr_tail(self) -> str:
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - _TAIL_CHARS))
        return self._stderr.read().decode(errors="replace")

    def _parse(self, status: int | None, elapsed_ns: int) -> StressSummary:
        if self.engine == "native":
            return self._parse_native(status)
        return self._parse_stress_ng(status, elapsed_ns)

    def _parse_native(self, status: int | None) -> StressSummary:
        self._stdout.seek(0)
        return native_summary(status, self._stdout.read(), self._stderr_tail(), self.argv)

    def _parse_stress_ng(self, status: int | None, elapsed_ns: int) -> StressSummary:
        try:
            document = yaml.safe_load(self._yaml_path.read_text(errors="replace")) if self._yaml_path.exists() else {}
        except yaml.YAMLError as exc:
            raise RunError(f"stress-ng wrote unreadable metrics: {exc}") from None
        metrics = (document or {}).get("metrics") or []
        if not metrics:
            tail = self._stderr_tail().strip().splitlines()
            raise RunError(f"stress-ng ended ({status}) without metrics: {tail[-1] if tail else 'no message'}")
        parts = []
        for entry in metrics:
            name = str(entry.get("stressor"))
            flag = f"--{name}"
            workers = int(self.argv[self.argv.index(flag) + 1]) if flag in self.argv else 0
            seconds = float(entry.get("wall-clock-time") or 0.0)
            parts.append(PartSummary(
                name=_STRESS_NG_PARTS.get(name, name), workers=workers, bogo_ops=int(entry.get("bogo-ops") or 0),
                elapsed_ns=int(seconds * 1e9), bogo_ops_per_s=float(entry.get("bogo-ops-per-second-real-time") or 0),
                cpu_time_ns=int((float(entry.get("user-time") or 0) + float(entry.get("system-time") or 0)) * 1e9),
            ))
        return StressSummary(
            stressor=self.spec.name, engine="stress-ng", end="signal" if self._stopped_early else "complete",
            elapsed_ns=elapsed_ns, workers=sum(p.workers for p in parts), priority=self.params.priority,
            bogo_ops=sum(p.bogo_ops for p in parts), cpus=list(self.params.cpus or ()), parts=parts,
            command=self.argv,
        )

    def __enter__(self) -> RunningStressor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_stressor(
    stressor: str | StressorSpec,
    params: StressParams | Mapping[str, Any] | None = None,
    supervisor: Supervisor | None = None,
    *,
    engine: Engine = "native",
) -> RunningStressor:
    """Start ``stressor`` in the background under ``supervisor`` (a private one when None).

    ``params`` is the stressor's model or a mapping validated into it (``{"cpus": "1", "duration": "5s"}``).
    Bad input raises InputError naming the field; a missing engine raises InputError naming --engine.
    """
    spec = stressor_spec(stressor)
    if engine not in ENGINES:
        raise InputError(f"option --engine: {engine!r} is not one of {', '.join(ENGINES)}")
    resolved = resolve_params(spec, params)
    resolved.check_host()
    _check_privilege(resolved)
    return RunningStressor(spec, resolved, engine, supervisor)


def run_stressor(
    stressor: str | StressorSpec,
    params: StressParams | Mapping[str, Any] | None = None,
    *,
    engine: Engine = "native",
    supervisor: Supervisor | None = None,
    on_progress: Callable[[StressProgress], None] | None = None,
    poll_interval: float = 0.25,
) -> StressSummary:
    """Run to the end of the duration (or Ctrl-C/SIGTERM as KeyboardInterrupt) and return the summary."""
    try:
        running = start_stressor(stressor, params, supervisor, engine=engine)
    except StoppedWhileStarting as stopped:  # a stop during start-up is a stop too (a loaded host starts slowly)
        return stopped.summary
    return follow_stressor(running, on_progress, poll_interval)


def follow_stressor(running: Any, on_progress: Callable[[StressProgress], None] | None = None,
                    poll_interval: float = 0.25) -> StressSummary:
    """Follow a started stressor (here, or on a target: remote.stressor.start_on_target) to its end and return
    its summary; Ctrl-C/SIGTERM (KeyboardInterrupt) stops it and still summarises."""
    try:
        while running.running:
            if on_progress:
                on_progress(StressProgress(running.elapsed_s, running.duration_s))
            time.sleep(poll_interval)
        return running.wait()
    except KeyboardInterrupt:
        return running.stop()
    finally:
        if running.process.poll() is None:
            running.stop()
