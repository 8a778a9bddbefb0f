"""The simulator against scheduling theory on flat (one VM, one CPU) task sets."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from simcases import MS, run

from rtvirt.sim import task_summary

US = 1_000


def response_time_analysis(tasks: list[tuple[int, int]]) -> list[int]:
    """Classic RTA for (period, wcet) sorted by priority, highest first: R = C + sum ceil(R/T_j) C_j."""
    bounds = []
    for i, (_, wcet) in enumerate(tasks):
        r = wcet
        while True:
            nxt = wcet + sum(math.ceil(r / tj) * cj for tj, cj in tasks[:i])
            if nxt == r:
                break
            r = nxt
        bounds.append(r)
    return bounds


def flat(tasks: list[tuple[int, int]], guest: str, duration_ns: int) -> dict[str, list[int]]:
    """Simulate tasks (period, wcet in us) in one VM on a partitioned CPU; responses per task in ns."""
    result = run({"scheduler": "partitioned"}, [{
        "name": "vm", "scheduler": guest, "vcpu": [{"affinity": [0]}],
        "task": [{"name": f"t{i}", "period": f"{p}us", "execution": f"{c}us", "priority": len(tasks) - i}
                 for i, (p, c) in enumerate(tasks)]}], duration=f"{duration_ns}ns")
    out: dict[str, list[int]] = {}
    for task, response in zip(result.jobs["task"].to_pylist(), result.jobs["response_ns"].to_pylist(), strict=True):
        out.setdefault(task, []).append(response)
    misses = result.jobs.num_rows - sum(result.jobs["met"].to_pylist())
    out["misses"] = [misses]
    return out


task_sets = st.lists(
    st.tuples(st.sampled_from([1000, 2000, 2500, 4000, 5000, 10000, 20000]), st.integers(1, 100)),
    min_size=1, max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(task_sets)
def test_fixed_priority_synchronous_release_gives_the_rta_value(raw: list[tuple[int, int]]) -> None:
    # rate-monotonic order; execution as a share of the period, scaled to keep the total utilisation < 1
    tasks = sorted(((p, max(1, p * c // 100 // len(raw))) for p, c in raw), key=lambda t: t[0])
    bounds = response_time_analysis(tasks)
    responses = flat(tasks, "fp", 40_000 * US)
    for i, (period, _) in enumerate(tasks):
        if bounds[i] <= period:  # schedulable: the first job (critical instant) is the worst case
            assert responses[f"vm/t{i}"][0] == bounds[i] * US
            assert max(responses[f"vm/t{i}"]) == bounds[i] * US


@settings(max_examples=40, deadline=None)
@given(task_sets)
def test_edf_at_utilisation_up_to_one_misses_nothing(raw: list[tuple[int, int]]) -> None:
    total = sum(c / 100 for _, c in raw)
    tasks = [(p, max(1, math.floor(p * (c / 100) / max(1.0, total)))) for p, c in raw]
    assert sum(c / p for p, c in tasks) <= 1.0
    assert flat(tasks, "edf", 40_000 * US)["misses"] == [0]


def test_overload_reports_misses_and_stops_at_the_duration() -> None:
    # utilisation 1.5 under fixed priority: t1 gets 0.8 ms of every 2 ms but needs 1.8 ms, so its backlog grows;
    # the run still ends at 1 s, and jobs left unfinished past their deadline count as misses.
    result = run({"scheduler": "partitioned"}, [{
        "name": "vm", "vcpu": [{"affinity": [0]}],
        "task": [{"name": "t0", "period": "1ms", "execution": "0.6ms", "priority": 2},
                 {"name": "t1", "period": "2ms", "execution": "1.8ms", "priority": 1}]}], duration="1s")
    summary = task_summary(result)
    assert result.end_reason == "complete" and result.end_time_ns == 1_000 * MS
    assert summary["tasks"]["vm/t0"] == {"jobs": 1000, "mean_response_ns": 600_000.0, "max_response_ns": 600_000,
                                         "misses": 0, "unfinished": 0}
    t1 = summary["tasks"]["vm/t1"]
    # 1000 ms * 0.4 of the CPU / 1.8 ms per job = 222 jobs done (every one late: the first ends at 4.8 ms);
    # the other 278 are still queued, all overdue but the one released at 998 ms (deadline = the end).
    assert (t1["jobs"], t1["unfinished"]) == (222, 278)
    assert t1["misses"] == 222 + 277
