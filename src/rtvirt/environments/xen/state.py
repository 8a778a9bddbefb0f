"""One domU's state and where its vCPUs go: the base the xen environment's parts (pools, console,
teardown, domain) build on, each in its own module."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Self

from ...errors import RunError
from ..base import AgentProcess, Environment
from ..guest_image import GuestImage, GuestJob
from .config import XenConfig
from .dom0 import Dom0
from .relays import SampleRelay


class XenDomainState(Environment):
    """A domU of a xen environment: its dom0, its cpupool, its process and its console."""

    config: XenConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dom0: Dom0 | None = None
        self._index = 0
        self._pool: str | None = None  # the cpupool this environment made (and removes)
        self._pool_cpus: tuple[int, ...] = ()
        self._domain: str | None = None
        self._process: AgentProcess | None = None
        self._relay: SampleRelay | None = None
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._clock_failure: str | None = None  # tcg_clock's verdict on the domU's ready line
        self._console_checked = 0.0
        self._console = ""
        self._readback: dict[str, Any] = {}
        self._parent: Self | None = None  # set on disturbing domUs: they share its pool
        self._placed: tuple[int, ...] | None = None  # a disturbing domU's pCPUs as its disturbance placed it
        self._disturbers: list[dict[str, Any]] = []  # the measuring domU's: its disturbing domUs' read-back
        self._pool_id: int | None = None
        self._beside: list[GuestJob] = []  # "inside" stressors: background jobs beside the workload
        self._image: GuestImage | None = None  # the measuring domU's guest image (linux, linux-rt)
        self._a653_domains: dict[str, list[tuple[str, int]]] = {}  # ARINC 653 pool owner: domain -> (UUID, vCPU)
        self._domids: dict[int, str] = {}  # the measuring domU's (and its disturbers'): domid -> name
        self._measuring_domid: int | None = None
        self._stream_out: Path | None = None  # the measuring domU's stream file (the Xen trace aligns with it)
        self._guest_trace_files: dict[str, bytes] | None = None  # an explained Linux domU traces itself

    def measured_cpus(self) -> tuple[int, ...]:
        # host CPUs: the lab's QEMU (or dom0's host) is not pinned; the domU's own pCPUs are in describe()
        return tuple(sorted(os.sched_getaffinity(0)))

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def _pcpus(self) -> tuple[int, ...]:
        """pCPUs of the measuring domU: cpus, else the last pCPU (dom0 keeps the first ones)."""
        if self.config.cpus:
            return tuple(self.config.cpus)
        assert self._dom0 is not None
        match = re.search(r"^nr_cpus\s*:\s*(\d+)", self._dom0.info(), re.M)
        return (int(match.group(1)) - 1,) if match else (0,)

    def _vcpu_affinity(self) -> list[str] | None:
        if self._parent is not None:
            return self._stressor_affinity()
        if self.config.affinity is not None:
            return [",".join(map(str, cpus)) for cpus in self.config.affinity]
        if not self.config.pin:
            return None
        cpus = self._pcpus()
        return [str(cpus[i % len(cpus)]) for i in range(self.config.vcpus)]

    def _stressor_affinity(self) -> list[str] | None:
        assert self._parent is not None
        if not self.config.pin:
            return None
        cpus = self.config.stressor_cpus or self._placed or self._parent._pcpus()
        return [",".join(map(str, cpus))]

    def guest_placement(self, where: str) -> tuple[int, ...] | None:
        """A disturbing domU 'same-core' shares the measuring domU's pCPUs, 'other-core' takes the others
        (dom0's, in a lab of two pCPUs): Xen's pCPUs, not the host's."""
        self.start()
        assert self._dom0 is not None
        mine = self._pcpus()
        if where == "same-core":
            return mine
        match = re.search(r"^nr_cpus\s*:\s*(\d+)", self._dom0.info(), re.M)
        others = tuple(cpu for cpu in range(int(match.group(1)) if match else 0) if cpu not in mine)
        if not others:
            raise RunError(f"{self.config.label}: other-core: every pCPU of this Xen carries the measuring domU")
        return others

    def _domain_type(self) -> str:
        """PV, PVH or HVM: our bare-metal kernel boots as PVH only; a disturbing domU beside it is a Linux domU of
        the configured mode."""
        return "pvh" if self.config.guest == "baremetal" and self._parent is None else self.config.mode

    def _flavour(self) -> str:
        """The guest kernel of this domU: the scenario's for the measuring one, Debian's for disturbing ones."""
        return self.config.guest if self._parent is None else "linux"
