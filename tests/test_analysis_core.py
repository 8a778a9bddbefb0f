"""Analysis math on textbook task sets and hand-checked supply bound functions."""

from __future__ import annotations

import math

import pytest

from rtvirt.analysis.automotive import RtDomain, derive_rules
from rtvirt.analysis.edf import dbf, edf_demand_test, edf_response_times
from rtvirt.analysis.fp import fp_analysis, fp_response_time
from rtvirt.analysis.supply import (
    Dedicated,
    DelayedSupply,
    ExplicitDeadlinePeriodic,
    LeftoverSupply,
    PeriodicResource,
    WindowSupply,
)
from rtvirt.analysis.taskset import Task
from rtvirt.analysis.utilization import liu_layland_bound, utilization_tests

MS = 1_000_000
US = 1_000


def test_burns_wellings_response_times() -> None:
    # Burns & Wellings, "Real-Time Systems and Programming Languages", response-time analysis example:
    # a (T=7, C=3), b (T=12, C=3), c (T=20, C=5), rate-monotonic: R = 3, 6, 20.
    tasks = [Task("a", 3, 7, 7, priority=3), Task("b", 3, 12, 12, priority=2), Task("c", 5, 20, 20, priority=1)]
    assert [bound.wcrt for bound in fp_analysis(tasks)] == [3, 6, 20]
    assert all(bound.schedulable for bound in fp_analysis(tasks))
    assert [bound.slack for bound in fp_analysis(tasks)] == [4, 6, 0]


def test_three_task_rate_monotonic_example() -> None:
    # C = 1, 2, 3 and T = D = 4, 6, 10 (U = 0.883 > the Liu & Layland bound 0.780): RTA still proves it, R3 = 10.
    tasks = [Task("t1", 1, 4, 4, priority=3), Task("t2", 2, 6, 6, priority=2), Task("t3", 3, 10, 10, priority=1)]
    assert [b.wcrt for b in fp_analysis(tasks)] == [1, 3, 10]
    verdict = utilization_tests(tasks)
    assert not verdict.rm_liu_layland and not verdict.rm_hyperbolic and verdict.edf_implicit


def test_jitter_and_blocking_terms() -> None:
    # hp: C=2, T=10, J=3. Analysed: C=3, B=1: w = 1 + 3 + ceil((w+3)/10)*2 -> w = 6; R = w + J_i(=2) = 8.
    high = Task("h", 2, 10, 10, jitter=3, priority=2)
    low = Task("l", 3, 20, 20, jitter=2, blocking=1, priority=1)
    assert fp_response_time(low, [high]).wcrt == 8
    # the jitter pushes a second hp release into the window once w + 3 > 10: C=8 -> w = 1+8+2*2 = 13, R = 15.
    longer = Task("l", 8, 20, 20, jitter=2, blocking=1, priority=1)
    assert fp_response_time(longer, [high]).wcrt == 15


def test_arbitrary_deadline_busy_window_counts_later_jobs() -> None:
    # Deadline beyond the period (Lehoczky 1990; Tindell, Burns & Wellings 1994): hp C=26, T=70; lp C=62,
    # T=100, D=150 (U = 0.991). Hand iteration of w_q = (q+1)·62 + ⌈w_q/70⌉·26, R_q = w_q − 100q:
    # q: 0 -> 114, 1 -> 202 (102), 2 -> 316 (116), 3 -> 404 (104), 4 -> 518 (118), 5 -> 606 (106),
    # 6 -> 694 (94) and 694 <= 700 closes the busy window. The worst job is the fifth, not the first.
    high = Task("h", 26, 70, 70, priority=2)
    low = Task("l", 62, 100, 150, priority=1)
    assert fp_response_time(low, [high]).wcrt == 118
    assert fp_response_time(low, [high]).schedulable


def test_liu_layland_bounds() -> None:
    assert liu_layland_bound(1) == 1.0
    assert liu_layland_bound(2) == pytest.approx(0.8284, abs=1e-4)
    assert liu_layland_bound(3) == pytest.approx(0.7798, abs=1e-4)
    assert liu_layland_bound(10_000) == pytest.approx(math.log(2), abs=1e-4)
    # Hyperbolic bound accepts (1/2, 1/3): (1.5)(4/3) = 2, though U = 0.833 > 0.828.
    tasks = [Task("a", 1, 2, 2), Task("b", 1, 3, 3)]
    verdict = utilization_tests(tasks)
    assert verdict.rm_hyperbolic and not verdict.rm_liu_layland


def test_dbf_and_edf_demand_test() -> None:
    tasks = [Task("a", 2, 5, 4), Task("b", 3, 10, 7)]
    assert [dbf(tasks, t) for t in (3, 4, 7, 9, 14, 17)] == [0, 2, 5, 7, 9, 12]
    assert edf_demand_test(tasks).schedulable
    # Tighten b's deadline to 4: dbf(4) = 5 > 4.
    tight = [Task("a", 2, 5, 4), Task("b", 3, 10, 4)]
    verdict = edf_demand_test(tight)
    assert not verdict.schedulable and verdict.worst_point == 4 and verdict.excess == 1


def test_edf_response_times_against_hand_schedule() -> None:
    # Synchronous EDF schedule of a (3,7), b (3,12), c (5,20), hand-drawn: b's 2nd job (released 12) waits for
    # a's job released at 14 (deadline 21 < 24) and finishes at 20: response 8; a never waits: 3.
    tasks = [Task("a", 3, 7, 7), Task("b", 3, 12, 12), Task("c", 5, 20, 20)]
    bounds = [b.wcrt for b in edf_response_times(tasks)]
    assert bounds[0] == 3 and bounds[1] == 8
    assert 14 <= bounds[2] <= 20  # c finishes at 14 in the synchronous schedule; Spuri may find a worse arrival


def test_periodic_resource_sbf_points() -> None:
    # Shin & Lee: blackout 2(Π − Θ) = 12 for Γ(10, 4), then Θ per Π.
    supply = PeriodicResource(10, 4)
    assert [supply.sbf(t) for t in (0, 12, 13, 16, 17, 22, 23, 26, 36)] == [0, 0, 1, 4, 4, 4, 5, 8, 12]
    assert [supply.time_for(w) for w in (0, 1, 4, 5, 8)] == [0, 13, 16, 23, 26]
    assert supply.rate == pytest.approx(0.4) and supply.delay == 12


def test_edp_sbf_points() -> None:
    # Easwaran et al.: Ω(Π=10, Θ=3, Δ=5): blackout Π + Δ − 2Θ = 9.
    supply = ExplicitDeadlinePeriodic(10, 3, 5)
    assert [supply.sbf(t) for t in (9, 10, 12, 13, 19, 20, 22)] == [0, 1, 3, 3, 3, 4, 6]
    assert supply.blackout == 9
    assert ExplicitDeadlinePeriodic(10, 3, 10).sbf(17) == PeriodicResource(10, 3).sbf(17)
    with pytest.raises(ValueError):
        ExplicitDeadlinePeriodic(10, 6, 5)


def test_window_supply_is_the_minimum_over_start_points() -> None:
    frame, windows = 10, ((0, 2), (5, 7))
    supply = WindowSupply(frame, windows)

    def brute(t: int) -> int:
        def served(s: int) -> int:
            return sum(1 for x in range(s, s + t) if any(a <= x % frame < b for a, b in windows))
        return min(served(s) for s in range(frame))

    assert [supply.sbf(t) for t in range(25)] == [brute(t) for t in range(25)]
    for work in range(1, 9):
        assert supply.sbf(supply.time_for(work)) >= work > supply.sbf(supply.time_for(work) - 1)
    assert supply.rate == pytest.approx(0.4)
    assert all(supply.sbf(t) >= supply.rate * (t - supply.delay) for t in range(60))


def test_leftover_and_delayed_supplies() -> None:
    higher = (Task("h", 2, 5, 5),)
    leftover = LeftoverSupply(higher)
    assert leftover.time_for(4) == 8  # RTA: 4 + 2*ceil(8/5) = 8
    assert [leftover.sbf(t) for t in (2, 3, 5, 7, 8)] == [0, 1, 3, 3, 4]
    delayed = DelayedSupply(PeriodicResource(10, 4), 3)
    assert delayed.sbf(16) == 1 and delayed.time_for(1) == 16


def test_fp_under_periodic_resource() -> None:
    # One task C=2 alone on Γ(10, 4): worst start right after a budget -> 12 + 2 = 14.
    supply = PeriodicResource(10, 4)
    assert fp_response_time(Task("t", 2, 20, 20), [], supply).wcrt == 14
    assert not fp_response_time(Task("t", 2, 20, 13), [], supply).schedulable
    # Two tasks on the same supply: hp C=1 T=20; lp C=4: demand 5 -> time_for(5) = 12 + 10 + 1 = 23, which
    # lets hp release again (⌈23/20⌉ = 2): demand 6 -> 12 + 10 + 2 = 24, stable.
    bounds = fp_analysis([Task("h", 1, 20, 20, priority=2), Task("l", 4, 40, 40, priority=1)], supply)
    assert [b.wcrt for b in bounds] == [13, 24]
    # A load above the supply rate has no bound at all (and says so).
    overload = fp_response_time(Task("x", 5, 10, 10), [], supply)
    assert overload.wcrt is None and "supply rate" in overload.reason


def test_edf_under_periodic_resource() -> None:
    supply = PeriodicResource(10, 4)
    tasks = [Task("a", 2, 20, 20), Task("b", 2, 40, 30)]
    assert edf_demand_test(tasks, supply).schedulable  # dbf(20)=2 <= sbf 4, dbf(30) = 4 <= 8 ...
    assert not edf_demand_test([Task("a", 2, 20, 13)], supply).schedulable  # sbf(13) = 1
    bounds = edf_response_times(tasks, supply)
    assert all(b.wcrt is not None and b.wcrt <= b.task.deadline for b in bounds)
    assert bounds[0].wcrt >= 14  # never better than the lone task's 14


def test_dedicated_supply_reproduces_plain_analysis() -> None:
    tasks = [Task("a", 3, 7, 7, priority=3), Task("b", 3, 12, 12, priority=2)]
    assert [b.wcrt for b in fp_analysis(tasks, Dedicated())] == [b.wcrt for b in fp_analysis(tasks)]


def test_esc_case_study_rules() -> None:
    # Domain brief section 4: 4 RT domains, packets every 2.5 ms, deadline 1.5 ms, e_i = 0.06 ms, e_N = 0.02 ms.
    domains = [RtDomain(f"wheel{i}", 60 * US, 1500 * US, 2500 * US) for i in range(1, 5)]
    rules = derive_rules(domains, 20 * US)
    sedf, prime, psedf = rules["sedf"], rules["sedf-prime"], rules["psedf"]
    # SEDF: s_N = k e_N = 80 us, p_N = d_min/5 = 300 us, p_i = d_i - 4 p_N = 300 us, worst 4 p_N + p_i = 1.5 ms.
    assert (sedf.driver_slice, sedf.driver_period) == (80 * US, 300 * US)
    assert set(sedf.periods.values()) == {300 * US} and set(sedf.slices.values()) == {60 * US}
    assert set(sedf.worst_case.values()) == {1500 * US}
    assert sedf.rt_core_utilization == pytest.approx(0.8)
    # SEDF': p_i = d_i - 2 p_N = 900 us, utilisation 4 * 60/900.
    assert set(prime.periods.values()) == {900 * US}
    assert prime.rt_core_utilization == pytest.approx(4 * 60 / 900)
    # PSEDF: p_N = d_min - s_N = 1.42 ms, p_i = 2.5 ms; r_i = 60, 120, 180, 240 us by deadline-monotonic order.
    assert (psedf.driver_slice, psedf.driver_period) == (80 * US, 1420 * US)
    assert sorted(psedf.worst_case.values()) == [60 * US, 120 * US, 180 * US, 240 * US]
    assert all(r.meets_every_deadline for r in rules.values())
    # Non-RT load the RT core still guarantees: SEDF 20 %, SEDF' 73 %, PSEDF 90 % (the brief's 0-90 % sweep).
    assert [round(r.nonrt_load_room, 3) for r in (sedf, prime, psedf)] == [0.2, 0.733, 0.904]
    # A tighter deadline breaks SEDF first: d = 0.4 ms leaves p_i = 0.4 - 4 * 0.08 = 80 us for 60 us slices.
    tight = derive_rules([RtDomain(f"w{i}", 60 * US, 400 * US, 2500 * US) for i in range(4)], 20 * US)
    assert not tight["sedf"].meets_every_deadline
    assert tight["psedf"].meets_every_deadline
