"""Automotive periods (Kramer, Ziegenbein & Hamann, "Real world automotive benchmarks for free", WATERS 2015):
the share of runnables per period in an engine-control system, 1 ms to 1 s. The angle-synchronous runnables
(15 % there) have no fixed period and are left out; the other shares are renormalised."""

from __future__ import annotations

import numpy as np

__all__ = ["automotive_periods"]

_PERIODS_MS = np.array([1, 2, 5, 10, 20, 50, 100, 200, 1000])
_SHARES = np.array([3, 2, 2, 25, 25, 3, 20, 1, 4], dtype=float)


def automotive_periods(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.choice(_PERIODS_MS, size=n, p=_SHARES / _SHARES.sum())
