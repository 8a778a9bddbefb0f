"""host: the bare-metal baseline. The agent runs directly on the host, pinned to the measured CPUs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..agents import agent_path
from .base import Environment, EnvironmentConfig, Launched
from .qemu import qemu_stressor_guest

if TYPE_CHECKING:
    from ..explain.config import ExplainConfig
    from ..explain.model import TraceSource

__all__ = ["HostConfig", "HostEnvironment"]


class HostConfig(EnvironmentConfig):
    kind: Literal["host"] = "host"


class HostEnvironment(Environment):
    kind = "host"
    config_model = HostConfig

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        argv = [str(agent_path(agent)), *args]
        if out is not None:
            argv.append(f"--out={out}")
        proc = self.supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return Launched(proc, out)

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        return qemu_stressor_guest(self, index, host_cpus, guest)

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        from ..explain.sources import host_sources

        return host_sources(self.measured_cpus(), config)
