"""The RT host checklist: one module per family of items, registered here (a new family = one entry).

Each family module has ``check(ctx) -> list[Item]`` (what is found, why it matters, the fix) and
``steps(ctx, wanted) -> list[Step]`` (the runtime changes that meet the wanted items; boot items have none).
"""

from __future__ import annotations

from types import ModuleType

from . import cpu, hypervisor, irq, kernel, kthreads, memory, numa, power, scheduler
from .base import HostContext, Item, Step

__all__ = ["FAMILIES", "HostContext", "Item", "Step", "run_checks", "tune_steps"]

FAMILIES: dict[str, ModuleType] = {module.FAMILY: module for module in (
    kernel, irq, kthreads, scheduler, power, memory, numa, cpu, hypervisor)}


def run_checks(ctx: HostContext) -> list[Item]:
    return [item for family in FAMILIES.values() for item in family.check(ctx)]


def tune_steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return [step for family in FAMILIES.values() for step in family.steps(ctx, wanted)]
