"""The disturbance of one run (its stressors on the platform and its disturbing guests, switched on and off as the
timeline says) and the teardown steps a run must all try."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..environments import Environment
from ..errors import RtvirtError, RunError
from ..procs import Supervisor
from ..scenario.schema import StressorUse
from ..stressors import STRESSORS, RunningStressor

__all__ = ["MAX_REASON", "POLL_S", "Disturbance", "Teardown", "bounded"]

T = TypeVar("T")

POLL_S = 0.2
MAX_REASON = 500


class Disturbance:
    """The stressors of one run, switched on and off as the timeline says."""

    def __init__(self, uses: list[StressorUse], env: Environment, supervisor: Supervisor) -> None:
        self.uses, self.env, self.supervisor = uses, env, supervisor
        self._host: list[RunningStressor] = []
        self._vms: list[Environment] = []
        self.on = False
        self._vm_count = 0
        self._paused = False  # the disturbing guests are booted and paused, waiting for stress-on
        self.summaries: list[dict[str, Any]] = []  # what each host stressor did (bogo-ops, CPU time)

    def _cpus(self, where: str) -> tuple[int, ...]:
        allowed = self.env.platform_cpus()
        measured = self.env.measured_cpus()
        if where == "same-core":
            return measured[:1]
        if where == "other-core":
            others = tuple(c for c in allowed if c not in measured)
            if not others:
                raise RunError("other-core stress: every usable CPU carries the measured workload")
            return others
        return allowed

    def prepare(self) -> None:
        """Boot a timeline's disturbing guests before the workload starts, paused until stress-on: booted
        at stress-on, they would start the stress a boot time late (tens of seconds under TCG)."""
        for use in self.uses:
            if use.where == "other-vm" and not self._start_vms(use, pausable_only=True):
                self.close_guests()  # guests of a kind that cannot pause boot at stress-on
                return
        for vm in self._vms:
            vm.set_paused(True)
        self._paused = bool(self._vms)

    def start(self) -> None:
        if self.on:
            return
        self.on = True
        if self._paused:
            for vm in self._vms:
                vm.set_paused(False)
        for use in self.uses:
            if use.where == "other-vm":
                if not self._paused:
                    self._start_vms(use)
                continue
            if use.where == "inside" and not (self.env.on_host or self.env.inside_on_platform):
                # a guest runs it as a job of its own beside the workload (the host: on all its cores)
                self.env.add_guest_job("rtvirt-stress", _guest_stressor_args(use))
                continue
            cpus = self._cpus(use.where)
            params = {**use.params, "cpus": list(cpus), "workers": use.workers
                      if use.where not in ("all-cores", "inside")
                      else max(use.workers, len(cpus)), "duration": 0}
            self._host.append(self.env.start_stressor(use.stressor, params, use.engine))

    def _start_vms(self, use: StressorUse, pausable_only: bool = False) -> bool:
        """Boot ``use``'s disturbing guests (False: they cannot pause, and ``pausable_only`` asked so)."""
        others = tuple(c for c in sorted(os.sched_getaffinity(0)) if c not in self.env.measured_cpus())
        pinned = self.env.config.pin and bool(others)
        if use.guest_cpus is not None:  # the study says where the disturbing guest runs
            others, pinned = self.env.guest_placement(use.guest_cpus) or self._cpus(use.guest_cpus), True
        for _ in range(use.vms):
            self._vm_count += 1
            # a chosen kernel only for QEMU disturbing guests (the scenario schema checks the kinds)
            vm = self.env.stressor_guest(self._vm_count, others if pinned else None,
                                         **({"guest": use.guest} if use.guest else {}))
            if pausable_only and not vm.pausable:
                return False
            vm.launch("rtvirt-stress", _guest_stressor_args(use), None)
            self._vms.append(vm)
        # stress counts as on once the guests run their stressors, not while they boot
        while not all(vm.booted for vm in self._vms):
            problem = self.check()
            if problem:
                raise RunError(problem)
            time.sleep(POLL_S)
        return True

    def stop(self) -> None:
        if not self.on:
            return
        self.on = False
        for stressor in self._host:
            try:
                summary = stressor.stop()
            except RtvirtError as exc:  # a stressor that died is recorded, not fatal to the run's samples
                self.summaries.append({"stressor": stressor.spec.name, "error": bounded(str(exc))})
                continue
            self.summaries.append(summary.model_dump(mode="json", exclude={"per_worker"}))
        self._host = []
        self.close_guests()

    def close_guests(self) -> None:
        """Close every disturbing guest, also when closing one fails (then raises once all were tried)."""
        teardown = Teardown()
        for vm in self._vms:
            teardown.attempt(vm.close)
        self._vms, self._paused = [], False
        if teardown.problems:
            raise RunError("; ".join(teardown.problems))

    def check(self) -> str | None:
        for vm in self._vms:
            reason = vm.check()
            if reason:
                return f"disturbing guest {vm.config.label}: {reason}"
        return None


class Teardown:
    """Steps of a teardown that must all be tried: a failing one (an ``xl`` that hangs in a lab under load) is
    remembered and the next runs, so the samples get their manifest and no domain or process is skipped."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def attempt(self, step: Callable[[], T]) -> T | None:
        """``step()``, or None when it failed."""
        try:
            return step()
        except RtvirtError as exc:
            self.problems.append(str(exc))
            return None


def _guest_stressor_args(use: StressorUse) -> list[str]:
    """Arguments of the stressor agent run inside a guest (it runs until the guest stops)."""
    spec = STRESSORS[use.stressor]
    return spec.command(spec.params(**{**use.params, "workers": use.workers, "duration": 0}), "")[1:]


def bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "..."
