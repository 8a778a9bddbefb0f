"""Randfixedsum (Stafford's algorithm as described by Emberson, Stafford & Davis, "Techniques for the synthesis
of multiprocessor tasksets", WATERS 2010): n values in [low, high] summing exactly to ``total``, uniform over
that polytope. Unlike UUniFast-discard it never throws draws away, so totals near n·high stay cheap.

The polytope is cut into simplices; ``_tables`` gives, per dimension and per unit-cube slice, the volume
(``w``) and the probability of stepping into the lower slice (``t``); a draw walks down the dimensions
choosing a slice and a point in the simplex, then shuffles the coordinates."""

from __future__ import annotations

import numpy as np

from .base import GeneratorError

__all__ = ["randfixedsum"]

_TINY = np.finfo(float).tiny


def _tables(n: int, s: float, k: int) -> np.ndarray:
    s1 = s - np.arange(k, k - n, -1, dtype=float)  # distance of s above each slice's lower corner
    s2 = np.arange(k + n, k, -1, dtype=float) - s  # and below its upper corner
    w = np.zeros((n, n + 1))
    w[0, 1] = np.finfo(float).max  # scaled volumes: only ratios matter, start huge to keep precision
    t = np.zeros((n - 1, n))
    for i in range(2, n + 1):
        up = w[i - 2, 1:i + 1] * s1[:i] / i
        down = w[i - 2, :i] * s2[n - i:] / i
        w[i - 1, 1:i + 1] = up + down
        total = w[i - 1, 1:i + 1] + _TINY
        lower_wins = s2[n - i:] > s1[:i]
        t[i - 2, :i] = np.where(lower_wins, down / total, 1 - up / total)
    return t


def randfixedsum(rng: np.random.Generator, n: int, total: float, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    if not low <= total / n <= high:
        raise GeneratorError(f"randfixedsum: {n} values in [{low}, {high}] cannot sum to {total}")
    if n == 1:
        return np.array([float(total)])
    s = (total - n * low) / (high - low)  # the problem in the unit cube
    k = int(max(min(np.floor(s), n - 1), 0))
    s = max(min(s, k + 1), k)
    t = _tables(n, s, k)
    x = np.zeros(n)
    steps = rng.random(n - 1)
    shrink = rng.random(n - 1)
    remaining, slice_index, partial, scale = s, k, 0.0, 1.0
    for i in range(n - 1, 0, -1):
        lower = steps[n - 1 - i] <= t[i - 1, slice_index]
        sx = shrink[n - 1 - i] ** (1.0 / i)
        partial += (1 - sx) * scale * remaining / (i + 1)
        scale *= sx
        x[n - 1 - i] = partial + scale * lower
        remaining -= lower
        slice_index -= lower
    x[n - 1] = partial + scale * remaining
    x = x[rng.permutation(n)]
    return (high - low) * x + low
