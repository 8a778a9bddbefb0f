"""Flat fixed-priority (RM) and EDF task sets give exactly SimSo 0.8.5's job completion times.

SimSo runs in its own virtual environment (.cache/simso-venv, SimPy 2.3.1), created here on first use; if it
cannot be created the tests fail with pip's output (they are not skipped)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from simcases import run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from simso_env import ensure_simso, run_simso  # noqa: E402

TICK_NS = 15_625  # 1/64 ms: exact in SimSo's float milliseconds and in our integer nanoseconds
DURATION_MS = 300


@pytest.fixture(scope="session")
def simso_python() -> Path:
    try:
        return ensure_simso()
    except RuntimeError as exc:
        pytest.fail(f"SimSo 0.8.5 could not be installed: {exc}")


def random_task_set(rng: random.Random, utilisation: float) -> list[tuple[int, int, int]]:
    """(period, wcet, offset) in ticks; distinct periods (RM order is unambiguous) and distinct sub-ms offsets
    (no two jobs of different tasks ever share a deadline, so EDF's tie-breaking cannot differ)."""
    n = rng.randint(2, 8)
    periods = rng.sample([2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 40, 50], n)
    shares = [rng.random() for _ in range(n)]
    tasks = []
    for i, (period_ms, share) in enumerate(zip(periods, shares, strict=True)):
        period = period_ms * 64
        wcet = max(1, int(period * utilisation * share / sum(shares)))
        tasks.append((period, wcet, i + 1))
    return tasks


def ours(tasks: list[tuple[int, int, int]], guest: str) -> list[tuple[int, int, int]]:
    by_rate = sorted(range(len(tasks)), key=lambda i: tasks[i][0])
    priority = {i: len(tasks) - rank for rank, i in enumerate(by_rate)}
    result = run({"scheduler": "partitioned"}, [{
        "name": "vm", "scheduler": guest, "vcpu": [{"affinity": [0]}],
        "task": [{"name": f"t{i}", "period": f"{p * TICK_NS}ns", "execution": f"{c * TICK_NS}ns",
                  "offset": f"{o * TICK_NS}ns", "priority": priority[i]} for i, (p, c, o) in enumerate(tasks)]}],
        duration=f"{DURATION_MS}ms")
    names = result.jobs["task"].to_pylist()
    return sorted((int(n.removeprefix("vm/t")), a, f) for n, a, f in zip(
        names, result.jobs["arrival_ns"].to_pylist(), result.jobs["finish_ns"].to_pylist(), strict=True))


def theirs(tasks: list[tuple[int, int, int]], scheduler: str) -> list[tuple[int, int, int]]:
    spec = {"scheduler": scheduler, "duration_ms": DURATION_MS,
            "tasks": [[p / 64, c / 64, o / 64] for p, c, o in tasks]}
    jobs = run_simso(spec)["jobs"]
    return sorted((i, a, f) for i, a, f in jobs if f < DURATION_MS * 1_000_000)


@pytest.mark.parametrize(("guest", "scheduler", "utilisation"), [("fp", "RM", 0.69), ("edf", "EDF", 0.97)])
def test_same_job_completions_as_simso(simso_python: Path, guest: str, scheduler: str, utilisation: float) -> None:
    rng = random.Random(f"simso-{guest}")
    for _ in range(4):
        tasks = random_task_set(rng, utilisation)
        expected = theirs(tasks, scheduler)
        got = [job for job in ours(tasks, guest) if job[2] < DURATION_MS * 1_000_000]
        assert len(expected) > 20
        assert got == expected, f"task set {tasks}"
