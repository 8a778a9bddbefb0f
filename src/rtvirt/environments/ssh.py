"""ssh: the workload on any Linux reachable over SSH (a hypervisor's guest, a Jailhouse cell, a board).

rtvirt stays on the workstation; the target runs only our static agents, copied for its architecture.
The probe streams its samples over the SSH channel into the run's stream file as they are taken, and
keeps a copy on the target (``--tee``): if the connection drops or the target reboots, the run keeps
every sample received, and the copy is fetched after reconnecting to complete it. Agents run with
``--watch-stdin``, so they stop with their session; after each run rtvirt checks that they are gone.
Stressors beside the workload (same-core, other-core, all-cores, inside) run on the target; "other-vm"
disturbance runs on the ``disturbers``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..errors import RunError
from ..params import CpuList
from ..remote.connection import STDERR_HEAD_BYTES
from ..remote.target import RemoteDir, SshTargetFields
from ..sysaudit import audit_system
from .base import Environment, EnvironmentConfig, Launched, SharedResources

if TYPE_CHECKING:
    from ..explain.config import ExplainConfig
    from ..explain.model import TraceSource
    from ..remote.agents import RemoteAgent, TargetLink

__all__ = ["SshConfig", "SshEnvironment", "Disturber"]


class Disturber(SshTargetFields):
    """Another target that carries "other-vm" stressors while the measured target runs the probe."""

    cpus: CpuList | None = Field(None, description="target CPUs for the stressor (default: all)")


class SshConfig(EnvironmentConfig, SshTargetFields):
    kind: Literal["ssh"] = "ssh"
    cpus: CpuList | None = Field(None, description="target CPUs the measured workload runs on "
                                                   "(default: the target's last online CPU)")
    remote_dir: RemoteDir = Field("/var/tmp/rtvirt",
                            description="directory on the target for our agents and stream copies "
                                        "(/var/tmp survives a reboot on most systems, /tmp often does not)")
    reconnect_timeout: float = Field(60.0, gt=0, le=3600,
                                     description="seconds to keep trying to reconnect after a dropped connection")
    disturbers: list[Disturber] = Field([], max_length=64,
                                        description="targets for 'other-vm' stressors, used in turn")



def _link(shared: SharedResources, fields: SshTargetFields, remote_dir: str) -> TargetLink:
    """The campaign's one connection to this target (made on first use)."""
    from ..remote.agents import TargetLink  # the stream code (numpy): only once a target is reached

    target = fields.ssh_target()
    return shared.get(f"ssh:{target.model_dump_json()}:{remote_dir}", lambda: TargetLink(target, remote_dir))


class SshEnvironment(Environment):
    kind = "ssh"
    config_model = SshConfig
    on_host = False  # the agent sees the target's CPUs
    inside_on_platform = True  # "inside" the measured target: stressors on all its CPUs, beside the workload
    config: SshConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agent: RemoteAgent | None = None
        self._stressors: list[Any] = []
        self._problems: list[str] = []
        self._target_cpus: tuple[int, ...] | None = None
        self._while_probing = contextlib.ExitStack()  # what the measured probe's launch set up, until close

    @staticmethod
    def available() -> str | None:
        try:
            import asyncssh  # noqa: F401
        except ImportError:
            return "asyncssh is not installed (pip install asyncssh)"
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        assert isinstance(config, SshConfig)
        removed = _link(shared, config, config.remote_dir).reclaim()
        for disturber in config.disturbers:
            removed += _link(shared, disturber, config.remote_dir).reclaim()
        return removed

    @property
    def link(self) -> TargetLink:
        return _link(self.shared, self.config, self.config.remote_dir)

    def _audit(self) -> dict[str, Any]:
        """The target's system audit, once per campaign (it is the same machine for every run)."""
        from ..remote.system import RemoteSystem

        def audit() -> dict[str, Any]:
            connection = self.link.connection()
            return {"arch": connection.arch(), **audit_system(RemoteSystem(connection))}

        return self.shared.get(f"ssh-audit:{self.link.target.label}", audit)

    def platform_cpus(self) -> tuple[int, ...]:
        if self._target_cpus is None:
            from ..remote.system import RemoteSystem

            self._target_cpus = tuple(RemoteSystem(self.link.connection()).cpus())
        return self._target_cpus

    def measured_cpus(self) -> tuple[int, ...]:
        if not self.config.pin:
            return self.platform_cpus()
        return tuple(self.config.cpus) if self.config.cpus else self.platform_cpus()[-1:]

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": self.measured_cpus() if self.config.pin else None}

    def start(self) -> None:
        self._audit()

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """The target's own tracefs on its measured CPUs, through the campaign's connection."""
        from ..explain.remote import RemoteTracefs
        from ..explain.sources import host_sources

        return host_sources(self.measured_cpus(), config, RemoteTracefs(self.link.connection(),
                                                                        self.link.target.label))

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        if agent == "rtvirt-probe" and (kept := self._while_probing.enter_context(
                self.link.controller_off(self.measured_cpus()))):
            self._problems.append(kept)
        tee = f"{self.config.label}-{time.time_ns()}.rtvs" if out is not None and agent == "rtvirt-probe" else None
        self._agent = self.link.start(agent, args, out, tee)
        return Launched(self._agent, out)

    def delivery(self) -> dict[str, Any]:
        agent = self._agent
        return {"channel": "ssh channel", "handshake": "the agent's exit status comes after every byte of its "
                "stdout (SSH channel order); a lost connection is completed from the target's copy (--tee)",
                **({"recovered": agent.recovered} if agent is not None and agent.recovered else {})}

    @property
    def booted(self) -> bool:
        """A disturber counts as started once its agent runs (its wrapper announced the pid just before
        exec): the target's login shell may take a while, and stress-on is marked only after this."""
        agent = self._agent
        return (agent is None or agent.pid(timeout=0) is not None or agent.poll() is not None
                or len(agent.process.stderr_head) >= STDERR_HEAD_BYTES)  # a shell too chatty to find the pid

    def check(self) -> str | None:
        agent = self._agent
        if agent is None:
            return None
        if not agent.lost:
            if agent.stream_to is None and agent.poll() is not None:  # a disturber's stressor runs until stopped
                return (f"rtvirt-stress on {self.link.target.label} ended early ({agent.poll()}): "
                        f"{agent.error_tail()[-300:] or 'no message'}")
            return None
        found = agent.recover(self.config.reconnect_timeout)
        return f"the connection to {self.link.target.label} was lost; samples received kept; {found}"

    def start_stressor(self, stressor: str, params: dict[str, Any], engine: str) -> Any:
        from ..remote.stressor import start_over_link

        running = start_over_link(self.link, stressor, params, engine, "an ssh target")
        self._stressors.append(running)
        return running

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        if not self.config.disturbers:
            raise RunError(f"ssh environment {self.config.label}: 'other-vm' stress needs disturbers "
                           "(other targets to run the stressors on)")
        disturber = self.config.disturbers[(index - 1) % len(self.config.disturbers)]
        fields = {name: getattr(disturber, name) for name in SshTargetFields.model_fields}
        config = SshConfig.model_validate({**fields, "kind": "ssh", "name": f"{self.config.label}-disturber-{index}",
                                           "cpus": disturber.cpus, "pin": disturber.cpus is not None,
                                           "remote_dir": self.config.remote_dir,
                                           "reconnect_timeout": self.config.reconnect_timeout})
        return SshEnvironment(config, self.supervisor, self.workdir / f"disturber-{index}", self.shared)

    def platform_audit(self) -> dict[str, Any]:
        try:
            return {"kind": "ssh", "target": self._audit()}
        except RunError as exc:
            return {"kind": "ssh", "target": {"error": str(exc)[:300]}}

    def warnings(self) -> list[str]:
        try:
            audit = self._audit()
        except RunError:
            return self._problems
        label = self.link.target.label
        return [w if label in w else f"target {label}: {w}" for w in audit.get("warnings", [])] + self._problems

    def close(self) -> None:
        for stressor in self._stressors:  # normally stopped by the run already
            if stressor.running:
                try:
                    stressor.stop()
                except Exception as exc:  # noqa: BLE001 - a failed stressor must not keep the others running
                    self._problems.append(f"stressor on {self.link.target.label}: {str(exc)[:200]}")
            self._problems += stressor.problems
        self._stressors.clear()
        agent, self._agent = self._agent, None
        if agent is not None:
            if agent.lost:
                agent.recover(self.config.reconnect_timeout)
            else:
                agent.stop()
            self._problems += agent.cleanup()
        self._while_probing.close()
        super().close()
