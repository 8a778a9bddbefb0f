"""What an experiment's records say, per design point and scheduler: acceptance ratio with its 95 % Wilson
score interval, mean interface bandwidth and overhead, simulated no-miss ratio, simulated misses among the
systems the analysis rejected and worst response over bound among those it accepted; and which scheduler's
analysis accepts most where (ties within each other's interval are named together)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["wilson", "summarize", "ci_narrow_enough"]

Z95 = 1.959963984540054


def wilson(successes: int, n: int) -> tuple[float, float, float]:
    """(ratio, low, high) of a binomial proportion with its 95 % Wilson score interval."""
    if n == 0:
        return math.nan, 0.0, 1.0
    p = successes / n
    denominator = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denominator
    return p, max(0.0, centre - half), min(1.0, centre + half)


def ci_narrow_enough(accepted: dict[str, list[bool]], width: float) -> bool:
    """Whether the interval of every scheduler's acceptance ratio is narrower than ``width``."""
    for values in accepted.values():
        _, low, high = wilson(sum(values), len(values))
        if high - low >= width:
            return False
    return True


class _Group:
    """Running statistics of one (point, question, scheduler): what ``summarize`` keeps instead of the rows."""

    _AXES = ("target_utilization", "vms", "tasks_per_vm", "pcpus", "utilizations", "periods", "deadlines",
             "guest_scheduler", "server_period", "spare")

    def __init__(self, first: dict[str, Any]) -> None:
        self.first = {key: first[key] for key in ("analysis", *self._AXES)}
        self.n = self.accepted = self.simulated = self.no_miss = 0
        self.rejected_simulated = self.rejected_with_misses = self.accepted_with_misses = 0
        self.utilization = self.bandwidth = self.overhead = 0.0
        self.utilizations = self.bandwidths = self.overheads = 0
        self.worst_ratio: float | None = None

    def add(self, row: dict[str, Any]) -> None:
        # sums in row order, as sum() over the rows would add them
        self.n += 1
        accepted = bool(row["accepted"])
        self.accepted += accepted
        if row["utilization"] is not None:
            self.utilization += row["utilization"]
            self.utilizations += 1
        if accepted and row["bandwidth"] is not None:
            self.bandwidth += row["bandwidth"]
            self.bandwidths += 1
        if accepted and row["overhead"] is not None:
            self.overhead += row["overhead"]
            self.overheads += 1
        misses = row["sim_misses"]
        if misses is None:
            return
        self.simulated += 1
        self.no_miss += misses == 0
        if accepted:
            self.accepted_with_misses += misses > 0
            ratio = row["sim_worst_ratio"]
            if ratio is not None and (self.worst_ratio is None or ratio > self.worst_ratio):
                self.worst_ratio = ratio
        else:
            self.rejected_simulated += 1
            self.rejected_with_misses += misses > 0


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per (point, question, scheduler) statistics and, per point and question, the dominating schedulers'
    analyses. ``rows`` is consumed once, in order: memory holds one running group per (point, question,
    scheduler), not the rows (``records.iter_records`` yields them chunk by chunk)."""
    groups: dict[tuple[int, str, str], _Group] = {}
    for row in rows:
        key = (row["point"], row["question"], row["scheduler"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(row)
        group.add(row)
    curves = []
    for (point, question, scheduler), g in sorted(groups.items()):
        ratio, low, high = wilson(g.accepted, g.n)
        no_miss = wilson(g.no_miss, g.simulated) if g.simulated else None
        curves.append({
            "point": point, "question": question, "scheduler": scheduler, **g.first,
            "systems": g.n, "acceptance": ratio, "acceptance_low": low, "acceptance_high": high,
            "mean_utilization": g.utilization / g.utilizations if g.utilizations else None,
            "mean_bandwidth": g.bandwidth / g.bandwidths if g.bandwidths else None,
            "mean_overhead": g.overhead / g.overheads if g.overheads else None,
            "simulated": g.simulated,
            "sim_no_miss": None if no_miss is None else no_miss[0],
            "sim_no_miss_low": None if no_miss is None else no_miss[1],
            "sim_no_miss_high": None if no_miss is None else no_miss[2],
            "rejected_simulated": g.rejected_simulated,
            "rejected_with_misses": g.rejected_with_misses,
            "accepted_with_misses": g.accepted_with_misses,
            "worst_ratio_accepted": g.worst_ratio,
        })
    dominance = []
    for point, question in sorted({(c["point"], c["question"]) for c in curves}):
        here = [c for c in curves if c["point"] == point and c["question"] == question]
        best = max(here, key=lambda c: c["acceptance"])
        tied = [c["scheduler"] for c in here if c["acceptance_high"] >= best["acceptance_low"]]
        nobody = best["acceptance"] == 0
        dominance.append({"point": point, "question": question, "target_utilization": best["target_utilization"],
                          "best": "none" if nobody else best["scheduler"], "acceptance": best["acceptance"],
                          "within_ci": tied if len(tied) > 1 and not nobody else []})
    return {"curves": curves, "dominance": dominance, "where": _where(dominance, curves)}


def _where(dominance: list[dict[str, Any]], curves: list[dict[str, Any]]) -> list[str]:
    """Sentences naming, per question, which scheduler's analysis accepts most over which utilisations
    (consecutive points of the same other axes with the same best, merged)."""
    axes = {c["point"]: tuple(c[k] for k in ("vms", "tasks_per_vm", "pcpus", "utilizations", "periods",
                                               "deadlines", "guest_scheduler", "server_period", "spare"))
            for c in curves}
    runs: list[list[dict[str, Any]]] = []
    for d in sorted(dominance, key=lambda d: (d["question"], axes[d["point"]], d["target_utilization"])):
        last = runs[-1][-1] if runs else None
        if last is not None and last["question"] == d["question"] and axes[last["point"]] == axes[d["point"]] \
                and last["best"] == d["best"] and last["within_ci"] == d["within_ci"]:
            runs[-1].append(d)
        else:
            runs.append([d])
    sentences = []
    for run in runs:
        low, high = run[0]["target_utilization"], run[-1]["target_utilization"]
        span = f"U {low:g}" if low == high else f"U {low:g}-{high:g}"
        others = [name for name in run[0]["within_ci"] if name != run[0]["best"]]
        tie = f" (not significantly more than {', '.join(others)}: their 95 % CIs overlap)" if others else ""
        if run[0]["best"] == "none":
            sentences.append(f"{run[0]['question']}: no scheduler's analysis accepts a system at {span}")
        else:
            sentences.append(f"{run[0]['question']}: {run[0]['best']} accepts most at {span}{tie}")
    return sentences
