"""What the report shows of the runs' explanations (docs/explain.md "In the report"): per configuration the
share of outlier latency by cause (pooled over its runs), the worst outliers part by part with what ran on
their CPU around them (from the occupancies each run keeps), and the cause behind each isolation row.

The numbers are the stored ones (``explain.stored``): a run's summary and parts reach the report's JSON as
``rtvirt explain --json`` prints them (``explain.document``); only the pooling over a configuration's runs is
computed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..explain.attribute import summarize_runs
from ..explain.document import explanation_document
from ..explain.model import Explanation, Occupancy, Part
from ..explain.stored import PARTS_FILE, SUMMARY_FILE, read_explanation
from ..store import StoredRun

__all__ = ["CauseShare", "Timeline", "load_explanation", "explanation_json", "configuration_causes",
           "worst_timelines", "caused_by", "CAUSES_SHOWN", "TIMELINES", "TIMELINE_OCCUPANCIES"]

CAUSES_SHOWN = 8  # causes named per configuration (the rest drawn as "other")
TIMELINES = 3  # worst outliers of a configuration drawn as a timeline
TIMELINE_OCCUPANCIES = 200  # intervals kept per timeline (the rest are far smaller than a pixel)
_MARGIN_MAX_NS = 1_000_000  # the sources keep occupancies this far around each window (explain.host.MARGIN_NS)
_MARGIN_MIN_NS = 50_000


@dataclass(frozen=True)
class CauseShare:
    """One culprit's part of a configuration's explained outlier latency, pooled over its runs and their
    threads (``cause``: the culprit, with no pid: explain.attribute.summarize_runs), its variants beneath."""

    layer: str  # of its largest variant
    kind: str
    cause: str
    total_ns: int
    outliers: int  # explained outliers it took part in
    share: float  # of the explained outliers' latency
    variants: list[dict[str, Any]] = field(default_factory=list)  # {layer, kind, variant, total_ns, outliers, share}


@dataclass(frozen=True)
class Timeline:
    """What ran on an outlier's CPU from ``from_ns`` to ``to_ns`` (sample clock), its window inside."""

    run_id: str
    rank: int
    cpu: int
    start_ns: int  # the window: planned wake-up ...
    latency_ns: int  # ... to thread start
    from_ns: int
    to_ns: int
    parts: list[Part]
    occupancies: list[Occupancy] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "rank": self.rank, "cpu": self.cpu, "start_ns": self.start_ns,
                "latency_ns": self.latency_ns, "from_ns": self.from_ns, "to_ns": self.to_ns,
                "occupancies": [{"layer": o.layer, "kind": o.kind, "cause": o.cause, "start_ns": o.start_ns,
                                 "end_ns": o.end_ns, "cpu": o.cpu} for o in self.occupancies]}


def load_explanation(run_dir: Path) -> Explanation | None:
    """A run's stored explanation; a damaged one is an error naming its files (never a traceback)."""
    try:
        return read_explanation(run_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{run_dir / SUMMARY_FILE}, {run_dir / PARTS_FILE}: cannot read the run's explanation "
                         f"({type(exc).__name__}: {str(exc)[:200]})") from None


def explanation_json(run: StoredRun, explanation: Explanation, top: int) -> dict[str, Any]:
    """A run's explanation as ``rtvirt explain RUN --json --top TOP`` prints it (the stored numbers)."""
    return explanation_document(explanation, run.manifest, str(run.path), top)


def configuration_causes(explanations: list[Explanation]) -> list[CauseShare]:
    """The share of outlier latency by culprit over a configuration's explained runs, largest first (the same
    pooling as ``rtvirt explain``'s summary: one line per culprit)."""
    rows = summarize_runs([explanation.parts for explanation in explanations])
    return [CauseShare(str(row["layer"]), str(row["kind"]), str(row["culprit"]), int(row["total_ns"]),  # type: ignore[call-overload]
                       int(row["outliers"]), float(row["share"]), list(row["variants"]))  # type: ignore[call-overload, arg-type]
            for row in rows]


def caused_by(causes: list[CauseShare]) -> str:
    """The isolation table's "caused by": the cause with the largest share of the outlier latency."""
    if not causes:
        return "-"
    top = causes[0]
    return f"{top.cause} ({top.share:.0%})"


def _timeline(run_id: str, explanation: Explanation, rank: int) -> Timeline:
    parts = [part for part in explanation.parts if part.rank == rank]
    start, latency, cpu = parts[0].sample_t_ns, parts[0].latency_ns, parts[0].cpu
    margin = min(max(latency, _MARGIN_MIN_NS), _MARGIN_MAX_NS)
    low, high = start - margin, start + latency + margin
    near = [o for layer in explanation.layers if layer.seen for o in layer.occupancies
            if o.start_ns < high and o.end_ns > low and o.cpu in (cpu, -1)]
    # the longest are what the eye reads; keep those, drawn in time order
    near = sorted(sorted(near, key=lambda o: -min(o.end_ns, high) + max(o.start_ns, low))[:TIMELINE_OCCUPANCIES],
                  key=lambda o: (o.start_ns, o.end_ns))
    return Timeline(run_id, rank, cpu, start, latency, low, high, parts, near)


def worst_timelines(runs: list[tuple[str, Explanation]], count: int = TIMELINES) -> list[Timeline]:
    """The ``count`` largest explained outliers over a configuration's runs, each with its timeline."""
    candidates = sorted(((part.latency_ns, run_id, explanation, part.rank)
                         for run_id, explanation in runs for part in explanation.parts),
                        key=lambda row: (-row[0], row[1], row[3]))
    chosen: list[tuple[str, Explanation, int]] = []
    for _, run_id, explanation, rank in candidates:
        if len(chosen) == count:
            break
        if not any(run_id == r and rank == k for r, _, k in chosen):
            chosen.append((run_id, explanation, rank))
    return [_timeline(run_id, explanation, rank) for run_id, explanation, rank in chosen]
