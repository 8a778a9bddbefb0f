"""What a run's values are: the quantity each kind of value measures and its unit (docs/results-store.md, "Units").

Every producer names its values: the agents in the stream header (``value_field``: ``latency_ns``,
``duration_ns``, ``rounds``), importers and the simulator in the manifest. This table is the one place that says
what each name measures, so that every reader (statistics, tables, plots, SQL, verdicts, isolation) shows and
compares the values in their unit: a Thread-Metric run's 31,431 rounds are never 31.431 µs. No numpy here:
`rtvirt stats` of a stored run prints without the numeric stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Quantity", "QUANTITIES", "quantity_of", "run_quantity", "LATENCY"]


@dataclass(frozen=True)
class Quantity:
    """One kind of value: ``name`` (what it measures), ``unit`` (``ns``, or what a count counts), whether the
    requirement classes' latency budgets apply to it (``judged``), and whether a larger value is the worse one
    (a time is; a throughput's rounds are not)."""

    name: str
    unit: str
    judged: bool = False
    larger_is_worse: bool = True

    @property
    def is_time(self) -> bool:
        return self.unit == "ns"

    @property
    def shown_unit(self) -> str:
        """The unit tables show: times in µs, counts as counted."""
        return "µs" if self.is_time else self.unit

    @property
    def scale(self) -> float:
        """What a value is divided by to be shown in ``shown_unit``."""
        return 1000.0 if self.is_time else 1.0

    def axis(self, note: str = "") -> str:
        """A plot axis' label: ``latency (µs, log)``, ``rounds per interval (log)``."""
        inside = ", ".join(part for part in ("" if self._named_unit else self.shown_unit, note) if part)
        return f"{self.name} ({inside})" if inside else self.name

    @property
    def title(self) -> str:
        """What a table of these values is headed with, e.g. ``latency (µs)``, ``rounds per interval``."""
        return self.name if self._named_unit else f"{self.name} ({self.shown_unit})"

    @property
    def _named_unit(self) -> bool:
        """The name says the unit already (``rounds per interval``)."""
        return self.unit in self.name.split()

    def show(self, value: float | None, grouped: bool = False) -> str:
        """A value as tables show it: a time in µs to the ns, a count to three decimals where a statistic of
        counts has them (a median between two intervals), else whole; ``grouped``: with thousands separators."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        comma = "," if grouped else ""
        if self.is_time:
            return f"{value / 1000:{comma}.3f}"
        return f"{value:{comma}.3f}".rstrip("0").rstrip(".")

    def as_dict(self) -> dict[str, Any]:
        return {"quantity": self.name, "unit": self.unit}


LATENCY = Quantity("latency", "ns", judged=True)
# value_field -> what it measures; a value_field not listed: a time when it ends in _ns, else a count of itself
QUANTITIES: dict[str, Quantity] = {
    "latency_ns": LATENCY,  # timer, wakeup, imported cyclictest / rtla / jitterdebugger
    "response_ns": Quantity("response time", "ns", judged=True),  # simulated tasks: release to completion
    "duration_ns": Quantity("duration", "ns"),  # workload, kops, gap, selftest: how long a piece of work took
    "rounds": Quantity("rounds per interval", "rounds", larger_is_worse=False),  # threadmetric's throughput
}


def quantity_of(value_field: str | None) -> Quantity:
    """The quantity a value column holds (None: a latency in ns, what a foreign latency file holds)."""
    if not value_field:
        return LATENCY
    known = QUANTITIES.get(value_field)
    if known is not None:
        return known
    if value_field.endswith("_ns"):
        return Quantity(value_field.removesuffix("_ns").replace("_", " "), "ns")
    return Quantity(value_field.replace("_", " "), value_field)


def run_quantity(manifest: dict[str, Any]) -> Quantity:
    """The quantity of a stored run's values (from its value_field, so runs stored before units were recorded
    read the same)."""
    value_field = manifest.get("value_field")
    return quantity_of(value_field if isinstance(value_field, str) else None)
