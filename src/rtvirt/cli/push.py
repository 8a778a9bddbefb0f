"""``rtvirt push``: deliver the runs a shared store's spool holds (measured while the store was away)."""

from __future__ import annotations

import click
from rich.markup import escape

from ..errors import InputError, RunError
from .output import err_console, print_json
from .resultopts import reading_store, report_delivery, results_option

__all__ = ["push"]


@click.command()
@results_option("the shared store to deliver to")
@click.option("--json", "as_json", is_flag=True, help="print what was delivered as JSON")
def push(results: str, as_json: bool) -> None:
    """Deliver every finished run of the spool of the shared store --results names; safe to repeat (a run
    already there is not added again). Exits 1 when the store cannot be reached (the runs stay spooled)."""
    from ..stores.postgres import StoreUnavailable

    store = reading_store(results)
    if not store.shared:
        raise InputError(f"option --results: {results} is a results directory; push delivers to a shared store")
    try:  # unreachable is exit 1 whether or not the spool holds anything (a CI step retries on it)
        store.check()  # type: ignore[attr-defined]
    except StoreUnavailable as exc:
        raise RunError(f"{exc}; the spool {store.write_dir} keeps its runs for the next push") from None
    delivery = store.deliver()
    if as_json:
        print_json(delivery.as_dict())
    elif delivery.delivered or delivery.already or delivery.kept:
        report_delivery(store, delivery)
    else:
        err_console.print(f"nothing to deliver: the spool {escape(str(store.write_dir))} holds no finished run")
    if delivery.kept:
        raise RunError(f"{len(delivery.kept)} run(s) stay in the spool {store.write_dir}")
