"""UUniFast-discard (Bini & Buttazzo, "Measuring the performance of schedulability tests", RTS 2005; the
discard variant of Davis & Burns 2009 for totals above 1): n utilisations uniform on the simplex summing to
``total``; a draw with any value above ``cap`` is thrown away and drawn again."""

from __future__ import annotations

import numpy as np

from .base import GeneratorError

__all__ = ["uunifast_discard"]

_MAX_DRAWS = 10_000


def uunifast_discard(rng: np.random.Generator, n: int, total: float, cap: float = 1.0) -> np.ndarray:
    if total > n * cap:
        raise GeneratorError(f"uunifast-discard: {n} tasks of at most {cap} cannot sum to {total}")
    for _ in range(_MAX_DRAWS):
        # sum_k = total * r_1^(1/(n-1)) * ... : the remaining sum shrinks by a Beta(n-i, 1) factor each step
        exponents = 1.0 / np.arange(n - 1, 0, -1)
        factors = rng.random(n - 1) ** exponents
        sums = total * np.concatenate(([1.0], np.cumprod(factors)))
        values = sums - np.concatenate((sums[1:], [0.0]))
        if values.max() <= cap:
            return values
    raise GeneratorError(f"uunifast-discard: no draw of {n} tasks summing to {total} kept every task at or "
                         f"below {cap} in {_MAX_DRAWS} tries (use randfixedsum)")
