"""Random task-set generators, one module per family, registered in one table each:

- ``UTILISATION_GENERATORS``: name -> draw(rng, tasks, total) giving per-task utilisations summing to total
  (fixed-count families use ``tasks``; SchedCAT's named distributions draw until the total is reached);
- ``PERIOD_GENERATORS``: name -> draw(rng, n) giving n periods in integer milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .automotive import automotive_periods
from .base import GeneratorError
from .randfixedsum import randfixedsum
from .schedcat import PERIODS, UTILISATIONS, draw_until
from .uunifast import uunifast_discard

__all__ = ["UTILISATION_GENERATORS", "PERIOD_GENERATORS", "GeneratorError", "UtilisationDraw"]

UtilisationDraw = Callable[[np.random.Generator, int, float], np.ndarray]


def _named(name: str) -> UtilisationDraw:
    return lambda rng, tasks, total: draw_until(rng, UTILISATIONS[name], total)


UTILISATION_GENERATORS: dict[str, UtilisationDraw] = {
    "uunifast-discard": lambda rng, tasks, total: uunifast_discard(rng, tasks, total),
    "randfixedsum": lambda rng, tasks, total: randfixedsum(rng, tasks, total),
    **{name: _named(name) for name in UTILISATIONS},
}
PERIOD_GENERATORS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    **PERIODS, "automotive": automotive_periods}
