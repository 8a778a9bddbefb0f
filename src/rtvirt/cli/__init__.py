"""The ``rtvirt`` command: a thin skin over the library. Each subcommand lives in its own module, registered in
COMMANDS and imported only when it runs (``rtvirt --help``, ``--version`` and shell completion of command names
import nothing heavy); errors map to exit codes (2 bad input, 1 failure, 3 verdict failed, 4 host items failed,
130 interrupted), each error one line on stderr."""

from __future__ import annotations

import faulthandler
import sys
from importlib import import_module
from typing import Any, NamedTuple, NoReturn

import click

from .. import __version__
from ..errors import EXIT_INTERRUPTED, EXIT_USAGE, RtvirtError, stop_on_signals

__all__ = ["main", "app", "COMMANDS", "CommandEntry"]


class CommandEntry(NamedTuple):
    module: str  # cli module defining the command
    attribute: str  # the click command in it
    summary: str  # the line `rtvirt --help` and shell completion show without importing the module


COMMANDS = {
    "probe": CommandEntry("probe", "probe", "Run one measurement probe; every sample is kept in the results store."),
    "stats": CommandEntry("stats", "stats", "Exact statistics (quartiles, whiskers, percentiles to p99.99, 95 % CIs) "
                          "of runs or sample files."),
    "report": CommandEntry("report", "report", "Write the report of every run in RESULTS: verdicts, statistics, "
                           "plots, isolation, outliers, settings."),
    "compare": CommandEntry("compare", "compare", "Isolation table of RUN against BASELINE (or its configuration's "
                            "last run); exit 3 on a tail regression."),
    "explain": CommandEntry("explain", "explain", "What held the measuring thread back in each outlier of RUN, "
                            "layer by layer, and the share of outlier latency by cause."),
    "trend": CommandEntry("trend", "trend", "A metric of one configuration over time per machine, changes marked."),
    "push": CommandEntry("push", "push", "Deliver the runs spooled while a shared store was away."),
    "serve": CommandEntry("serve", "serve", "Serve the live view of running campaigns: a page that updates as they "
                          "run, and /metrics for Prometheus."),
    "sql": CommandEntry("sql", "sql", "Run STATEMENT against the catalog of a results directory."),
    "import": CommandEntry("importer", "import_command", "Import FILES of FORMAT as runs."),
    "stress": CommandEntry("stress", "stress", "Load the machine in a known way (our own stressors, or stress-ng)."),
    "run": CommandEntry("run", "run", "Run a campaign: a built-in scenario NAME or a scenario FILE.toml."),
    "scenarios": CommandEntry("scenarios", "scenarios", "List the built-in scenarios."),
    "sim": CommandEntry("sim", "sim", "Simulate MODEL.toml; every job, event and gap is kept in the results store."),
    "analyze": CommandEntry("analyze", "analyze", "Worst-case response-time bounds for MODEL.toml."),
    "design": CommandEntry("design", "design", "Smallest budget per vCPU that keeps every guest task of MODEL.toml "
                           "schedulable, per hypervisor scheduler."),
    "experiment": CommandEntry("experiment", "experiment", "Run an experiment: design points x questions over "
                               "random systems, locally or on a Dask cluster."),
    "lab": CommandEntry("lab", "lab", "Run one probe on every SSH target of an inventory at once; one report."),
    "host": CommandEntry("host", "host", "Check, tune and restore this host for real-time work (RT checklist)."),
}


class _LazyGroup(click.Group):
    """Subcommands come from COMMANDS and are imported when invoked (or asked for their own help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        return getattr(import_module(f".{entry.module}", __name__), entry.attribute)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:  # `rtvirt --bogus`: before any subcommand
            _exit_with(exc)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, entry.summary) for name, entry in COMMANDS.items()])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list:
        from click.shell_completion import CompletionItem

        names = [CompletionItem(name, help=entry.summary) for name, entry in COMMANDS.items()
                 if name.startswith(incomplete)]
        return names + click.Command.shell_complete(self, ctx, incomplete)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except RtvirtError as exc:
            from .output import print_error

            print_error(str(exc))
            ctx.exit(exc.exit_code)
        except click.ClickException as exc:  # a subcommand's options or arguments, as click parsed them
            _exit_with(exc)
        except KeyboardInterrupt:  # a command without its own handling: the same status as those with it
            from .output import print_error

            print_error("interrupted (Ctrl-C or SIGTERM)")
            ctx.exit(EXIT_INTERRUPTED)


def _exit_with(exc: click.ClickException) -> NoReturn:
    """Every error is one line, ``rtvirt: option ...: ...`` (docs/output.md): click's usage text too."""
    from .output import print_error, usage_error_line

    print_error(usage_error_line(exc))
    raise click.exceptions.Exit(exc.exit_code)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="rtvirt")
def app() -> None:
    """rtvirt: measure, explain and predict real-time behaviour of virtualised platforms."""


def main() -> None:
    stop_on_signals()
    # a crash in a C library we call (libvirt's client crashed in its stream code, 3 times in a day of lab
    # campaigns) prints every thread's Python stack: where it was is then known, not only that it died
    faulthandler.enable()
    try:
        app.main(prog_name="rtvirt", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - an interrupt between the command's end and the exit
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(EXIT_USAGE)
