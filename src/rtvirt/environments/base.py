"""What every environment provides: a place to run an agent, and the host CPUs that place occupies."""

from __future__ import annotations

import os
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ..params import CpuList
from ..procs import Supervisor

__all__ = ["Environment", "EnvironmentConfig", "Launched", "default_measured_cpu"]


def default_measured_cpu() -> int:
    """The last usable CPU: CPU 0 usually carries more housekeeping interrupts."""
    return max(os.sched_getaffinity(0))


class EnvironmentConfig(BaseModel):
    """Fields every environment has; each environment module subclasses it with a ``kind`` literal."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    name: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$",
                      description="label in results (default: the kind)")
    cpus: CpuList | None = Field(None, description="host CPUs the measured workload runs on (default: the last CPU)")
    pin: bool = Field(True, description="pin the workload to cpus; false lets the host scheduler place it")

    @property
    def label(self) -> str:
        return self.name or self.kind


class Launched:
    """A started agent: the process to wait for, and where its stream goes."""

    def __init__(self, proc: subprocess.Popen[Any], out: Path | None) -> None:
        self.proc = proc
        self.out = out


class Environment(ABC):
    """One platform under test. ``start`` prepares it, ``launch`` runs an agent in it, ``close`` undoes all."""

    kind: ClassVar[str]
    config_model: ClassVar[type[EnvironmentConfig]]
    on_host: ClassVar[bool] = True  # the agent sees the host's CPUs (False: a guest's)

    def __init__(self, config: EnvironmentConfig, supervisor: Supervisor, workdir: Path) -> None:
        self.config = config
        self.supervisor = supervisor
        self.workdir = workdir

    @staticmethod
    def available() -> str | None:
        """None when this environment can run here, else the reason it cannot."""
        return None

    def measured_cpus(self) -> tuple[int, ...]:
        """Host CPUs carrying the measured workload: 'same core' disturbance goes here."""
        if not self.config.pin:
            return tuple(sorted(os.sched_getaffinity(0)))
        return tuple(self.config.cpus) if self.config.cpus else (default_measured_cpu(),)

    def probe_overrides(self) -> dict[str, Any]:
        """Probe parameters this environment decides (where the threads run, their priority)."""
        return {"affinity": self.measured_cpus() if self.config.pin else None}

    def start(self) -> None:  # noqa: B027 - an optional hook
        """Prepare the environment (cgroups etc.) before the first launch."""

    @abstractmethod
    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        """Run ``agent`` (a name from rtvirt.agents.AGENTS) with ``args``; its stream goes to ``out``."""

    def check(self) -> str | None:
        """Watchdog hook: None while healthy, else why the run must be abandoned."""
        return None

    def after_launch(self, launched: Launched) -> None:  # noqa: B027 - an optional hook
        """Hook run while the agent runs (e.g. to place its threads once they exist)."""

    def describe(self) -> dict[str, Any]:
        """The environment as recorded in the manifest."""
        return self.config.model_dump(mode="json")

    def warnings(self) -> list[str]:
        return []

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Stop what ``start``/``launch`` created; safe to call twice."""
