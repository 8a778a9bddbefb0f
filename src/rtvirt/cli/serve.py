"""``rtvirt serve RESULTS|URL``: the live view of the campaigns in a results directory or a shared store (a page
that updates as they run, and /metrics for Prometheus), read-only; and what ``rtvirt run --serve`` starts."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from ..errors import InputError
from .output import err_console, print_json
from .resultopts import DURATION, DURATION_US

if TYPE_CHECKING:
    from ..live.server import LiveSource

__all__ = ["serve", "serving_options", "serving_beside"]

DEFAULT_LISTEN = "127.0.0.1:8340"
READY_WAIT_S = 30.0


def serving_options(command: Any) -> Any:
    """--listen and --token-file, shared by `rtvirt serve` and `rtvirt run --serve`."""
    command = click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
                           help="file holding the token every request must carry (or the environment variable "
                                "RTVIRT_SERVE_TOKEN); needed to listen beyond loopback")(command)
    return click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST[:PORT]",
                        help="address to serve on (port 0: any free one); another than loopback needs a token")(command)


def _source(results: str, threshold_ns: int, classes_file: Path | None) -> LiveSource:
    from ..live.local import LocalSource
    from ..results.verdicts import load_classes
    from ..stores import is_store_url

    classes = load_classes(classes_file)
    machine = socket.gethostname()
    if not is_store_url(results):
        path = Path(results)
        if path.exists() and not path.is_dir():
            raise InputError(f"{results}: not a results directory")
        return LocalSource(path, machine, threshold_ns, classes)
    from ..live.shared import StoreSource
    from ..stores.postgres import SharedStore, StoreUnavailable

    store = SharedStore(results, read_only=True)
    try:
        store.check()
    except StoreUnavailable as exc:
        raise InputError(str(exc)) from None
    return StoreSource(store, machine, threshold_ns, classes)


@click.command()
@click.argument("results", envvar="RTVIRT_RESULTS", default="results", metavar="RESULTS|URL")
@serving_options
@click.option("--for", "duration_ns", type=DURATION, default=None,
              help="stop after this long (bare numbers in s) [default: until Ctrl-C]")
@click.option("--threshold", "threshold_ns", type=DURATION_US, default="100us", show_default=True,
              help="outliers are counted above this (bare numbers in us)")
@click.option("--classes", "classes_file", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file of requirement classes for the verdicts [default: the built-in classes]")
@click.option("--json", "as_json", is_flag=True, help="once listening, print the page's and /metrics' addresses as "
              "one JSON document on stdout (for scripts: with --listen HOST:0, the port chosen)")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), hidden=True,
              help="write the page's address here once listening (rtvirt run --serve waits for it)")
def serve(results: str, listen: str, token_file: Path | None, duration_ns: int | None, threshold_ns: int,
          classes_file: Path | None, as_json: bool, ready_file: Path | None) -> None:
    """Serve the live view of RESULTS (a results directory, or a shared store's URL; env RTVIRT_RESULTS): each
    campaign's progress, the running run's latency as its samples arrive, each finished run's statistics,
    verdicts and explanation, every machine's campaigns of a shared store side by side, and /metrics for
    Prometheus. Read-only; local unless --listen says otherwise (docs/live.md)."""
    from ..live.access import access
    from ..live.server import serve as run_server

    address, token = access(listen, token_file)
    source = _source(results, threshold_ns, classes_file)

    def announce(url: str) -> None:
        err_console.print(f"serving {escape(url)} ({escape(source.label)}, read-only): the page, and {escape(url)}"
                          f"metrics for Prometheus; {'stops after the --for time' if duration_ns else 'Ctrl-C stops'}",
                          highlight=False, soft_wrap=True)
        if as_json:
            print_json({"url": url, "metrics": f"{url}metrics", "source": source.label})
            sys.stdout.flush()
        if ready_file is not None:
            from ..fileio import write_atomically

            write_atomically(ready_file, url)

    try:
        run_server(source, address, token, duration_s=None if duration_ns is None else duration_ns / 1e9,
                   announce=announce)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the usual way to stop a server
        err_console.print("stopped")


@contextlib.contextmanager
def serving_beside(results: str, listen: str, token_file: Path | None,
                   measured_cpus: set[int] | frozenset[int] = frozenset()) -> Iterator[str]:
    """`rtvirt serve` as a child of `rtvirt run --serve`: started before the campaign (it waits until the page
    listens, so a bad address stops the command before anything is measured), at nice 10 and off the CPUs the
    campaign measures on (where another CPU is left), and stopped with the command (and by the kernel should the
    command die). The store's URL reaches it through RTVIRT_RESULTS, never its command line. Yields the page's
    address."""
    elsewhere = set(os.sched_getaffinity(0)) - set(measured_cpus)

    def keep_off_the_measurement() -> None:
        os.nice(10)
        if elsewhere:
            os.sched_setaffinity(0, elsewhere)

    from ..errors import RunError
    from ..procs import Supervisor

    with tempfile.TemporaryDirectory(prefix="rtvirt-serve-") as scratch, Supervisor() as supervisor:
        ready = Path(scratch) / "ready"
        argv = [sys.executable, "-m", "rtvirt", "serve", "--listen", listen, "--ready-file", str(ready)]
        if token_file is not None:
            argv += ["--token-file", str(token_file)]
        child = supervisor.start(argv, stdout=None, stderr=None, env={**os.environ, "RTVIRT_RESULTS": results},
                                 before_exec=keep_off_the_measurement)
        deadline = time.monotonic() + READY_WAIT_S
        while not ready.exists():
            if child.poll() is not None:
                raise InputError(f"option --serve: the live view did not start (exit status {child.returncode})")
            if time.monotonic() > deadline:
                raise RunError(f"option --serve: the live view did not listen within {READY_WAIT_S:.0f} s")
            time.sleep(0.05)
        yield ready.read_text()
