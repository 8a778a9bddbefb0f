"""SchedCAT's named distributions (Brandenburg's SchedCAT, ``schedcat.generator.tasksets``), as its users know
them: per-task utilisations uni-/exp-/bimo- light, medium, heavy and periods uni-/log-uni- short, moderate,
long (integer milliseconds). Tasks are drawn until the total utilisation is reached and the last one is cut
to fit (SchedCAT's ``squeeze``), so the task count follows from the distribution."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .base import GeneratorError

__all__ = ["UTILISATIONS", "PERIODS", "draw_until"]

_MAX_TASKS = 10_000

Draw = Callable[[np.random.Generator], float]


def _uniform(low: float, high: float) -> Draw:
    return lambda rng: float(rng.uniform(low, high))


def _exponential(mean: float) -> Draw:
    def draw(rng: np.random.Generator) -> float:
        while True:  # truncated to (0, 1] by redrawing, as SchedCAT does
            value = float(rng.exponential(mean))
            if 0 < value <= 1:
                return value
    return draw


def _bimodal(light_weight: int, heavy_weight: int) -> Draw:
    light, heavy = _uniform(0.001, 0.5), _uniform(0.5, 0.9)
    share = light_weight / (light_weight + heavy_weight)
    return lambda rng: light(rng) if rng.random() < share else heavy(rng)


UTILISATIONS: dict[str, Draw] = {
    "uni-light": _uniform(0.001, 0.1), "uni-medium": _uniform(0.1, 0.4), "uni-heavy": _uniform(0.5, 0.9),
    "exp-light": _exponential(0.10), "exp-medium": _exponential(0.25), "exp-heavy": _exponential(0.50),
    "bimo-light": _bimodal(8, 1), "bimo-medium": _bimodal(6, 3), "bimo-heavy": _bimodal(4, 5),
}


def _uniform_ms(low: int, high: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: rng.integers(low, high + 1, size=n)


def _log_uniform_ms(low: int, high: int) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: np.floor(np.exp(rng.uniform(np.log(low), np.log(high + 1), size=n))).astype(np.int64)


PERIODS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "uni-short": _uniform_ms(3, 33), "uni-moderate": _uniform_ms(10, 100), "uni-long": _uniform_ms(50, 250),
    "log-uni-short": _log_uniform_ms(3, 33), "log-uni-moderate": _log_uniform_ms(10, 100),
    "log-uni-long": _log_uniform_ms(50, 250),
}


def draw_until(rng: np.random.Generator, draw: Draw, total: float) -> np.ndarray:
    """Utilisations from ``draw`` until they reach ``total``; the last is cut so they sum to it exactly."""
    values: list[float] = []
    left = total
    while left > 1e-12:
        if len(values) >= _MAX_TASKS:
            raise GeneratorError(f"utilisation {total}: more than {_MAX_TASKS} tasks drawn")
        value = min(draw(rng), left)
        values.append(value)
        left -= value
    return np.array(values)
