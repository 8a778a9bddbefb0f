"""Event-at-a-time chain bounds (analysis/phased.py): finite for the shipped ESC models, never below a simulation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import esc_overrides
from hypothesis import event, given, settings
from hypothesis import strategies as st

from rtvirt.analysis.phased import phased_chain_bounds
from rtvirt.analysis.system import analyse_model
from rtvirt.model import load_model
from rtvirt.sim import simulate, task_summary

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


def test_shipped_psedf_esc_chains_get_finite_bounds_above_the_simulated_worst() -> None:
    for name in ("esc-psedf.toml", "esc-paper-psedf.toml"):
        for load in (0.0, 0.9):
            model = load_model(MODELS / name, [("vm.nonrt.load", load), ("simulation.duration", "2s")])
            analysis = analyse_model(model)
            worst = task_summary(simulate(model))["chains"]
            for chain in analysis.chains:
                assert chain.bound is not None, f"{name}: {chain.name} has no bound"
                assert chain.bound >= worst[chain.name]["max_response_ns"]
                assert chain.schedulable  # within the 1.5 ms deadline
            for task in analysis.tasks:
                assert task.method == "phased-chains" and task.wcrt is not None


def test_the_argument_refuses_what_it_does_not_cover() -> None:
    model = load_model(MODELS / "esc-psedf.toml", [("chain.wheel2.offset", "0.1ms")])
    assert phased_chain_bounds(model) == (None, "chains are not synchronous (one period, one offset, no jitter)")
    model = load_model(MODELS / "esc-psedf.toml", [("vm.wheel3.vcpu.0.slice", "0.05ms")])
    result, reason = phased_chain_bounds(model)
    assert result is None and "more than its budget" in reason
    model = load_model(MODELS / "esc-psedf.toml", [("vm.wheel1.load", 0.1)])
    result, reason = phased_chain_bounds(model)
    assert result is None and "runs more than chain stages" in reason


def test_a_model_refused_in_two_places_names_the_same_one_in_every_process() -> None:
    # wheel2 and wheel3 both lack budget; which is named once hung on a set's order, which each process's
    # string hashing chooses
    script = ("import sys; from rtvirt.analysis.phased import phased_chain_bounds; from rtvirt.model import load_model;"
              "model = load_model(sys.argv[1], [('vm.wheel3.vcpu.0.slice', '0.05ms'),"
              " ('vm.wheel2.vcpu.0.slice', '0.05ms')]); print(phased_chain_bounds(model)[1])")
    reasons = {subprocess.run([sys.executable, "-c", script, str(MODELS / "esc-psedf.toml")], capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
               for seed in range(6)}
    assert reasons == {"wheel2.vcpu0 needs 65000 ns per event, more than its budget 50000 ns"}


@settings(max_examples=25, deadline=None)
@given(priorities=st.permutations([1, 2, 3, 4]),
       slices=st.lists(st.integers(70, 200), min_size=4, max_size=4),
       wheel_exec=st.lists(st.tuples(st.integers(10, 60), st.integers(0, 40)), min_size=4, max_size=4),
       driver_exec=st.integers(5, 20), switch=st.integers(0, 3), delay=st.integers(0, 10),
       driver_slice=st.integers(150, 400), driver_period=st.sampled_from([500, 1000, 1250, 1300, 2500]),
       load=st.floats(0, 0.9), seed=st.integers(0, 1000))
def test_bounds_never_below_a_simulation(priorities: list[int], slices: list[int],
                                         wheel_exec: list[tuple[int, int]], driver_exec: int, switch: int,
                                         delay: int, driver_slice: int, driver_period: int, load: float,
                                         seed: int) -> None:
    wheels: list[dict[str, object]] = [{"priority": priority, "slice": f"{slice_}us"}
                                       for priority, slice_ in zip(priorities, slices, strict=True)]
    overrides = esc_overrides(seed, load, switch, delay, (driver_exec, driver_slice, driver_period), wheels,
                              wheel_exec)
    model = load_model(MODELS / "esc-psedf.toml", overrides)
    phased, reason = phased_chain_bounds(model)
    event("applies" if phased is not None else reason.split(":")[0].split(" needs")[0][:40])
    if phased is None:
        return  # the argument does not apply to this draw; the holistic bounds are tested elsewhere
    summary = task_summary(simulate(model))
    for chain, bound in phased.chain_bound.items():
        assert bound >= summary["chains"][chain]["max_response_ns"]
    for stage, bound in phased.stage_bound.items():  # a stage's response counts from its own release
        assert bound >= summary["tasks"][stage]["max_response_ns"]
