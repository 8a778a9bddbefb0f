"""The campaign's host tuning (``[host] tune``): applied before the first run, put back after the last whatever
happens; and the checklist state recorded beside every run (the manifest's ``system.checklist``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..environments.base import default_measured_cpu
from ..errors import InputError
from ..scenario.schema import Scenario

__all__ = ["tuned_host"]


def _rt_cpus(scenario: Scenario) -> tuple[int, ...]:
    if scenario.host.cpus:
        return tuple(scenario.host.cpus)
    usable = os.sched_getaffinity(0)
    cpus = {c for env in scenario.environments if env.pin and env.kind in ("host", "partition", "qemu")
            for c in (env.cpus or (default_measured_cpu(),)) if c in usable}
    return tuple(sorted(cpus)) or (default_measured_cpu(),)


@contextlib.contextmanager
def tuned_host(scenario: Scenario, console: Console) -> Iterator[dict[str, Any]]:
    """Tune for the campaign (when ``[host] tune`` says so); yields the checklist summary of the host as tuned."""
    from ..host import Ledger, check_host, checklist_summary, host_context, process_holder, profile_named, tune_host

    ledger = Ledger()
    # what a killed campaign left changed (only root can have changed anything: others have nothing to put back)
    for change in (ledger.reclaim() if os.geteuid() == 0 else []):
        console.print(f"restored {escape(change.path)} = {escape(change.value.strip()[:80])}"
                      + (f" (failed: {escape(change.error)})" if change.error else " (gone)" if change.gone else ""),
                      highlight=False)
    holder = process_holder("campaign")
    try:
        ctx = host_context(_rt_cpus(scenario), option="host.cpus")
    except InputError:
        if scenario.host.tune is not None:
            raise
        ctx = host_context()  # the environments' CPUs are not all here: the checklist of the default CPU
    try:
        if scenario.host.tune is None:
            yield checklist_summary(check_host(ctx))
            return
        result = tune_host(ctx, profile_named(scenario.host.tune, "host.tune"), holder, ledger)
        for step in result.steps:
            if step.outcome == "failed":
                console.print(f"[yellow]warning:[/] host tune: {escape(step.path)}: {escape(step.error or '')}",
                              highlight=False)
        for warning in result.owners:
            console.print(f"[yellow]warning:[/] host tune: {escape(warning)}", highlight=False)
        try:
            yield {**checklist_summary(result.after, scenario.host.tune),
                   "changed": [s.path for s in result.steps if s.outcome == "applied"]}
        finally:
            result.release()
    finally:
        if os.geteuid() == 0:
            ledger.release(holder)
