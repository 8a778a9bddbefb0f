"""What every generator shares: its error (bad parameters for the family, reported as input errors)."""

from __future__ import annotations

from ...errors import InputError

__all__ = ["GeneratorError"]


class GeneratorError(InputError):
    """The generator cannot draw a system with these parameters (e.g. utilisation above the task count)."""
