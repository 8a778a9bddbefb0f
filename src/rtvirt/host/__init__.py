"""Preparing a host for real-time work as RT engineers do: check every item of the checklist, tune the runtime ones
for a while, and put everything back exactly (docs/host.md).

The face of the package: :func:`host_context` (the host and its real-time CPUs), :func:`check_host`,
:func:`needed_by` (which items a requirement class needs), :func:`tune_host` / :func:`restore_host` and the
settings :class:`Ledger` that makes restoring exact, also after a kill -9.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from ..errors import InputError
from ..sysaudit import LocalSystem, SystemView, audit_system
from .checks import FAMILIES, HostContext, Item, run_checks
from .ledger import CLI_HOLDER, Ledger, process_holder
from .profiles import PROFILES, Profile
from .tune import TuneResult, profile_named, restore_host, tune_host

__all__ = ["host_context", "check_host", "needed_by", "checklist_summary", "tune_host", "restore_host",
           "profile_named", "Ledger", "PROFILES", "Profile", "FAMILIES", "HostContext", "Item", "TuneResult",
           "CLI_HOLDER", "process_holder"]


def host_context(cpus: tuple[int, ...] | None = None, view: SystemView | None = None,
                 option: str = "--cpus") -> HostContext:
    """The host seen through ``view`` (default: this one) with ``cpus`` as its real-time CPUs (default: the
    isolated ones, else the last CPU, where rtvirt measures by default)."""
    view = view or LocalSystem()
    audit = audit_system(view)
    available = tuple(view.cpus())
    if cpus:
        unknown = [c for c in cpus if c not in available]
        if unknown:
            raise InputError(f"option {option}: CPU(s) {', '.join(map(str, unknown))} not available here "
                             f"(available: {', '.join(map(str, available))})")
        if set(cpus) == set(available) and len(available) > 1:
            raise InputError(f"option {option}: every CPU would be a real-time one; leave at least one for "
                             "housekeeping")
    else:
        isolated = [c for c in _isolated(audit) if c in available]
        cpus = tuple(isolated) or (max(available),)
    return HostContext(view, audit, tuple(cpus), available)


def _isolated(audit: dict[str, Any]) -> tuple[int, ...]:
    from .checks.base import parse_list

    return parse_list(audit.get("isolcpus") if (audit.get("isolcpus") or "")[:1].isdigit() else None) or ()


def check_host(ctx: HostContext) -> list[Item]:
    return run_checks(ctx)


class JitterBudget(Protocol):
    """What :func:`needed_by` reads of a requirement class (results.verdicts.RequirementClass, a layer above)."""

    @property
    def jitter_ns(self) -> tuple[int, int]: ...


def needed_by(items: list[Item], requirement: JitterBudget) -> list[Item]:
    """The items ``requirement`` needs (its tight jitter budget is below what the item matters for) not met."""
    return [i for i in items if i.status == "not-ready" and requirement.jitter_ns[0] < i.matters_below_ns]


def checklist_summary(items: list[Item], tuned: str | None = None) -> dict[str, Any]:
    """The checklist as recorded beside each run: counts, and the ids of items not met."""
    return {"tuned": tuned, "ok": sum(i.status == "ok" for i in items),
            "not_ready": [i.id for i in items if i.status == "not-ready"],
            "unknown": [i.id for i in items if i.status == "unknown"], "pid": os.getpid()}
