"""A finished run as the live page shows it: the report's statistics, its verdict per requirement class and the
summary of its explanation, from its manifest (a results directory, a spool) or from its catalog row (a shared
store: the row's statistics and the ``explain`` entry of its manifest, fetched alone)."""

from __future__ import annotations

import math
from typing import Any

from ..quantity import Quantity, quantity_of, run_quantity
from ..results.verdicts import RequirementClass, judge
from ..summary import SUMMARY_FIELDS, Summary

__all__ = ["STAT_FIELDS", "result_of_manifest", "result_of_row"]

# the report's statistics, in its order (the page names them)
STAT_FIELDS = ("samples", "min_ns", "median_ns", "mean_ns", "p99_ns", "p999_ns", "p9999_ns", "max_ns",
               "max_jitter_ns", "dropped")
_MAX_TEXT = 300  # characters of a cause or reason shown


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:_MAX_TEXT]


def _verdicts(summary: Summary | None, quantity: Quantity, classes: list[RequirementClass]) -> list[list[str]]:
    """[class, outcome] per requirement class, the strictest (smallest budgets) first; none for values the
    latency classes do not judge (durations, rounds)."""
    if summary is None or not summary.samples or not quantity.judged:
        return []
    verdicts = sorted(judge(summary, classes), key=lambda v: (v.latency_budget_ns, v.jitter_budget_ns))
    return [[verdict.requirement, verdict.outcome] for verdict in verdicts]


def _explanation(entry: Any) -> dict[str, Any] | None:
    """The manifest's ``explain`` summary: threshold, outliers explained, the three largest causes."""
    if not isinstance(entry, dict):
        return None
    if entry.get("error"):
        return {"error": _text(entry["error"])}
    causes = [{"layer": _text(c.get("layer")), "cause": _text(c.get("cause")), "share": c.get("share")}
              for c in entry.get("top_causes") or [] if isinstance(c, dict)]
    return {"threshold_ns": entry.get("threshold_ns"), "outliers": entry.get("outliers"),
            "explained": entry.get("explained"), "top_causes": causes[:3]}


def _shown(stats: dict[str, Any] | None, quantity: Quantity) -> dict[str, str] | None:
    """The statistics as the report writes them in the run's unit (times in µs to 3 decimals, thousands
    separated; sample counts as they are)."""
    if stats is None:
        return None
    return {name: "-" if value is None else str(value) if name in ("samples", "dropped") else quantity.show(value, True)
            for name, value in stats.items()}


def _unit(quantity: Quantity) -> dict[str, str]:
    return {"quantity": quantity.name, "unit": quantity.shown_unit}


def result_of_manifest(manifest: dict[str, Any], classes: list[RequirementClass]) -> dict[str, Any]:
    overall = (manifest.get("summary") or {}).get("all") or {}
    try:
        summary: Summary | None = Summary.from_json(overall)
    except ValueError:  # a failed run (no samples), or a summary this version does not read
        summary = None
    campaign = manifest["campaign"] if isinstance(manifest.get("campaign"), dict) else {}
    quantity = run_quantity(manifest)
    stats = {name: overall.get(name) for name in STAT_FIELDS} if summary is not None else None
    return {"status": _text(manifest.get("status")), "value_field": _text(manifest.get("value_field")),
            **_unit(quantity), "stats": stats, "shown": _shown(stats, quantity),
            "verdicts": _verdicts(summary, quantity, classes), "explain": _explanation(manifest.get("explain")),
            "reason": _text(campaign.get("reason"))}


def _row_summary(row: dict[str, Any]) -> Summary | None:
    """What a verdict reads of a catalog row: samples, the worst case and the jitter (max - min, as the summary
    defines it), NaN for the rest; None without both extremes."""
    if row.get("max_value") is None or row.get("min_value") is None:
        return None
    values: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS, math.nan)
    values |= {"samples": int(row.get("samples") or 0), "dropped": int(row.get("dropped") or 0),
               "max_ns": float(row["max_value"]),
               "max_jitter_ns": float(row["max_value"]) - float(row["min_value"])}
    return Summary(**values)


def result_of_row(row: dict[str, Any], explain: Any, classes: list[RequirementClass]) -> dict[str, Any]:
    """From a catalog row (rtvirt.stores.provenance.COLUMNS: each statistic as ``<name>_value`` in the run's
    unit; jitter is max - min there) and its manifest's ``explain`` entry."""
    quantity = quantity_of(row.get("value_field"))
    stats = {name: row.get(name.removesuffix("_ns") + "_value") if name.endswith("_ns") else row.get(name)
             for name in STAT_FIELDS if name != "max_jitter_ns"}
    if row.get("max_value") is not None and row.get("min_value") is not None:
        stats["max_jitter_ns"] = float(row["max_value"]) - float(row["min_value"])
    shown = stats if row.get("samples") else None
    return {"status": _text(row.get("status")), "value_field": _text(row.get("value_field")), **_unit(quantity),
            "stats": shown, "shown": _shown(shown, quantity), "verdicts": _verdicts(_row_summary(row), quantity,
                                                                                     classes),
            "explain": _explanation(explain), "reason": None}
