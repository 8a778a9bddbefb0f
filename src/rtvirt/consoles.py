"""The one way rtvirt makes a rich console (docs/output.md), for the CLI and for the library parts that print
while they work (a campaign's progress and run lines): whatever the stream is, a run id or a path is never
split over lines.

- a terminal: rich's own width (the terminal's), colour unless NO_COLOR is set;
- not a terminal (a file, a pipe, a CI log): no width limit, so tables keep their natural width and messages
  stay on one line, and no colour (FORCE_COLOR turns it back on).

Table titles are printed whole on both: rich wraps a title to its table's width, which split the run id in
``rtvirt stats RUN`` and a path in ``rtvirt stats FILE --column`` over lines.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported where a console is made, not when this module is
    from rich.console import Console, ConsoleRenderable

__all__ = ["make_console"]

# wide enough for any table or message we print; rich pads nothing to the console width, so lines stay as they are
UNSQUEEZED = 10_000


def make_console(stderr: bool = False, *, force_terminal: bool = False) -> Console:
    """A console on stdout (or stderr) following docs/output.md. ``force_terminal``: draw live displays (progress
    bars) although the stream is not a terminal (``--progress``); lines still unwrapped there."""
    from rich.console import Console, RenderHook

    class WholeTitles(RenderHook):
        def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
            _unwrap_titles(renderables)
            return renderables

    stream = sys.stderr if stderr else sys.stdout
    made = Console(stderr=stderr, highlight=False, force_terminal=True if force_terminal else None,
                   width=None if stream.isatty() else UNSQUEEZED)
    made.push_render_hook(WholeTitles())
    return made


def _unwrap_titles(renderables: Sequence[object]) -> None:
    """Tables' titles and captions on one line each, however narrow the table."""
    from rich.table import Table
    from rich.text import Text

    for renderable in renderables:
        if not isinstance(renderable, Table):
            continue
        for attribute, style in (("title", "table.title"), ("caption", "table.caption")):
            value = getattr(renderable, attribute)
            if isinstance(value, str):
                value = Text.from_markup(value, style=style)
            if isinstance(value, Text):
                value.no_wrap, value.overflow = True, "ignore"
                setattr(renderable, attribute, value)
