"""Option types shared by the results commands (stats, report, compare, sql, import)."""

from __future__ import annotations

from typing import Any

import click

__all__ = ["DURATION"]


class _Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from ..units import parse_duration  # pydantic: only when a duration is given (fast `rtvirt stats`)

        try:
            return parse_duration(value, "s")
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Duration()
