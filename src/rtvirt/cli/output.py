"""How every command prints (docs/output.md): tables, errors, progress and JSON.

- stdout a terminal: tables fitted to the terminal's width, colour unless NO_COLOR is set.
- stdout not a terminal (a file, a pipe, a CI log): tables at their natural width, never squeezed into "…"
  cells, messages never wrapped, and no colour (FORCE_COLOR turns it back on): ``rtvirt.consoles``.
- progress bars go to stderr, and only when stderr is a terminal (``--progress`` forces them).
- ``--json`` prints one JSON document on stdout and nothing else there.
- every error is one line on stderr, ``rtvirt: option -D/--duration: ...`` (``print_error``; click's own usage
  errors are put in that form by ``usage_error_line``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..consoles import make_console

if TYPE_CHECKING:
    from ..stats import Summary

__all__ = ["console", "err_console", "summary_table", "print_json", "print_error", "usage_error_line",
           "progress_wanted", "progress_bar", "progress_console", "plural", "us"]

console = make_console()
err_console = make_console(stderr=True)


def progress_wanted(option: bool | None) -> bool:
    """``--progress/--no-progress`` as given, else: only when stderr (where the bar goes) is a terminal."""
    return sys.stderr.isatty() if option is None else option


def progress_bar(label: str, option: bool | None, *, status: bool = True) -> Progress | None:
    """The bar of a timed command (probe, stress) on stderr, or None when none is wanted: elapsed, then left, then
    the command's status line. ``--progress`` draws it on a stderr that is not a terminal too."""
    if not progress_wanted(option):
        return None
    columns = [TextColumn(f"[bold]{escape(label)}"), BarColumn(), TimeElapsedColumn(), TextColumn("elapsed,"),
               TimeRemainingColumn(), TextColumn("left")]
    if status:
        columns.append(TextColumn("{task.fields[status]}"))
    return Progress(*columns, console=progress_console(), transient=True)


def progress_console() -> Console:
    """Where a wanted bar is drawn: stderr, as a terminal even when it is not one (``--progress`` forced it)."""
    return err_console if sys.stderr.isatty() else make_console(stderr=True, force_terminal=True)


def print_error(message: str) -> None:
    """An error: one line on stderr, however long (exit status is the caller's); a message of several lines (a
    tool's stderr quoted in it) is joined with " | "."""
    line = " | ".join(part.strip() for part in message.splitlines() if part.strip())
    err_console.print(f"[bold red]rtvirt:[/] {escape(line)}", soft_wrap=True)


def usage_error_line(exc: click.ClickException) -> str:
    """Click's own errors (a bad option value, an unknown option, a missing argument, ...) as our one line,
    naming the option or argument: ``option -D/--duration: '3sec' is not a time; ...``."""
    if isinstance(exc, click.BadParameter) and exc.param is not None:
        names = "/".join(exc.param.opts) if isinstance(exc.param, click.Option) else exc.param.human_readable_name
        where = f"option {names}" if isinstance(exc.param, click.Option) else f"argument {names}"
        message = "missing" if isinstance(exc, click.MissingParameter) else exc.message.rstrip(".")
        return f"{where}: {message}{_help_hint(exc)}"
    if isinstance(exc, click.BadParameter) and exc.param_hint:
        hint = exc.param_hint if isinstance(exc.param_hint, str) else "/".join(exc.param_hint)
        return f"option {hint.strip(chr(39) + chr(34))}: {exc.message.rstrip('.')}"
    if isinstance(exc, click.NoSuchOption):
        maybe = f" (did you mean {' or '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
        return f"option {exc.option_name}: no such option{maybe}{_help_hint(exc)}"
    if isinstance(exc, click.BadOptionUsage):
        message = re.sub(rf"^option '?{re.escape(exc.option_name)}'? ", "", exc.message.rstrip("."), flags=re.I)
        return f"option {exc.option_name}: {_first_lower(message)}{_help_hint(exc)}"
    return f"{_first_lower(exc.format_message().rstrip('.'))}{_help_hint(exc)}"


def _help_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see '{ctx.command_path} --help')" if ctx is not None else ""


def _first_lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``1 run``, ``2 runs``: a count with its noun."""
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"


def us(ns: float) -> str:
    return "-" if math.isnan(ns) else f"{ns / 1000:.3f}"


def summary_table(title: str, summaries: dict[str, Summary], value_field: str = "latency_ns") -> Table:
    """Statistics in the values' unit (rtvirt.quantity): times in µs, counts (threadmetric's rounds) as counted."""
    from ..quantity import quantity_of

    quantity = quantity_of(value_field)
    table = Table(title=title, title_justify="left")
    table.add_column("group")
    for column in ("samples", "dropped", "min", "median", "mean", "p99", "p99.9", "p99.99", "max", "stdev", "jitter"):
        table.add_column(column if column in ("samples", "dropped") else f"{column} {quantity.shown_unit}",
                         justify="right")
    for group, s in summaries.items():
        table.add_row(group, str(s.samples), str(s.dropped), *(quantity.show(value) for value in (
            s.min_ns, s.median_ns, s.mean_ns, s.p99_ns, s.p999_ns, s.p9999_ns, s.max_ns, s.stdev_ns, s.max_jitter_ns)))
    return table


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(_clean(document), indent=2, default=str))
