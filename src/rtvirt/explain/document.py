"""A stored explanation as plain data: what ``rtvirt explain --json`` prints and the report's JSON carries
for each explained run (one function, so the two always show the same numbers)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..errors import InputError
from ..store import missed_periods
from .attribute import MergedPart, headline, merged_parts, summarize_parts
from .model import Explanation, Part

__all__ = ["explanation_document"]


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def _part(line: MergedPart) -> dict[str, Any]:
    part = line.part
    shown: dict[str, Any] = {
        "layer": part.layer, "kind": part.kind, "cause": part.cause, "culprit": part.culprit or part.cause,
        "variant": part.variant, "offset_ns": part.offset_ns, "duration_ns": part.duration_ns,
        "detail": json.loads(part.detail or "{}")}
    if line.pieces > 1:
        shown["pieces"] = line.pieces
    if line.interruptions:
        shown["interruptions"] = [{"cause": cause, "count": count, "duration_ns": ns}
                                  for cause, (count, ns) in sorted(line.interruptions.items(),
                                                                   key=lambda item: (-item[1][1], item[0]))]
    return shown


def explanation_document(explanation: Explanation, manifest: dict[str, Any], path: str, top: int | None,
                         threshold_ns: int | None = None, merge: bool = True) -> dict[str, Any]:
    """The stored numbers of a run's explanation (``manifest`` its run's), narrowed to ``threshold_ns`` and
    the ``top`` largest outliers when asked; ``merge``: each outlier's runs of one cause as one line
    (``attribute.merged_parts``: the number of ``pieces`` it joins, the brief ``interruptions`` it passed
    over; the first's detail). The summary is pooled by culprit from the
    parts (so an explanation stored before culprits existed reads the same way)."""
    parts = explanation.parts
    outliers = explanation.outliers
    if threshold_ns is not None:
        if threshold_ns < explanation.threshold_ns:
            raise InputError(f"option --threshold: {_us(threshold_ns)} is below the run's stored threshold; the run "
                             f"keeps parts of outliers above {_us(explanation.threshold_ns)} only")
        parts = [part for part in parts if part.latency_ns > threshold_ns]
        outliers = len({part.rank for part in parts})
    summary = summarize_parts(parts)
    by_rank: dict[int, list[Part]] = {}
    for part in parts:
        by_rank.setdefault(part.rank, []).append(part)
    ranks = sorted(by_rank)[:top] if top is not None else sorted(by_rank)
    start = int((manifest.get("stream_header") or {}).get("start_monotonic_ns") or 0)
    return {
        "run_id": manifest.get("run_id"), "path": path, "probe": manifest.get("probe"),
        "threshold_ns": threshold_ns if threshold_ns is not None else explanation.threshold_ns,
        "threshold_rule": f"--threshold {_us(threshold_ns)}" if threshold_ns is not None else
        explanation.threshold_rule,
        "outliers": outliers, "explained": len(by_rank), "headline": headline(parts),
        "missed_periods": missed_periods(manifest),
        "summary": summary,
        "layers": [{key: value for key, value in dataclasses.asdict(layer).items() if key != "occupancies"}
                   for layer in explanation.layers],
        "worst": [{"rank": rank, "sample_t_ns": by_rank[rank][0].sample_t_ns,
                   "at_s": round((by_rank[rank][0].sample_t_ns - start) / 1e9, 9) if start else None,
                   "latency_ns": by_rank[rank][0].latency_ns, "cpu": by_rank[rank][0].cpu,
                   "parts": [_part(line) for line in
                             (merged_parts(by_rank[rank]) if merge else map(MergedPart, by_rank[rank]))]}
                  for rank in ranks],
    }
