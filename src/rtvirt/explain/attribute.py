"""Cut each outlier's latency window into named, timed parts from what the layers saw.

An outlier is a sample above the run's threshold (default: the larger of its p99.9 and a floor of 20 us);
its window is [t_ns, t_ns + value] on the sample clock (planned wake-up to thread start; a gap's hole).
At every instant of the window the occupancy that explains it is the one of the outermost layer
(``model.LAYERS``: while the host ran something else, nothing inside the VM ran); inside one layer the
innermost one (the latest to start: an IRQ nested in a task, a timer in an IRQ; on a tie the shorter, then
the one its source listed last: a source refines an interval by listing a narrower copy after it). What no
occupancy covers is ``unexplained``, named with what could not be seen. Nothing here guesses a cause.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from ..stats import quantile as quantile_of
from .config import DEFAULT_FLOOR_NS, DEFAULT_QUANTILE
from .model import LAYERS, Explanation, LayerTrace, Occupancy, Part

__all__ = ["WINDOW", "choose_threshold", "outlier_windows", "attribute", "unexplained_cause", "summarize_parts"]

WINDOW = np.dtype([("start_ns", "<i8"), ("end_ns", "<i8"), ("cpu", "<i4"), ("latency_ns", "<i8")])
MAX_DETAIL = 1000
MAX_CAUSE = 300
_LAYER_RANK = {layer: rank for rank, layer in enumerate(LAYERS)}


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def choose_threshold(values: np.ndarray, *, threshold_ns: int | None = None, floor_ns: int = DEFAULT_FLOOR_NS,
                     quantile: float = DEFAULT_QUANTILE) -> tuple[int, str]:
    """The outlier threshold of a run's values and how it was chosen (a fixed one wins over the rule)."""
    if threshold_ns is not None:
        return int(threshold_ns), f"threshold {_us(threshold_ns)} (set)"
    if values.size == 0:
        return int(floor_ns), f"floor {_us(floor_ns)} (no samples)"
    # the quantile `rtvirt stats` prints (one definition: rtvirt.stats.quantile), shown to the ns as it does; the
    # samples are integers, so "above the level" and "above its integer part" pick the same ones
    level = quantile_of(values, quantile / 100)
    chosen = max(int(level), int(floor_ns))
    return chosen, f"p{quantile:g} = {level / 1000:.3f} us (floor {_us(floor_ns)})"


def outlier_windows(t_ns: np.ndarray, values: np.ndarray, cpus: np.ndarray, threshold_ns: int,
                    top: int) -> tuple[np.ndarray, int]:
    """The windows of the ``top`` largest samples above ``threshold_ns`` (largest first, ``WINDOW`` rows)
    and how many samples were above it."""
    above = np.flatnonzero(values > threshold_ns)
    order = above[np.argsort(-values[above], kind="stable")][:top]
    windows = np.zeros(order.size, dtype=WINDOW)
    windows["start_ns"] = t_ns[order].astype(np.int64)
    windows["latency_ns"] = values[order].astype(np.int64)
    windows["end_ns"] = windows["start_ns"] + windows["latency_ns"]
    windows["cpu"] = cpus[order].astype(np.int32)
    return windows, int(above.size)


def unexplained_cause(layers: Sequence[LayerTrace]) -> tuple[str, dict[str, str | int]]:
    """"unexplained", with what could not be seen (layers not traced and why; an outer hypervisor)."""
    unseen = [f"{layer.layer}: {layer.why_not}" for layer in layers if not layer.seen]
    invisible = [note for layer in layers for note in layer.notes if "invisible" in note]
    detail: dict[str, str | int] = {}
    if unseen:
        detail["not_seen"] = "; ".join(unseen)[:MAX_DETAIL]
    if invisible:
        detail["invisible"] = "; ".join(invisible)[:MAX_DETAIL]
    reasons = [f"{layer.layer} not traced" for layer in layers if not layer.seen]
    if invisible:
        reasons.append("outer hypervisor invisible")
    cause = "unexplained" + (f" ({', '.join(reasons)})" if reasons else "")
    return cause[:MAX_CAUSE], detail


def _window_parts(start: int, end: int, candidates: list[Occupancy]) -> list[tuple[int, int, Occupancy | None]]:
    """[start, end) cut at every candidate's edge, each piece given to its winner (None: nothing covers it),
    consecutive pieces of one winner merged."""
    edges = sorted({start, end, *(o.start_ns for o in candidates if start < o.start_ns < end),
                    *(o.end_ns for o in candidates if start < o.end_ns < end)})
    pieces: list[tuple[int, int, Occupancy | None]] = []
    for left, right in zip(edges, edges[1:], strict=False):
        covering = [(index, o) for index, o in enumerate(candidates) if o.start_ns <= left and o.end_ns >= right]
        # outermost layer, then innermost (latest start, then shortest), then the one a source listed last
        winner = min(covering, key=lambda c: (_LAYER_RANK[c[1].layer], -c[1].start_ns, c[1].end_ns, -c[0]))[1] \
            if covering else None
        if pieces and pieces[-1][2] is winner:
            pieces[-1] = (pieces[-1][0], right, winner)
        else:
            pieces.append((left, right, winner))
    return pieces


def summarize_parts(parts: Sequence[Part]) -> list[dict[str, object]]:
    """Share of the explained outliers' latency by cause, largest first."""
    latency = sum({(part.rank): part.latency_ns for part in parts}.values())
    totals: dict[tuple[str, str, str], list[int]] = {}
    for part in parts:
        entry = totals.setdefault((part.layer, part.kind, part.cause), [0, 0, -1])
        entry[0] += part.duration_ns
        if entry[2] != part.rank:  # parts of one outlier are consecutive
            entry[1], entry[2] = entry[1] + 1, part.rank
    rows: list[dict[str, object]] = [
        {"layer": layer, "kind": kind, "cause": cause, "total_ns": total, "outliers": count,
         "share": round(total / latency, 6) if latency else 0.0}
        for (layer, kind, cause), (total, count, _) in totals.items()]
    # largest first; equal totals by name, as the report orders its causes
    rows.sort(key=lambda row: (-int(row["total_ns"]), str(row["cause"])))  # type: ignore[call-overload]
    return rows


def attribute(windows: np.ndarray, layers: Sequence[LayerTrace], *, threshold_ns: int, threshold_rule: str,
              outliers: int) -> Explanation:
    """The parts of each window (``WINDOW`` rows, largest first) from the layers' occupancies.

    An occupancy counts for a window on its CPU (or any CPU when it is tied to none); its part's detail
    carries the layer's alignment uncertainty.
    """
    seen = [layer for layer in layers if layer.seen]
    occupancies = [o for layer in seen for o in layer.occupancies]
    alignment = {layer.layer: layer.alignment_ns for layer in seen}
    starts = np.fromiter((o.start_ns for o in occupancies), np.int64, len(occupancies))
    ends = np.fromiter((o.end_ns for o in occupancies), np.int64, len(occupancies))
    cpus = np.fromiter((o.cpu for o in occupancies), np.int64, len(occupancies))
    nobody, nobody_detail = unexplained_cause(layers)
    parts: list[Part] = []
    for rank, window in enumerate(windows.tolist(), 1):
        start, end, cpu, latency = (int(x) for x in window)
        near = np.flatnonzero((starts < end) & (ends > start) & ((cpus == cpu) | (cpus < 0)))
        for left, right, winner in _window_parts(start, end, [occupancies[i] for i in near]):
            if winner is None:
                layer, kind, cause, detail = "unexplained", "unexplained", nobody, nobody_detail
            else:
                layer, kind, cause = winner.layer, winner.kind, winner.cause
                detail = {**winner.detail, "alignment_ns": alignment.get(winner.layer, 0),
                          "occupied_ns": winner.duration_ns, "occupied_from_ns": winner.start_ns - start}
            parts.append(Part(sample_t_ns=start, latency_ns=latency, cpu=cpu, rank=rank, layer=layer,  # type: ignore[arg-type]
                              kind=kind, cause=cause, offset_ns=left - start, duration_ns=right - left,
                              detail=json.dumps(detail, separators=(",", ":"))[:MAX_DETAIL]))
    return Explanation(threshold_ns=threshold_ns, threshold_rule=threshold_rule, outliers=outliers, parts=parts,
                       layers=list(layers), summary=summarize_parts(parts))
