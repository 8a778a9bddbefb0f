"""The ``rtvirt`` command: a thin skin over the library. Each subcommand lives in its own module,
registered in COMMANDS; errors map to exit codes (2 bad input, 1 failure, 3 verdict failed)."""

from __future__ import annotations

import signal
import sys
from importlib import import_module
from types import FrameType

import click
from rich.console import Console
from rich.markup import escape

from ..errors import EXIT_USAGE, RtvirtError

__all__ = ["main", "app"]

# module name -> command attribute
COMMANDS = {
    "probe": "probe",
    "stats": "stats",
    "report": "report",
    "compare": "compare",
    "sql": "sql",
    "importer": "import_command",
    "stress": "stress",
    "run": "run",
    "scenarios": "scenarios",
    "sim": "sim",
    "analyze": "analyze",
    "design": "design",
}

err_console = Console(stderr=True, highlight=False)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except RtvirtError as exc:
            err_console.print(f"[bold red]rtvirt:[/] {escape(str(exc))}", soft_wrap=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["--help"], "max_content_width": 110})
@click.version_option(package_name="rtvirt")
def app() -> None:
    """rtvirt: measure, explain and predict real-time behaviour of virtualised platforms."""


for module_name, attribute in COMMANDS.items():
    app.add_command(getattr(import_module(f".{module_name}", __name__), attribute))


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        app.main(prog_name="rtvirt", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - click turns it into Abort already
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(EXIT_USAGE)
