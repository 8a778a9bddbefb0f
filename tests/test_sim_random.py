"""Random parts of a model (execution-time distributions, sporadic arrivals, release and source jitter) stay in
their bounds and repeat exactly for a seed."""

from __future__ import annotations

import numpy as np
from simcases import build

from rtvirt.sim import simulate

VMS = [{"name": "vm", "vcpu": [{"affinity": [0]}], "task": [
    {"name": "uni", "period": "10ms", "jitter": "1ms", "priority": 3,
     "execution": {"distribution": "uniform", "min": "0.1ms", "max": "0.5ms"}},
    {"name": "norm", "period": "20ms", "priority": 2,
     "execution": {"distribution": "normal", "mean": "1ms", "stdev": "0.5ms", "min": "0.5ms", "max": "1.2ms"}},
    {"name": "spo", "type": "sporadic", "min_interarrival": "5ms", "max_interarrival": "9ms", "priority": 1,
     "execution": "0.2ms"},
    {"name": "ev", "type": "event", "execution": "0.1ms", "priority": 4}]}]
CHAIN = [{"name": "c", "period": "4ms", "jitter": "0.5ms", "stages": ["vm/ev"]}]


def _run(seed: int):  # type: ignore[no-untyped-def]
    model = build({"scheduler": "partitioned"}, VMS, duration="10s", chain=CHAIN)
    return simulate(model, seed=seed)


def _task(result, name: str) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    j = result.jobs.filter(np.array([t == name for t in result.jobs["task"].to_pylist()]))
    return {c: j[c].to_numpy() for c in ("arrival_ns", "release_ns", "start_ns", "finish_ns")}


def test_draws_stay_in_bounds() -> None:
    result = _run(3)
    uni = _task(result, "vm/uni")
    assert np.all(np.diff(uni["arrival_ns"]) == 10_000_000)  # arrivals stay on the period, jitter is on top
    delay = uni["release_ns"] - uni["arrival_ns"]
    assert delay.min() >= 0 and delay.max() <= 1_000_000 and len(set(delay)) > 100
    run_time = uni["finish_ns"] - uni["start_ns"]  # top priority but "ev": may be preempted by ev only
    assert run_time.min() >= 100_000
    norm = _task(result, "vm/norm")
    spans = norm["finish_ns"] - norm["start_ns"]
    assert spans.min() >= 500_000 and len(set(spans)) > 50
    spo = _task(result, "vm/spo")
    gaps = np.diff(spo["arrival_ns"])
    assert gaps.min() >= 5_000_000 and gaps.max() <= 9_000_000 and len(set(gaps)) > 100
    events = result.chains["arrival_ns"].to_numpy()
    offsets = events - 4_000_000 * np.arange(len(events))
    assert offsets.min() >= 0 and offsets.max() <= 500_000 and len(events) == 2500


def test_same_seed_same_records_other_seed_other_records() -> None:
    a, b, c = _run(11), _run(11), _run(12)
    assert a.jobs.equals(b.jobs) and a.chains.equals(b.chains)
    assert not a.jobs["finish_ns"].equals(c.jobs["finish_ns"])
