"""A stressor on an SSH target, with the interface of a local :class:`rtvirt.stressors.RunningStressor`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError, RunError
from ..procs import owned_temp_dir
from ..stressors.base import StressorSpec, StressParams, StressSummary
from ..stressors.registry import stressor_spec
from ..stressors.runner import resolve_params
from ..stressors.running import StressorClock, native_summary
from .agents import TargetLink
from .probe import DEFAULT_REMOTE_DIR
from .target import SshTarget

__all__ = ["RemoteStressor", "start_on_target", "start_over_link", "stop_left_running"]

# + <pid>-<start time>-<random>: the stressor's output as it arrives, removed by the next one if we were killed
WORKDIR_PREFIX = "rtvirt-remote-stress-"


class RemoteStressor(StressorClock):
    """rtvirt-stress running on a target; ``stop()`` ends it (end of its stdin) and returns its summary.

    Its stdout (the "started" line, then the summary) is copied into a local temporary file as it arrives.
    With ``owns_link`` the connection is closed when the stressor ends (the CLI's case).
    """

    engine = "native"

    def __init__(self, link: TargetLink, spec: StressorSpec, params: StressParams, *, owns_link: bool = False,
                 start_timeout: float = 30.0) -> None:
        self.link, self.spec, self.params, self._owns_link = link, spec, params, owns_link
        self._workdir = owned_temp_dir(WORKDIR_PREFIX)
        self._out = Path(self._workdir.name) / "stdout"
        self._summary: StressSummary | None = None
        self.problems: list[str] = []
        try:
            self.agent = link.start("rtvirt-stress", spec.command(params, "")[1:], self._out)
            self.argv = [self.agent.remote_path, *spec.command(params, "")[1:]]
            self._await_start(start_timeout)
        except BaseException:
            self._close()
            raise
        self.started = time.monotonic()

    @property
    def process(self) -> RemoteStressor:
        return self  # follow_stressor polls ``process``

    def poll(self) -> int | None:
        return self.agent.poll()

    def _await_start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not (self._out.exists() and b"\n" in self._out.read_bytes()[:4096]):
            if self.agent.poll() is not None:
                self._finish()  # raises the agent's own message
                raise RunError(f"rtvirt-stress {self.spec.name} ended at start-up on {self.link.target.label}")
            if time.monotonic() > deadline:
                self.stop()
                raise RunError(f"rtvirt-stress {self.spec.name} did not start on {self.link.target.label} "
                               f"within {timeout:.0f} s")
            time.sleep(0.01)

    @property
    def running(self) -> bool:
        return self._summary is None and self.agent.poll() is None

    def wait(self, timeout: float | None = None) -> StressSummary:
        limit = None if timeout is None else time.monotonic() + timeout
        while self.agent.poll() is None:
            if limit is not None and time.monotonic() >= limit:
                raise TimeoutError(f"stressor {self.spec.name} still running after {timeout} s")
            time.sleep(0.05)
        return self._finish()

    def stop(self, grace: float = 5.0) -> StressSummary:
        if self._summary is not None:
            return self._summary
        self.agent.stop(grace)
        return self._finish()

    def _finish(self) -> StressSummary:
        if self._summary is not None:
            return self._summary
        try:
            status = self.agent.poll()
            stdout = self._out.read_bytes() if self._out.exists() else b""
            if self.agent.lost and b'"end"' not in stdout:
                raise RunError(f"rtvirt-stress {self.spec.name}: {self.agent.error_tail()[-300:]}")
            self._summary = native_summary(status, stdout, self.agent.error_tail(), self.argv)
            return self._summary
        finally:
            self.problems += self.agent.cleanup()
            self._close()

    def _close(self) -> None:
        self._workdir.cleanup()
        if self._owns_link:
            self.link.close()

    def __enter__(self) -> RemoteStressor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_over_link(link: TargetLink, stressor: str, params: Mapping[str, Any], engine: str,
                    where: str) -> RemoteStressor:
    """Start ``stressor`` beside a run on the machine ``link`` reaches (``where`` names it in errors): rtvirt's own
    agent, copied there, over the run's connection."""
    if engine != "native":
        raise InputError(f"stressor {stressor}: engine {engine!r} cannot run on {where} "
                         "(only rtvirt's own agents are copied there); use engine = \"native\"")
    spec = stressor_spec(stressor)
    return RemoteStressor(link, spec, resolve_params(spec, params))


def stop_left_running(stressors: list[RemoteStressor]) -> None:
    """Stop those of an environment's ``stressors`` still running at its close (normally the run stopped them)
    and forget them all."""
    for stressor in stressors:
        if stressor.running:
            stressor.stop()
    stressors.clear()


def start_on_target(stressor: str | StressorSpec, params: StressParams | Mapping[str, Any] | None, engine: str,
                    target: SshTarget) -> RemoteStressor:
    """Start ``stressor`` on an SSH target (our native agent only) over a connection of its own."""
    if engine != "native":
        raise InputError(f"option --engine {engine}: only rtvirt's own agent is copied to a target; "
                         "use --engine native with --target")
    spec = stressor_spec(stressor)
    return RemoteStressor(TargetLink(target, DEFAULT_REMOTE_DIR), spec, resolve_params(spec, params), owns_link=True)
