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

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from ..stats import fraction_of_percent
from ..stats import quantile as quantile_of
from .config import DEFAULT_FLOOR_NS, DEFAULT_QUANTILE
from .model import HELD_KINDS, LAYERS, Explanation, LayerTrace, Occupancy, Part, culprit_of

__all__ = ["WINDOW", "choose_threshold", "outlier_windows", "attribute", "unexplained_cause", "summarize_parts",
           "summarize_runs", "headline", "MergedPart", "merged_parts"]

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
    level = quantile_of(values, fraction_of_percent(quantile))
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


def _exact_stolen(covering: list[tuple[int, Occupancy]]) -> list[tuple[int, Occupancy]]:
    """Where every outer layer's claim is only an uncertain edge, the time the guest read as stolen (its
    hypervisor's own count, exact on the sample clock: KVM's steal time, Xen's runstate area) is that outer
    layer's doing, measured: it takes the piece (a KVM lab's VM layer, placed within ±7 ms over a bare-metal
    guest's console, would otherwise hide every 2 ms hole a host task made)."""
    stolen = [c for c in covering if c[1].kind == "stolen"]
    if not stolen:
        return []
    inner = _LAYER_RANK[stolen[0][1].layer]
    outer = [o for _, o in covering if _LAYER_RANK[o.layer] < inner]
    return stolen if outer and all(o.kind == "uncertain" for o in outer) else []


def _window_parts(start: int, end: int, candidates: list[Occupancy]) -> list[tuple[int, int, Occupancy | None]]:
    """[start, end) cut at every candidate's edge, each piece given to its winner (None: nothing covers it),
    consecutive pieces of one winner merged."""
    edges = sorted({start, end, *(o.start_ns for o in candidates if start < o.start_ns < end),
                    *(o.end_ns for o in candidates if start < o.end_ns < end)})
    pieces: list[tuple[int, int, Occupancy | None]] = []
    for left, right in zip(edges, edges[1:], strict=False):
        covering = [(index, o) for index, o in enumerate(candidates) if o.start_ns <= left and o.end_ns >= right]
        # outermost layer, then innermost (latest start, then shortest), then the one a source listed last
        winner = min(_exact_stolen(covering) or covering,
                     key=lambda c: (_LAYER_RANK[c[1].layer], -c[1].start_ns, c[1].end_ns, -c[0]))[1] \
            if covering else None
        if pieces and pieces[-1][2] is winner:
            pieces[-1] = (pieces[-1][0], right, winner)
        else:
            pieces.append((left, right, winner))
    return pieces


def _share(total: int, latency: int) -> float:
    return round(total / latency, 6) if latency else 0.0


def summarize_parts(parts: Sequence[Part]) -> list[dict[str, object]]:
    """Share of one run's explained outliers' latency by culprit (``summarize_runs`` of that run alone)."""
    return summarize_runs([parts])


@dataclasses.dataclass
class _Tally:
    total_ns: int = 0
    outliers: set[tuple[int, int]] = dataclasses.field(default_factory=set)

    def add(self, outlier: tuple[int, int], duration_ns: int) -> None:
        self.total_ns += duration_ns
        self.outliers.add(outlier)


def summarize_runs(runs: Sequence[Sequence[Part]]) -> list[dict[str, object]]:
    """Share of the explained outliers' latency by culprit over the parts of one or more runs (pooled: a
    configuration's repetitions), largest first: one row per culprit (a task, an IRQ, a vCPU, a domain:
    ``culprit``) with its whole share, its variants (layer, kind and what sets them apart: a phase, a state)
    beneath, each with its total, share and the outliers it took part in."""
    keyed = [((run, part.rank), part) for run, parts in enumerate(runs) for part in parts]
    latency = sum({outlier: part.latency_ns for outlier, part in keyed}.values())
    culprits: dict[str, _Tally] = {}
    variants: dict[str, dict[tuple[str, str, str], _Tally]] = {}
    for outlier, part in keyed:
        culprit = culprit_of(part)
        culprits.setdefault(culprit, _Tally()).add(outlier, part.duration_ns)
        variants.setdefault(culprit, {}).setdefault((part.layer, part.kind, part.variant), _Tally()).add(
            outlier, part.duration_ns)
    rows: list[dict[str, object]] = []
    for culprit, tally in culprits.items():
        shown = sorted(({"layer": layer, "kind": kind, "variant": variant, "total_ns": each.total_ns,
                         "outliers": len(each.outliers), "share": _share(each.total_ns, latency)}
                        for (layer, kind, variant), each in variants[culprit].items()),
                       key=lambda v: (-int(v["total_ns"]), str(v["variant"])))  # type: ignore[call-overload]
        rows.append({"culprit": culprit, "cause": culprit, "layer": shown[0]["layer"], "kind": shown[0]["kind"],
                     "total_ns": tally.total_ns, "outliers": len(tally.outliers),
                     "share": _share(tally.total_ns, latency), "variants": shown})
    # largest first; equal totals by name, as the report orders its causes
    return sorted(rows, key=lambda row: (-int(row["total_ns"]), str(row["culprit"])))  # type: ignore[call-overload]


def headline(parts: Sequence[Part]) -> dict[str, object]:
    """How the outliers divide: each goes to what took most of its latency: a traced layer's cause (something
    ran instead, seen), an outer layer that held the inner one back with nothing traced running instead
    (``HELD_KINDS``: a stopped vCPU thread, a late interrupt to an idle CPU; counted by culprit), or nothing
    seen (unexplained)."""
    shares: dict[tuple[int, int], dict[str, int]] = {}
    held_by: dict[tuple[int, int], dict[str, int]] = {}
    for part in parts:
        outlier = (part.sample_t_ns, part.rank)
        kind = "unexplained" if part.layer == "unexplained" or part.kind == "uncertain" else \
            "held" if part.kind in HELD_KINDS else "traced"
        totals = shares.setdefault(outlier, {"traced": 0, "held": 0, "unexplained": 0})
        totals[kind] += part.duration_ns
        if kind == "held":
            culprits = held_by.setdefault(outlier, {})
            culprits[culprit_of(part)] = culprits.get(culprit_of(part), 0) + part.duration_ns
    counts = {"traced": 0, "held": 0, "unexplained": 0}
    held: dict[str, int] = {}
    for outlier, totals in shares.items():
        # ties go to the traced cause, then to the held one: "unexplained" only where nothing else is larger
        winner = max(("traced", "held", "unexplained"), key=lambda k: (totals[k], -("traced", "held",
                                                                                     "unexplained").index(k)))
        counts[winner] += 1
        if winner == "held":
            culprits = held_by[outlier]
            top = max(sorted(culprits), key=lambda c: culprits[c])
            held[top] = held.get(top, 0) + 1
    return {"outliers": len(shares), "traced": counts["traced"], "held": counts["held"],
            "unexplained": counts["unexplained"],
            "held_by": dict(sorted(held.items(), key=lambda item: (-item[1], item[0])))}


# parts short enough to read as an interruption of what runs around them (an interrupt, a softirq, a timer
# callback, a VM exit, in the host or the guest) rather than as a cause of their own; a longer one breaks the run
# it falls in. ("guest-irq" is left out: it is also the timerlat phase "guest timer IRQ latency", a part of the
# window's own measurement, not an interruption of anything.)
_BRIEF_KINDS = frozenset({"irq", "irq-vector", "softirq", "timer", "vm-exit", "guest-irq-vector", "guest-softirq",
                          "guest-timer"})
BRIEF_NS = 100_000


@dataclasses.dataclass(slots=True)
class MergedPart:
    """One line of an outlier's listing: ``part`` with the time of the ``pieces`` parts of its cause it joins
    (its offset the first's), and the brief parts between them it passed over (``interruptions``: cause ->
    [count, ns])."""

    part: Part
    pieces: int = 1
    interruptions: dict[str, list[int]] = dataclasses.field(default_factory=dict)


def _cause_key(part: Part) -> tuple[str, str, str]:
    return part.layer, part.kind, part.cause


def merged_parts(parts: Sequence[Part]) -> list[MergedPart]:
    """One outlier's parts (in window order) with the runs of one cause (layer, kind, cause) joined: adjoining
    parts, and parts separated by nothing but brief interruptions (interrupts, softirqs, timer callbacks, VM
    exits, each under ``BRIEF_NS``), which the joined line counts instead of listing. A vCPU preempted again
    and again by one task, or a FIFO hog interrupted by every tick for half a second, reads as one line; the
    summary still gives every interruption its share. Parts that do not adjoin (a gap between them) are never
    joined."""
    merged: list[MergedPart] = []
    between: list[Part] = []  # brief parts since the last line, adjoining, not yet known to interrupt it
    reached = 0  # the end (offset) of the last part taken into ``merged`` or ``between``

    def append(part: Part) -> None:  # a line of its own, or the next piece of the line before it
        last = merged[-1] if merged else None
        if last is not None and _cause_key(last.part) == _cause_key(part):
            last.part = dataclasses.replace(last.part, duration_ns=last.part.duration_ns + part.duration_ns)
            last.pieces += 1
        else:
            merged.append(MergedPart(part))

    def flush() -> None:  # the brief parts did not interrupt a run after all: lines of their own
        for brief in between:
            append(brief)
        between.clear()

    for part in parts:
        adjoins = bool(merged) and part.offset_ns == reached
        line = merged[-1] if adjoins else None
        if line is not None and between and _cause_key(line.part) == _cause_key(part):
            for brief in between:
                counted = line.interruptions.setdefault(brief.cause, [0, 0])
                counted[0] += 1
                counted[1] += brief.duration_ns
            between.clear()
            append(part)
        elif line is not None and line.part.kind not in _BRIEF_KINDS and part.kind in _BRIEF_KINDS and \
                part.duration_ns < BRIEF_NS:
            between.append(part)
        else:
            flush()
            if adjoins:
                append(part)
            else:
                merged.append(MergedPart(part))
        reached = part.offset_ns + part.duration_ns
    flush()
    return merged


def _certain(layers: Sequence[LayerTrace]) -> list[Occupancy]:
    """The layers' occupancies, where an outer layer is placed less exactly than a layer inside it (the VM's
    through a clock exchange, Xen's through its alignment, over a guest's own exact trace) cut to where it holds
    for certain. Where the outer layer's occupancies of a CPU begin or end (the edges of their union: inside it,
    one of them holds the CPU whatever the placement) its uncertainty either side is uncertain: it may be the
    outer layer or what the inner one shows; the rest keeps its names and precedence. Without a finer layer
    inside, an occupancy stays whole: nothing else could claim its edges."""
    seen = [layer for layer in layers if layer.seen and layer.layer != "unexplained"]
    found: list[Occupancy] = []
    for layer in seen:
        finer = [inner for inner in seen if _LAYER_RANK[inner.layer] > _LAYER_RANK[layer.layer] and
                 inner.occupancies and inner.alignment_ns < layer.alignment_ns]
        if not finer or layer.alignment_ns <= 0:
            found += layer.occupancies
            continue
        by_cpu: dict[int, list[Occupancy]] = {}
        for occupancy in layer.occupancies:
            if occupancy.layer == "unexplained":
                found.append(occupancy)
            else:
                by_cpu.setdefault(occupancy.cpu, []).append(occupancy)
        for occupancies in by_cpu.values():
            found += _within_certainty(occupancies, layer.layer, layer.alignment_ns, finer[0].layer)
    return found


def _within_certainty(occupancies: list[Occupancy], layer: str, margin: int, inner: str) -> list[Occupancy]:
    """One CPU's occupancies of an outer layer: each union of them shrunk by ``margin`` at both ends; the ends
    (those that overlap joined: a vCPU off and on again within the uncertainty) named uncertain with what the
    layer saw there (the causes that took most of it)."""
    occupancies = sorted(occupancies, key=lambda o: o.start_ns)
    unions: list[tuple[int, int]] = []
    for occupancy in occupancies:
        if unions and occupancy.start_ns <= unions[-1][1]:
            unions[-1] = (unions[-1][0], max(unions[-1][1], occupancy.end_ns))
        else:
            unions.append((occupancy.start_ns, occupancy.end_ns))
    cores = [(begin + margin, end - margin) for begin, end in unions if end - begin > 2 * margin]
    edges: list[tuple[int, int]] = []
    for low, high in sorted(edge for begin, end in unions for edge in (
            [(begin - margin, begin + margin), (end - margin, end + margin)] if end - begin > 2 * margin else
            [(begin - margin, end + margin)])):
        if edges and low <= edges[-1][1]:
            edges[-1] = (edges[-1][0], max(edges[-1][1], high))
        else:
            edges.append((low, high))
    found = [dataclasses.replace(o, start_ns=max(o.start_ns, low), end_ns=min(o.end_ns, high))
             for low, high in cores for o in occupancies if min(o.end_ns, high) > max(o.start_ns, low)]
    said = f"uncertain ({layer} ±{margin / 1e3:.0f} us)"
    for low, high in edges:
        time: dict[str, int] = {}
        for o in occupancies:
            if o.start_ns < high and o.end_ns > low:
                time[o.cause] = time.get(o.cause, 0) + min(o.end_ns, high) - max(o.start_ns, low)
        causes = sorted(time, key=lambda cause: -time[cause])
        more = f" and {len(causes) - 1} more" if len(causes) > 1 else ""
        first = next(o for o in occupancies if o.cause == causes[0])
        found.append(dataclasses.replace(
            first, start_ns=low, end_ns=high, kind="uncertain", cause=f"{said}: {causes[0]}{more}",
            culprit=f"{said}: where it meets the {inner} layer", variant="",
            detail={**first.detail, "seen_there": "; ".join(causes[:5])[:MAX_DETAIL]}))
    return found


def _segments(layers: Sequence[LayerTrace]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Where a window's thread waited, when a layer saw it move ((window start, cpu) -> [(from, cpu)...]): an
    unpinned timer thread waits on the CPU its timer fires on until it is woken, then where it runs."""
    found: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for layer in layers:
        for start, cpu, at, moved_to in layer.moves:
            found.setdefault((int(start), int(cpu)), []).append((int(at), int(moved_to)))
    return {key: sorted(moves) for key, moves in found.items()}


def attribute(windows: np.ndarray, layers: Sequence[LayerTrace], *, threshold_ns: int, threshold_rule: str,
              outliers: int) -> Explanation:
    """The parts of each window (``WINDOW`` rows, largest first) from the layers' occupancies.

    An occupancy counts for a window on its CPU (or any CPU when it is tied to none), or, where a layer saw the
    window's thread wait on another CPU for a stretch (``LayerTrace.moves``), on that CPU for that stretch (the
    part's detail says which: ``waited_on_cpu``); its part's detail carries the layer's alignment uncertainty.
    """
    seen = [layer for layer in layers if layer.seen]
    occupancies = _certain(seen)
    alignment = {layer.layer: layer.alignment_ns for layer in seen}
    starts = np.fromiter((o.start_ns for o in occupancies), np.int64, len(occupancies))
    ends = np.fromiter((o.end_ns for o in occupancies), np.int64, len(occupancies))
    cpus = np.fromiter((o.cpu for o in occupancies), np.int64, len(occupancies))
    nobody, nobody_detail = unexplained_cause(layers)
    moved = _segments(seen)
    parts: list[Part] = []
    for rank, window in enumerate(windows.tolist(), 1):
        start, end, cpu, latency = (int(x) for x in window)
        stretches = [(start, cpu)]
        for at, on in moved.get((start, cpu), []):
            if at <= start:
                stretches[0] = (start, on)
            elif at < end:
                stretches.append((at, on))
        for (left_at, on), (right_at, _) in zip(stretches, [*stretches[1:], (end, cpu)], strict=True):
            near = np.flatnonzero((starts < right_at) & (ends > left_at) & ((cpus == on) | (cpus < 0)))
            for left, right, winner in _window_parts(left_at, right_at, [occupancies[i] for i in near]):
                culprit = variant = ""
                if winner is None:
                    layer, kind, cause, detail = "unexplained", "unexplained", nobody, nobody_detail
                else:
                    layer, kind, cause = winner.layer, winner.kind, winner.cause
                    culprit, variant = winner.culprit, winner.variant
                    detail = {**winner.detail, "alignment_ns": alignment.get(winner.layer, 0),
                              "occupied_ns": winner.duration_ns, "occupied_from_ns": winner.start_ns - start}
                if on != cpu:
                    detail = {**detail, "waited_on_cpu": on}
                parts.append(Part(sample_t_ns=start, latency_ns=latency, cpu=cpu, rank=rank, layer=layer,  # type: ignore[arg-type]
                                  kind=kind, cause=cause, offset_ns=left - start, duration_ns=right - left,
                                  detail=json.dumps(detail, separators=(",", ":"))[:MAX_DETAIL],
                                  culprit=culprit[:MAX_CAUSE], variant=variant[:MAX_CAUSE]))
    return Explanation(threshold_ns=threshold_ns, threshold_rule=threshold_rule, outliers=outliers, parts=parts,
                       layers=list(layers), summary=summarize_parts(parts))
