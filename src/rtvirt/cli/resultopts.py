"""Option types shared by the results commands (stats, report, compare, sql, import)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from ..errors import RtvirtError
from .output import err_console

if TYPE_CHECKING:
    from ..stores import Delivery, RunStore

__all__ = ["DURATION", "DURATION_US", "results_option", "reading_store", "writing_store", "store_for_writing",
           "report_delivery"]


class _Duration(click.ParamType):
    """A duration in ns; bare numbers in ``unit``."""

    name = "DURATION"

    def __init__(self, unit: str = "s") -> None:
        self.unit = unit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from ..units import parse_duration  # pydantic: only when a duration is given (fast `rtvirt stats`)

        try:
            return parse_duration(value, self.unit)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Duration()
DURATION_US = _Duration("us")  # bare numbers in microseconds


def results_option(help_text: str, *names: str) -> Any:
    """``--results`` (or ``names``): a results directory or a shared store's URL; RTVIRT_RESULTS sets it."""
    return click.option(*(names or ("--results",)), "results", envvar="RTVIRT_RESULTS", default="results",
                        show_default=True, metavar="DIR|URL",
                        help=f"{help_text} (a directory, or a shared store's postgresql:// URL; env RTVIRT_RESULTS)")


def reading_store(spec: str) -> RunStore:
    from ..stores import open_store

    return open_store(spec)


@contextlib.contextmanager
def writing_store(spec: str) -> Iterator[RunStore]:
    """The store new runs go to. A shared store is checked first (a bad URL or refused credentials stop here,
    exit 2); runs are written into its spool and delivered when the command ends, however it ends. A store
    that cannot be reached leaves them spooled for `rtvirt push`."""
    from ..stores import open_store
    from ..stores.postgres import StoreUnavailable

    store = open_store(spec)
    if store.shared:
        try:
            store.check()  # type: ignore[attr-defined]
        except StoreUnavailable as exc:
            err_console.print(f"[yellow]warning:[/] {escape(str(exc))}; measuring into the spool "
                              f"{escape(str(store.write_dir))}")
    try:
        yield store
    finally:
        if store.shared:
            try:
                report_delivery(store, store.deliver())
            except RtvirtError as exc:  # the measurement stands; what could not be delivered stays spooled
                err_console.print(f"[yellow]warning:[/] {escape(str(exc))}; the runs stay in the spool "
                                  f"{escape(str(store.write_dir))}")


def report_delivery(store: RunStore, delivery: Delivery) -> None:
    if delivery.delivered or delivery.already:
        err_console.print(f"delivered {len(delivery.delivered)} run(s) to {escape(store.label)}"
                          + (f" ({len(delivery.already)} were there already)" if delivery.already else ""))
    if delivery.kept:
        err_console.print(f"[yellow]warning:[/] {escape(delivery.error or 'store unavailable')}: "
                          f"{len(delivery.kept)} run(s) stay in the spool {escape(str(store.write_dir))}; "
                          f"`rtvirt push --results URL` delivers them")


def store_for_writing(spec: str) -> RunStore:
    """:func:`writing_store` for the rest of the running command (delivered when the command ends)."""
    return click.get_current_context().with_resource(writing_store(spec))
