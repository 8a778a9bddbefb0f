"""Configuration rules for Xen's SEDF, SEDF' and PSEDF schedulers from the automotive control study.

Masrur, Drössler, Pfeuffer & Chakraborty, "VM-based real-time services for automotive control
applications", RTCSA 2010 (rules as summarised in docs/analysis.md). A driver domain N forwards sensor
packets (worst case e_N per packet) to k real-time domains; domain i runs one task (WCET e_i, deadline d_i)
per packet; d_min is the smallest deadline.

- SEDF (short-unblocking rule): s_N = k·e_N, p_N ≤ d_min/5, s_i = e_i; worst case 4·p_N + p_i ≤ d_i.
- SEDF' (rule removed): as SEDF but worst case 2·p_N + p_i ≤ d_i.
- PSEDF: N above all, RT domains deadline-monotonic below it; p_N = d_min − s_N, p_i = packet period,
  s_i = e_i; worst case r_i = s_i + Σ_{j ∈ hp(i)} ⌈r_i / p_j⌉·s_j ≤ d_i.

For SEDF and SEDF' the rules leave p_i free: we take the largest period the worst-case rule allows, capped
at the packet period (a longer period would skip packets), because a longer period reserves less of the
processor. N runs on its own core (as in the study); the RT domains share one core, whose reservation
Σ s_i/p_i decides how much non-RT load that core can still guarantee: SEDF and SEDF' isolate by
reservation (non-RT domains need their own slice), PSEDF runs non-RT domains only when no RT domain is ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .taskset import ceil_div

__all__ = ["RtDomain", "RuleResult", "derive_rules", "RULES"]

RULES = ("sedf", "sedf-prime", "psedf")


@dataclass(frozen=True)
class RtDomain:
    name: str
    wcet: int
    deadline: int
    packet_period: int


@dataclass
class RuleResult:
    rule: str
    driver_slice: int
    driver_period: int
    slices: dict[str, int]
    periods: dict[str, int]
    worst_case: dict[str, int]
    deadlines: dict[str, int]
    rt_core_utilization: float
    driver_core_utilization: float
    notes: list[str] = field(default_factory=list)

    @property
    def meets_every_deadline(self) -> bool:
        return (all(self.worst_case[name] <= self.deadlines[name] for name in self.deadlines)
                and self.rt_core_utilization <= 1 and self.driver_core_utilization <= 1
                and all(self.slices[name] <= self.periods[name] for name in self.slices))

    @property
    def nonrt_load_room(self) -> float:
        """Largest non-RT utilisation the RT core can add while the rule still holds."""
        return max(0.0, 1 - self.rt_core_utilization) if self.meets_every_deadline else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "driver_slice_ns": self.driver_slice, "driver_period_ns": self.driver_period,
            "domains": [{"name": name, "slice_ns": self.slices[name], "period_ns": self.periods[name],
                         "worst_case_ns": self.worst_case[name], "deadline_ns": self.deadlines[name],
                         "meets": self.worst_case[name] <= self.deadlines[name]} for name in self.slices],
            "rt_core_utilization": self.rt_core_utilization, "driver_core_utilization": self.driver_core_utilization,
            "meets_every_deadline": self.meets_every_deadline, "nonrt_load_room": self.nonrt_load_room,
            "notes": self.notes,
        }


def _sedf_family(rule: str, domains: Sequence[RtDomain], driver_cost: int, multiplier: int) -> RuleResult:
    d_min = min(domain.deadline for domain in domains)
    driver_slice = len(domains) * driver_cost
    driver_period = d_min // 5
    notes = []
    periods = {}
    for domain in domains:
        allowed = domain.deadline - multiplier * driver_period
        periods[domain.name] = min(domain.packet_period, allowed)
        if allowed < domain.wcet:
            notes.append(f"{domain.name}: the rule leaves a period of {allowed} ns, shorter than its slice")
    slices = {domain.name: domain.wcet for domain in domains}
    worst = {domain.name: multiplier * driver_period + periods[domain.name] for domain in domains}
    return RuleResult(
        rule=rule, driver_slice=driver_slice, driver_period=driver_period, slices=slices, periods=periods,
        worst_case=worst, deadlines={domain.name: domain.deadline for domain in domains},
        rt_core_utilization=float(sum((Fraction(slices[n], max(periods[n], 1)) for n in slices), Fraction(0))),
        driver_core_utilization=driver_slice / max(driver_period, 1), notes=notes)


def _psedf(domains: Sequence[RtDomain], driver_cost: int) -> RuleResult:
    d_min = min(domain.deadline for domain in domains)
    driver_slice = len(domains) * driver_cost
    driver_period = d_min - driver_slice
    ordered = sorted(domains, key=lambda domain: domain.deadline)  # deadline-monotonic, stable for ties
    slices = {domain.name: domain.wcet for domain in domains}
    periods = {domain.name: domain.packet_period for domain in domains}
    worst: dict[str, int] = {}
    for position, domain in enumerate(ordered):
        higher = ordered[:position]
        response = domain.wcet
        while True:
            following = domain.wcet + sum(ceil_div(response, periods[h.name]) * slices[h.name] for h in higher)
            if following == response or following > 1000 * domain.packet_period:
                break
            response = following
        worst[domain.name] = following
    return RuleResult(
        rule="psedf", driver_slice=driver_slice, driver_period=driver_period, slices=slices, periods=periods,
        worst_case=worst, deadlines={domain.name: domain.deadline for domain in domains},
        rt_core_utilization=float(sum((Fraction(slices[n], periods[n]) for n in slices), Fraction(0))),
        driver_core_utilization=driver_slice / max(driver_period, 1))


def derive_rules(domains: Sequence[RtDomain], driver_cost: int) -> dict[str, RuleResult]:
    """Parameters and worst cases of the three rule sets for the same RT domains and packet cost e_N."""
    if not domains:
        raise ValueError("the rules need at least one real-time domain")
    return {
        "sedf": _sedf_family("sedf", domains, driver_cost, 4),
        "sedf-prime": _sedf_family("sedf-prime", domains, driver_cost, 2),
        "psedf": _psedf(domains, driver_cost),
    }
