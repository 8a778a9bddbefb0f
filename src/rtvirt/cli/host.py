"""``rtvirt host check | tune | restore``: the RT host checklist, and tuning for real-time work that is put back
exactly (docs/host.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from ..errors import EXIT_PARTIAL, EXIT_VERDICT, InputError
from ..params import parse_cpulist
from .output import console, print_json
from .targetopts import pop_target, target_options

if TYPE_CHECKING:
    from ..host.tune import TuneResult

__all__ = ["host"]


def _cpus(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return parse_cpulist(value)
    except ValueError as exc:
        raise InputError(f"option --cpus: {exc}") from None


def _status(status: str) -> str:
    return {"ok": "[green]ok[/]", "not-ready": "[red]not ready[/]"}.get(status, "[yellow]unknown[/]")


@click.group()
def host() -> None:
    """Check, tune and restore this host (or a target) for real-time work."""


@host.command()
@click.option("--cpus", metavar="LIST", help="the real-time CPUs [default: the isolated ones, else the last CPU]")
@click.option("--require", "required", multiple=True, metavar="CLASS",
              help="a requirement class (classes.toml): exit 3 when an item it needs is not met; repeatable")
@click.option("--classes", "classes_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="requirement classes file [default: the built-in classes.toml]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
@target_options
def check(cpus: str | None, required: tuple[str, ...], classes_file: Path | None, as_json: bool,
          **target_values: Any) -> None:
    """Every item of the RT host checklist: what is found, why it matters, the exact fix."""
    from ..host import check_host, host_context, needed_by
    from ..host.checks.kernel import boot_line, how_to_boot_with
    from ..results.verdicts import load_classes

    classes = {c.name: c for c in load_classes(classes_file)}
    unknown = [name for name in required if name not in classes]
    if unknown:
        raise InputError(f"option --require: unknown class {unknown[0]!r} (known: {', '.join(classes)})")
    target = pop_target(target_values)
    if target is None:
        ctx = host_context(_cpus(cpus))
        items = check_host(ctx)
    else:
        from ..remote.agents import TargetLink
        from ..remote.system import RemoteSystem

        link = TargetLink(target, "/")
        try:
            ctx = host_context(_cpus(cpus), RemoteSystem(link.connection()))
            items = check_host(ctx)
        finally:
            link.close()
    missing = {name: [i.id for i in needed_by(items, classes[name])] for name in required}
    if as_json:
        print_json({"system": ctx.view.label, "rt_cpus": list(ctx.rt_cpus), "items": [i.as_json() for i in items],
                    "boot_line": boot_line(ctx), "required": missing})
    else:
        console.print(f"[bold]RT host checklist of {escape(ctx.view.label)}[/], real-time CPU(s) "
                      f"{','.join(map(str, ctx.rt_cpus))}")
        for item in items:
            console.print(f"{_status(item.status)} [bold]{escape(item.id)}[/] ({escape(item.kind)}): "
                          f"{escape(item.title)}\n    found: {escape(item.found)}\n    why: {escape(item.why)}"
                          + ("" if item.status == "ok" else f"\n    fix: {escape(item.fix)}"), soft_wrap=True)
        if any(i.kind == "boot" and i.status == "not-ready" for i in items):
            console.print(f"\n[bold]boot:[/] {escape(how_to_boot_with(boot_line(ctx)))}", soft_wrap=True)
        for name, ids in missing.items():
            console.print(f"{escape(name)}: " + (f"[red]needs {escape(', '.join(ids))}[/]" if ids else "[green]every "
                                                 "item it needs is met[/]"))
    if any(missing.values()):
        raise SystemExit(EXIT_VERDICT)


@host.command()
@click.option("--profile", required=True, metavar="NAME", help="realtime-host, realtime-virtual-host or "
              "realtime-virtual-guest")
@click.option("--cpus", metavar="LIST", help="the real-time CPUs [default: the isolated ones, else the last CPU]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
def tune(profile: str, cpus: str | None, as_json: bool) -> None:
    """Apply PROFILE's runtime items, recording every previous value (undo: rtvirt host restore).

    Boot items are never changed: `rtvirt host check` prints the command line to add. Exit status 4 when an item
    could not be applied (each failure is listed; the others were applied)."""
    from ..host import CLI_HOLDER, host_context, profile_named, tune_host

    chosen = profile_named(profile)
    # the PM QoS limit lasts while a process holds it: not this command's (a campaign's [host] tune holds it)
    result = tune_host(host_context(_cpus(cpus)), chosen, CLI_HOLDER, hold=False)
    failed = [s for s in result.steps if s.outcome == "failed"]
    tuned_failed = bool(result.tuned and result.tuned["failed"])
    if as_json:
        print_json(result.as_json())
    else:
        _print_tuning(result)
        if failed or tuned_failed:
            console.print(f"[red]{len(failed)} setting(s) not applied[/]" + (
                " and tuned's profile not applied" if tuned_failed else "") + ": exit status 4")
    if failed or tuned_failed:
        raise SystemExit(EXIT_PARTIAL)


def _print_tuning(result: TuneResult) -> None:
    if result.tuned:
        console.print(f"tuned profile {escape(result.tuned['profile'])}: " + (
            f"applied, covered {escape(', '.join(result.tuned.get('covered') or []) or 'nothing checked')}"
            if result.tuned["applied"] else f"not used ({escape(str(result.tuned.get('reason')))})"))
    for warning in result.owners:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    for step in result.steps:
        mark = "[green]applied[/]" if step.outcome == "applied" else f"[red]failed[/] ({escape(step.error or '')})"
        console.print(f"{escape(step.item)}: {escape(step.path)} = {escape(step.value)} {mark}")
    if not result.steps:
        console.print("nothing to change: the profile's items were already met")
    left = [i.id for i in result.after if i.status == "not-ready"]
    console.print(f"still not ready: {escape(', '.join(left))}" if left else "every item is ready")


@host.command()
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
def restore(as_json: bool) -> None:
    """Put back every setting `rtvirt host tune` changed (and any a killed campaign left changed).

    Exit status 4 when a setting could not be written back (it stays in the ledger; the others were restored)."""
    from ..host import CLI_HOLDER, restore_host

    changes = restore_host(CLI_HOLDER)
    failed = [change for change in changes if change["error"]]
    if as_json:
        print_json({"restored": changes})
    else:
        _print_restored(changes, failed)
    if failed:
        raise SystemExit(EXIT_PARTIAL)


def _print_restored(changes: list[dict[str, Any]], failed: list[dict[str, Any]]) -> None:
    for change in changes:
        outcome = (f" [red]failed[/] ({escape(change['error'])})" if change["error"]
                   else " (gone: nothing to put back)" if change["gone"] else "")
        console.print(f"{escape(change['path'])} = {escape(change['value'].strip())}{outcome}")
    if not changes:
        console.print("nothing to restore")
    if failed:
        console.print(f"[red]{len(failed)} setting(s) not put back[/] (kept in the ledger for the next restore): "
                      "exit status 4")
