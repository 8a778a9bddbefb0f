"""``rtvirt host tune`` / ``restore``: meet a profile's runtime items through the ledger, and put them all back.

Every write goes through :class:`rtvirt.host.ledger.Ledger`, which records the value found first; a setting the
profile already meets is not touched (nothing to restore). A step that fails (not root, a knob this kernel lacks,
a per-CPU IRQ that cannot move) is reported and the rest go on. Where tuned is installed, its profile of the same
purpose is applied first (:mod:`rtvirt.host.tuned`) and rtvirt only completes what it left.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from ..errors import InputError
from .checks import HostContext, Item, run_checks, tune_steps
from .checks.power import PM_QOS
from .ledger import Ledger, read_raw
from .profiles import PROFILES, Profile
from .tuned import apply_tuned_profile

__all__ = ["TuneResult", "tune_host", "restore_host", "profile_named"]


@dataclass
class StepResult:
    item: str
    path: str
    value: str
    outcome: str  # applied | failed
    found: str | None = None
    error: str | None = None


@dataclass
class TuneResult:
    profile: str
    cpus: list[int]
    steps: list[StepResult] = field(default_factory=list)
    tuned: dict[str, Any] | None = None  # the tuned profile applied and the items it met
    owners: list[str] = field(default_factory=list)  # warnings: settings another tool owns
    after: list[Item] = field(default_factory=list)
    pm_qos: BinaryIO | None = None  # /dev/cpu_dma_latency held at 0 while open (closed by release())

    def release(self) -> None:
        """Let go of what is held open (the PM QoS limit); the ledger's settings are released by the caller."""
        if self.pm_qos is not None:
            self.pm_qos.close()
            self.pm_qos = None

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["pm_qos"] = "held at 0 us" if self.pm_qos is not None else "not held"
        document["after"] = [i.as_json() for i in self.after]
        return document


def profile_named(name: str, option: str = "--profile") -> Profile:
    if name not in PROFILES:
        raise InputError(f"option {option}: unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[name]


def tune_host(ctx: HostContext, profile: Profile, holder: str, ledger: Ledger | None = None,
              hold: bool = True) -> TuneResult:
    """Meet ``profile``'s runtime items for ``ctx.rt_cpus`` on this machine, on behalf of ``holder``.

    ``hold``: the caller lives as long as the tuning (a campaign), so the PM QoS limit, which lasts only while its
    file is open, is held too (released by ``TuneResult.release``)."""
    ledger = ledger or Ledger()
    result = TuneResult(profile.name, list(ctx.rt_cpus))
    if os.geteuid() != 0:  # every item says so, and nothing is written (nor a ledger made)
        result.steps = [StepResult(s.item, s.path, s.value, "failed", read_raw(s.path), "needs root")
                        for s in tune_steps(ctx, set(profile.items))]
        result.after = run_checks(ctx)
        return result
    before = {i.id: i for i in run_checks(ctx)}
    result.owners = sorted({f"{i.id}: {i.owner} owns this setting and may change it back" for i in before.values()
                            if i.owner and i.id in profile.items})
    # a setting another holder changed is joined even when it already reads as wanted: it must not go back
    # while this holder still wants it
    held = {entry["path"] for entry in ledger.held()}
    result.tuned = apply_tuned_profile(profile, ctx.rt_cpus, ledger, holder, tune_steps(ctx, set(profile.items)))
    if result.tuned and result.tuned.get("applied"):
        ctx.cache.clear()
        met = [i.id for i in run_checks(ctx) if i.status == "ok" and before[i.id].status != "ok"]
        result.tuned["covered"] = met
    for step in tune_steps(ctx, set(profile.items)):
        found = read_raw(step.path)
        current = None if found is None else (step.restore_as(found) if step.restore_as else found).strip()
        if current == step.value and step.path not in held:
            continue
        try:
            ledger.change(holder, step.path, step.value, step.restore_as)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if os.geteuid() != 0 and exc.errno in (1, 13):
                reason += " (needs root)"
            result.steps.append(StepResult(step.item, step.path, step.value, "failed", found, reason))
            continue
        result.steps.append(StepResult(step.item, step.path, step.value, "applied", found))
    if hold and "pm-qos" in profile.items:
        try:
            result.pm_qos = open(PM_QOS, "wb", buffering=0)  # noqa: SIM115 - held open for the tuning's life
            result.pm_qos.write((0).to_bytes(4, "little"))
        except OSError as exc:
            result.steps.append(StepResult("pm-qos", PM_QOS, "0", "failed", None, exc.strerror))
    ctx.cache.clear()
    result.after = run_checks(ctx)
    return result


def restore_host(holder: str, ledger: Ledger | None = None) -> list[dict[str, Any]]:
    """Put back every setting ``holder`` changed (and any a dead holder left); what was written back."""
    ledger = ledger or Ledger()
    changes = ledger.release(holder) + ledger.reclaim()
    return [asdict(c) for c in changes]
