"""What every environment provides: a place to run an agent, and the host CPUs that place occupies.

The interface carries local and remote platforms alike: ``launch`` returns a :class:`Launched` whose
process is anything with the :class:`AgentProcess` shape (a local ``Popen``, an agent on an SSH target,
an agent in a Xen domU); expensive things that several runs of one campaign can reuse (a Xen lab boot,
an SSH connection, the libvirt connection that reclaims) live in :class:`SharedResources`; "other-vm"
disturbance asks the environment itself for a disturbing guest of its own kind
(:meth:`Environment.stressor_guest`); and
:meth:`Environment.reclaim` removes what a killed earlier campaign left behind before ``--resume``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..params import CpuList
from ..procs import Supervisor

if TYPE_CHECKING:
    from ..explain.config import ExplainConfig
    from ..explain.model import TraceSource

__all__ = ["AgentProcess", "Environment", "EnvironmentConfig", "Launched", "SharedResources",
           "default_measured_cpu"]

ERROR_TAIL_BYTES = 4096
T = TypeVar("T")


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


@runtime_checkable
class AgentProcess(Protocol):
    """A running agent wherever it runs: ``poll`` like ``Popen.poll``, and why it failed."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def error_tail(self) -> str:
        """The end of the agent's error output (bounded, untrusted text)."""
        ...


class Launched:
    """A started agent: the process to wait for, where its stream goes, and, where the agent waits for the
    host's end-of-stream confirmation (a guest that powers off when its agent ends), how to give it:
    ``confirm(records)`` says how many data records the host holds and returns what happened."""

    def __init__(self, proc: subprocess.Popen[Any] | AgentProcess, out: Path | None,
                 confirm: Callable[[int], str] | None = None) -> None:
        self.proc = proc
        self.out = out
        self._confirm = confirm
        self.confirmation: str | None = None  # what came of the confirmation ("sent", why not), once given

    def confirm_end(self, records: int) -> None:
        """The host holds the stream's END and ``records`` data records: tell an agent that waits for it."""
        if self._confirm is not None and self.confirmation is None:
            self.confirmation = self._confirm(records)

    def follow(self, timeout: float, watch: Callable[[], str | None] | None = None) -> None:
        """Wait for the agent to end, confirming its END once it is in the stream file, and asking ``watch``
        (an environment's ``check``) whether the platform is still healthy: what a campaign does, for one-off
        launches."""
        from ..errors import RunError
        from ..stream import StreamReader

        assert self.out is not None
        reader, records = StreamReader(self.out), 0
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            records += int(reader.poll().size)
            if reader.ended:
                self.confirm_end(records)
            problem = watch() if watch is not None else None
            if problem:
                raise RunError(problem)
            if time.monotonic() > deadline:
                raise RunError(f"the agent did not end within {timeout:.0f}s")
            time.sleep(0.1)

    def poll(self) -> int | None:
        return self.proc.poll()

    def agent_pids(self) -> tuple[int, ...]:
        """The agent's pid where it runs (this host, an SSH target), for an explanation to tell its threads
        from what ran instead; () where it is not known (an agent in a guest)."""
        if isinstance(self.proc, subprocess.Popen):
            return (self.proc.pid,)
        pid = getattr(self.proc, "pid", None)  # a target's agent: announced by its wrapper
        found = pid(timeout=0) if callable(pid) else None
        return (found,) if isinstance(found, int) else ()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def error_tail(self) -> str:
        """The agent's last words on stderr, once it has exited (bounded)."""
        if isinstance(self.proc, subprocess.Popen):
            if self.proc.stderr is None or self.proc.poll() is None:
                return ""
            return self.proc.stderr.read(ERROR_TAIL_BYTES).decode(errors="replace").strip()[-300:]
        return self.proc.error_tail()[-300:]


def _close(obj: object) -> None:
    closer = getattr(obj, "close", None)
    if callable(closer):
        with contextlib.suppress(Exception):  # closing everything matters more than one error
            closer()


class SharedResources:
    """Expensive things several runs of one campaign reuse, closed together at its end.

    ``get(key, factory)`` returns the object made for ``key``, making it on first use (and anew once
    ``usable`` rejects it: a lab that stopped); objects with a ``close()`` method are closed in reverse order
    of creation. Long-lived processes (a Xen lab's QEMU) are started through ``supervisor``, which outlives
    single runs and dies with rtvirt.
    """

    def __init__(self) -> None:
        self.supervisor = Supervisor()
        self._objects: dict[str, Any] = {}
        self._lock = threading.RLock()  # a factory may get() what it needs (a target audit: its link)

    def get(self, key: str, factory: Callable[[], T], usable: Callable[[T], bool] | None = None) -> T:
        with self._lock:
            if key in self._objects and usable is not None and not usable(self._objects[key]):
                _close(self._objects.pop(key))
            if key not in self._objects:
                self._objects[key] = factory()
            return self._objects[key]  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            objects = list(reversed(self._objects.values()))
            self._objects.clear()
        for obj in objects:
            _close(obj)
        self.supervisor.stop_all()

    def __enter__(self) -> SharedResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Environment(ABC):
    """One platform under test. ``start`` prepares it, ``launch`` runs an agent in it, ``close`` undoes all."""

    kind: ClassVar[str]
    config_model: ClassVar[type[EnvironmentConfig]]
    on_host: ClassVar[bool] = True  # the agent sees the host's CPUs (False: a guest's)
    pausable: ClassVar[bool] = False  # set_paused works (a timeline's stressor guests then boot early)
    # the part of scripts/setup.sh that installs what this kind needs beyond the main job's (None: nothing)
    setup_part: ClassVar[str | None] = None
    # "inside" stressors run as stressors on platform_cpus (an SSH target: the measured machine itself),
    # not as a guest's own job (add_guest_job); the host does so anyway
    inside_on_platform: ClassVar[bool] = False

    def __init__(self, config: EnvironmentConfig, supervisor: Supervisor, workdir: Path,
                 shared: SharedResources | None = None) -> None:
        self.config = config
        self.supervisor = supervisor
        self.workdir = workdir
        # without a campaign's shared resources, this environment owns (and closes) its own
        self._owns_shared = shared is None
        self.shared = shared if shared is not None else SharedResources()

    @staticmethod
    def available() -> str | None:
        """None when this environment can run here, else the reason it cannot."""
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        """Remove what a killed earlier campaign left (domains, cpupools, remote agents); say what went.

        Called once per environment at the start of every campaign (fresh or ``--resume``d); leftovers
        are recognised by rtvirt's own name prefix, never by guessing.
        """
        return []

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

    def platform_lost(self, failure: str) -> str | None:
        """Asked once a run failed (``failure``: why): why the machine rtvirt booted to host it (a lab) stopped
        under it, or None when it did not or there is none. Such a run measured the lab's end, not the platform
        under test: its campaign runs it once more on a fresh boot."""
        return None

    def after_launch(self, launched: Launched) -> None:  # noqa: B027 - an optional hook
        """Hook run while the agent runs (e.g. to place its threads once they exist)."""

    def platform_cpus(self) -> tuple[int, ...]:
        """CPUs where same-core/other-core/all-cores stressors may run: this host's (a target: its own)."""
        return tuple(sorted(os.sched_getaffinity(0)))

    def start_stressor(self, stressor: str, params: dict[str, Any], engine: str) -> Any:
        """Start a same-core/other-core/all-cores stressor beside the workload; returns a running
        stressor (``stop()`` gives its summary). By default on this host; a target starts it on itself."""
        from ..stressors import start_stressor

        return start_stressor(stressor, params, self.supervisor, engine=engine)  # type: ignore[arg-type]

    def add_guest_job(self, agent: str, args: list[str]) -> None:
        """Run ``agent`` inside the measured guest beside the workload, from its start ("inside" stressors)."""
        from ..errors import InputError

        raise InputError(f"environment {self.config.label!r} ({self.kind}): stressors with where = 'inside' "
                         "need a guest that runs them beside the workload (kind qemu)")

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the running guest (timeline stressor guests wait paused); only if ``pausable``."""
        from ..errors import RunError

        raise RunError(f"{self.kind}: guests of this kind cannot be paused")

    def guest_placement(self, where: str) -> tuple[int, ...] | None:
        """The CPUs a disturbing guest placed ``where`` ('same-core', 'other-core') runs on, where this kind
        numbers them itself (Xen: its pCPUs); None: the host's CPUs beside ``measured_cpus``."""
        return None

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        """A disturbing guest for "other-vm" stressors, placed on ``host_cpus`` (None: unpinned), running
        ``guest`` (linux, or the bare-metal kernel's stressor programs).

        Each kind that offers them says which: host, partition and qemu a QEMU guest beside the measured
        platform (qemu.qemu_stressor_guest); hypervisor kinds a guest of the same hypervisor (another domU,
        another libvirt domain, another target).
        """
        from ..errors import InputError

        raise InputError(f"environment {self.config.label!r} ({self.kind}): 'other-vm' stressors need a kind that "
                         "makes disturbing guests")

    def platform_audit(self) -> dict[str, Any]:
        """The audit of the platform the workload runs on when it is not this host (a Xen host's ``xl info``,
        an SSH target's kernel and tuning); the manifest's system audit carries it as ``platform``."""
        return {}

    @property
    def booted(self) -> bool:
        """Whether the agent's platform is up (a guest has booted); environments without a boot: True."""
        return True

    def describe(self) -> dict[str, Any]:
        """The environment as recorded in the manifest."""
        return self.config.model_dump(mode="json")

    def stream_copy(self) -> Path | None:
        """The platform's own copy of the stream (a guest's disk), read after the agent ended: the run is
        recovered from it when it holds more than the live stream; None where no copy is kept."""
        return None

    def delivery(self) -> dict[str, Any]:
        """How the stream left the platform and what its end-of-stream handshake said (the channel, the
        guest's own count and word); read after the agent ended, recorded in the manifest."""
        return {}

    def warnings(self) -> list[str]:
        return []

    def trace_sources(self, config: ExplainConfig) -> list[TraceSource]:
        """What can be traced beside a run here to explain its outliers (docs/explain.md); none by default:
        the explanation then says this environment could not be seen."""
        return []

    def close(self) -> None:
        """Stop what ``start``/``launch`` created; safe to call twice. Subclasses call ``super().close()``."""
        if self._owns_shared:
            self.shared.close()
