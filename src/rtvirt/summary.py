"""The exact summary of a set of samples (fields: docs/statistics.md), without numpy: `rtvirt stats` of a
stored run reads it from the run's digest.json and prints it without importing the numeric stack."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from .quantity import Quantity

__all__ = ["Summary", "SUMMARY_FIELDS", "Statistics"]


@dataclass(frozen=True)
class Summary:
    samples: int
    dropped: int
    min_ns: float
    lower_whisker_ns: float
    q1_ns: float
    median_ns: float
    mean_ns: float
    q3_ns: float
    upper_whisker_ns: float
    p99_ns: float
    p999_ns: float
    p9999_ns: float
    max_ns: float
    stdev_ns: float
    max_jitter_ns: float
    mean_ci_low_ns: float = math.nan
    mean_ci_high_ns: float = math.nan
    median_ci_low_ns: float = math.nan
    median_ci_high_ns: float = math.nan

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def as_json(self) -> dict[str, float | int | None]:
        """Strict JSON: NaN (statistics of no samples, the CI of one) becomes null."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, document: Any) -> Summary:
        """The inverse of :meth:`as_json`; ValueError if a field is missing or not a number."""
        if not isinstance(document, dict):
            raise ValueError("a summary is a JSON object")
        values: dict[str, Any] = {}
        for name in SUMMARY_FIELDS:
            value = document.get(name)
            if name in ("samples", "dropped"):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"summary field {name!r} is not an integer")
                values[name] = value
            elif value is None:
                values[name] = math.nan
            elif isinstance(value, int | float) and not isinstance(value, bool):
                values[name] = float(value)
            else:
                raise ValueError(f"summary field {name!r} is not a number")
        return cls(**values)


SUMMARY_FIELDS = tuple(Summary.__dataclass_fields__)


class Statistics(NamedTuple):
    """A run's (or file's) summaries per group and ``all``, with what their values are: the ``*_ns`` fields hold
    values in ``quantity.unit`` (ns for times, rounds for Thread-Metric)."""

    quantity: Quantity
    groups: dict[str, Summary]

    def as_json(self) -> dict[str, dict[str, Any]]:
        """``{group: summary fields + quantity, unit}``: each summary says what its values are."""
        return {group: {**s.as_dict(), **self.quantity.as_dict()} for group, s in self.groups.items()}
