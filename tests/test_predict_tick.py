"""Predictions that model the measured kernel's enforcement tick: HZ and HRTICK_DL from the system audit, the
tick's phase in a SCHED_DEADLINE reservation's period read from its holes, overruns and paid-back periods in the
model, against this kernel's own reservation (docs/predictions.md)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from conftest import run_cli
from simcases import build

from rtvirt.predict import PredictSpec
from rtvirt.predict.derive import derive_model
from rtvirt.predict.tick import EnforcementTick, MeasuredPhase, enforcement_tick, tick_phase
from rtvirt.scenario.loader import parse_scenario
from rtvirt.sim import simulate
from rtvirt.sysaudit import audit_system

LAST_CPU = max(os.sched_getaffinity(0))


def _jiffies() -> tuple[int, float]:
    text = Path("/proc/timer_list").read_text()
    found = re.search(r"^jiffies: (\d+)$", text, re.M)
    assert found, "no jiffies in /proc/timer_list"
    return int(found.group(1)), time.monotonic()


@pytest.mark.skipif(os.geteuid() != 0, reason="/proc/timer_list needs root")
def test_the_audit_reads_the_tick_the_kernel_counts() -> None:
    tick = audit_system()["scheduler_tick"]
    # HZ from the kernel's build configuration, checked against the jiffies it counts over half a second
    first, at = _jiffies()
    time.sleep(0.5)
    last, until = _jiffies()
    assert tick["hz"] == pytest.approx((last - first) / (until - at), rel=0.1)
    assert tick["hz_source"] in ("/proc/config.gz", f"/boot/config-{os.uname().release}")
    # this kernel's sched/features cannot be read (debugfs is locked here): the kernel's default, said so
    assert tick["hrtick_dl"] is False and tick["hrtick_dl_source"]


def test_enforcement_tick_from_the_audit_only_where_budgets_wait_for_it() -> None:
    assert enforcement_tick({"scheduler_tick": {"hz": 250, "hrtick_dl": False}}) == EnforcementTick(4_000_000, 250)
    assert enforcement_tick({"scheduler_tick": {"hz": 1000, "hrtick_dl": False}}).tick_ns == 1_000_000  # type: ignore[union-attr]
    assert enforcement_tick({"scheduler_tick": {"hz": 250, "hrtick_dl": True}}) is None  # high-resolution: exact
    assert enforcement_tick({"scheduler_tick": {"hz": None, "hrtick_dl": False}}) is None
    assert enforcement_tick({}) is None and enforcement_tick(None) is None


@pytest.mark.parametrize("phase_ms", [0.3, 2.1, 3.7])
def test_the_tick_phase_is_read_back_from_a_reservations_holes(phase_ms: float) -> None:
    model = build({"scheduler": "deadline", "enforcement": {"tick": "4ms", "phase": f"{phase_ms}ms"}},
                  [{"name": "g", "vcpu": [{"runtime": "3ms", "period": "10ms"}], "gap": {"threshold": "10us"}}],
                  duration="2s")
    gaps = simulate(model).gaps
    offset = 1_234_567_890_123  # a measurement's clock starts anywhere
    starts = [start + offset for start in gaps["start_ns"].to_pylist()]
    measured = tick_phase(starts, gaps["gap_ns"].to_pylist(), 4_000_000, 10_000_000, min_hole_ns=3_500_000,
                          runtime_ns=3_000_000)
    assert measured is not None and measured.lattice_share == 1
    assert measured.phase_ns == pytest.approx(phase_ms * 1e6, abs=1_000)
    assert measured.resume_jitter_ns == 0 and set(measured.resume_latencies_ns) == {0}  # the model resumes on time
    assert measured.unseen_charge_ns == pytest.approx(0, abs=5_000)  # and is charged what it is seen running
    # a reservation whose periods restarted elsewhere after 2 s (it fell behind), the ticks where they were: the
    # phase of the periods most holes ended on
    later = simulate(build({"scheduler": "deadline", "enforcement": {"tick": "4ms", "phase": "1.5ms"}},
                           [{"name": "g", "vcpu": [{"runtime": "3ms", "period": "10ms"}],
                             "gap": {"threshold": "10us"}}], duration="1s")).gaps
    restart = 2_004_000_000 + round(phase_ms * 1e6) - 1_500_000  # its ticks on the first part's, its periods 2-7 ms off
    both_starts = starts + [offset + restart + start for start in later["start_ns"].to_pylist()]
    restarted = tick_phase(both_starts, gaps["gap_ns"].to_pylist() + later["gap_ns"].to_pylist(), 4_000_000,
                           10_000_000, min_hole_ns=3_500_000)
    assert restarted is not None and 0.6 <= restarted.lattice_share <= 0.8, restarted
    assert restarted.phase_ns == pytest.approx(phase_ms * 1e6, abs=1_000)
    # holes that do not line up with a tick (an outer hypervisor's, say) give no phase
    assert tick_phase([offset + 7_777 * k * k for k in range(50)], [5_000_000] * 50, 4_000_000, 10_000_000,
                      min_hole_ns=3_500_000) is None


def test_the_resumptions_spread_is_read_back_and_keeps_the_phase() -> None:
    """A replenished reservation resumes after a wake-up latency that varies (here 40 us); the estimate takes the
    period's start at the earliest usual resumption and the spread to the latest, and the phase stays where the
    ticks are."""
    model = build({"scheduler": "deadline", "enforcement": {"tick": "4ms", "phase": "2.6ms",
                                                             "resume_jitter": "40us"}},
                  [{"name": "g", "vcpu": [{"runtime": "3ms", "period": "10ms"}], "gap": {"threshold": "10us"}}],
                  duration="4s")
    gaps = simulate(model).gaps
    measured = tick_phase(gaps["start_ns"].to_pylist(), gaps["gap_ns"].to_pylist(), 4_000_000, 10_000_000,
                          min_hole_ns=3_500_000)
    assert measured is not None
    assert measured.phase_ns == pytest.approx(2_600_000, abs=5_000)
    assert measured.resume_jitter_ns == pytest.approx(36_000, abs=6_000)


def _holes(phase_us: int, latencies_us: list[int], seed: int = 1) -> tuple[list[int], list[int]]:
    """(starts, lengths) of a 3 ms / 10 ms reservation's holes over 4 s, ticks ``phase_us`` after its periods'
    starts, resuming after one of ``latencies_us``."""
    model = build({"scheduler": "deadline", "enforcement": {"tick": "4ms", "phase": f"{phase_us}us",
                                                             "resume_latencies": [f"{x}us" for x in latencies_us]}},
                  [{"name": "g", "vcpu": [{"runtime": "3ms", "period": "10ms"}], "gap": {"threshold": "20us"}}],
                  duration="4s", simulation={"seed": seed})
    gaps = simulate(model).gaps
    return gaps["start_ns"].to_pylist(), gaps["gap_ns"].to_pylist()


def _long_hole_rate(lengths: list[int]) -> float:
    return sum(length >= 3_500_000 for length in lengths) / 4


# the kernel here: resumes a few us after the replenishment, one time in ten about 110 us later
KERNEL_LATENCIES_US = [0] * 6 + [2] * 6 + [4] * 6 + [6] * 4 + [8] * 3 + [110] * 3


@pytest.mark.parametrize("phase_us", [1_200, 2_100, 2_780, 3_700])
def test_the_runtime_charged_unseen_is_read_back_from_the_runtime_balance(phase_us: int) -> None:
    """The kernel charges a reservation from when it picks its task, before the probe runs again, to the
    throttling tick's handling, after the probe's last timestamp: 20-30 us a resumption here that no hole shows.
    A model charged 25 us more than its probe sees (its ticks 25 us later, its holes seen 25 us earlier) gives
    that charge back from the holes alone, and the measured resumptions as the latencies it draws from."""
    starts, lengths = _holes(phase_us + 25, KERNEL_LATENCIES_US)
    seen_starts, seen_lengths = [s - 25_000 for s in starts], [length + 25_000 for length in lengths]
    measured = tick_phase(seen_starts, seen_lengths, 4_000_000, 10_000_000, min_hole_ns=3_500_000,
                          runtime_ns=3_000_000)
    assert measured is not None
    assert measured.phase_ns == pytest.approx(phase_us * 1_000, abs=2_000)
    assert measured.unseen_charge_ns == pytest.approx(25_000, abs=4_000)
    latencies = measured.resume_latencies_ns
    assert len(latencies) == 40 and latencies == tuple(sorted(latencies))
    assert max(latencies[:30]) <= 10_000 and latencies[-1] == pytest.approx(110_000, abs=5_000)


def test_near_a_phase_where_the_runtime_runs_out_at_a_tick_tens_of_us_change_the_rate() -> None:
    """Issue 39's failed run: ticks 2.78 ms after the period's start, where three first-tick and two second-tick
    throttles (3 x 2.78 + 2 x 4.78 ms) nearly use the 18 ms five periods give, so the small surplus decides how
    often another pattern of holes comes in. The run measured 81.5 holes/s; the model resuming anywhere in the
    spread of the resumptions (the late ones counted as often as the usual ones) said 70.8/s; charged only what
    the probe sees, 74/s; the kernel's own resumptions and its unseen charge, 81/s."""
    spread = _long_hole_rate(_holes(2_782, list(range(0, 118, 3)))[1])
    seen_only = _long_hole_rate(_holes(2_782, KERNEL_LATENCIES_US)[1])
    charged = [_long_hole_rate(_holes(2_782 + 24, KERNEL_LATENCIES_US, seed)[1]) for seed in (1, 2, 3)]
    assert all(rate == pytest.approx(81.5, rel=0.05) for rate in charged), charged
    assert spread < 0.9 * 81.5 and seen_only < 0.96 * 81.5, (spread, seen_only)


def test_a_deadline_reservation_is_derived_with_the_kernels_tick_and_phase() -> None:
    scenario = parse_scenario('name = "t"\nduration = "1s"\n[workload]\nprobe = "gap"\n[[environments]]\n'
                              'kind = "partition"\ncpus = "1"\n'
                              'sched = { policy = "deadline", runtime = "3ms", period = "10ms" }\n[predict]\n')
    tick = EnforcementTick(4_000_000, 250, MeasuredPhase(2_100_000, 30_000, 1.0, (0, 4_000, 30_000), 20_000),
                           phase_from="measured in run-x")
    derived = derive_model(scenario.environments[0], scenario.probe_workloads()[0], [], 1_000_000_000,
                           PredictSpec.model_validate({}), tick=tick)
    enforcement = derived.model.hypervisor.enforcement
    # the model's ticks where the kernel's accounting sees them: 20 us of runtime charged unseen later
    assert (enforcement.tick, enforcement.phase) == (4_000_000, 2_120_000)
    assert enforcement.resume_latencies == [0, 4_000, 30_000] and enforcement.resume_jitter == 0
    assert any("4 ms scheduler tick (HZ 250" in line and "2.100 ms" in line and "20 us of runtime charged" in line
               and "run-x" in line for line in derived.mapping), derived.mapping
    exact = derive_model(scenario.environments[0], scenario.probe_workloads()[0], [], 1_000_000_000,
                         PredictSpec.model_validate({}))
    assert exact.model.hypervisor.enforcement.tick == 0 and any("exactly" in n for n in exact.notes)


def test_a_bad_enforcement_value_exits_2_naming_the_field(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text('name = "bad"\nduration = "1s"\n[[environments]]\nkind = "host"\n[predict]\n'
                        'enforcement = "tick"\n')
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and "predict.enforcement" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups and SCHED_DEADLINE need root")
@pytest.mark.quiet  # an exclusive cpuset and the measured CPU's holes: other tests' work must not move it
def test_a_pinned_deadline_reservation_is_predicted_with_its_tick(tmp_path: Path) -> None:
    """Issue 39: a pinned SCHED_DEADLINE 3 ms / 10 ms partition, enforced at this kernel's 4 ms tick: the model
    without the tick predicted 7 ms holes at 100/s where the kernel gave 61.5/s with a 13.65 ms median in one run
    and a 6.68 ms median in another. With the tick at its measured phase, rate and median agree within 15 %, in
    each of two runs (each starts its reservation at another phase; near some phases tens of microseconds of
    wake-up latency and unseen charge decide the rate: one CI run measured 80/s where the model said 98/s)."""
    scenario = tmp_path / "dl.toml"
    scenario.write_text(
        'name = "dl-tick"\nduration = "4s"\n[workload]\nprobe = "gap"\nparams = { threshold = "20us" }\n'
        f'[[environments]]\nkind = "partition"\nname = "dl"\ncpus = "{LAST_CPU}"\n'
        'sched = { policy = "deadline", runtime = "3ms", period = "10ms" }\n[predict]\n')
    for attempt in range(2):
        (tmp_path / f"run{attempt}").mkdir()
        _check_pinned_prediction(scenario, tmp_path / f"run{attempt}")


def _check_pinned_prediction(scenario: Path, where: Path) -> None:
    results = where / "results"
    run_cli("run", str(scenario), "--out", str(results), "--no-report", timeout=300, check=True)
    report = where / "report.json"
    run_cli("report", str(results), "--format", "json", "--out", str(report), check=True)
    prediction = json.loads(report.read_text())["predictions"][0]
    assert any("4 ms scheduler tick" in line and "measured in" in line for line in prediction["mapping"]), \
        prediction["mapping"]
    simulated, measured = prediction["simulated"], prediction["measured"]
    assert measured["share"] == pytest.approx(simulated["share"], rel=0.15)  # the time in holes, whatever the phase
    seeded = simulated["long_gap_rates_by_seed"]  # (the model draws each resumption's latency: five seeds)
    assert len(seeded) == 5 and simulated["long_gap_rate_per_s"] == seeded[0], seeded
    if max(seeded) > 1.1 * min(seeded):
        # ticks among the resumptions: which pattern of holes 4 s mostly see is chance, in the model as in the
        # kernel, and the report says so; the run lies within the model's own spread (and 15 %)
        assert any("depends on chance" in finding for finding in prediction["findings"]), prediction["findings"]
        assert 0.85 * min(seeded) <= measured["long_gap_rate_per_s"] <= 1.15 * max(seeded), (seeded, measured)
        return
    assert measured["long_gap_rate_per_s"] == pytest.approx(simulated["long_gap_rate_per_s"], rel=0.15)
    if simulated["long_gap_median_stable"] and measured["long_gap_median_stable"]:
        assert measured["long_gap_median_ns"] == pytest.approx(simulated["long_gap_median_ns"], rel=0.15)
    else:  # holes of two lengths in about equal numbers: the median jumps between them, the report says so
        assert any("not stable" in finding for finding in prediction["findings"]), prediction["findings"]
        assert measured["long_gap_mean_ns"] == pytest.approx(simulated["long_gap_mean_ns"], rel=0.15)


@pytest.mark.parametrize("runtime_ms", [3, 1])
def test_the_analysed_bound_holds_for_every_tick_phase(runtime_ms: int) -> None:
    """With an enforcement tick the longest hole grows past the exact server's P + D - 2Q (14 ms for 3 ms / 10
    ms): the analysis's bound takes the overrun in, and no phase of the tick makes the model exceed it."""
    from rtvirt.analysis.system import analyse_model
    from rtvirt.predict.campaign import bound_of

    longest = 0
    for step in range(16):
        model = build({"scheduler": "deadline", "enforcement": {"tick": "4ms", "phase": f"{step * 0.25}ms"}},
                      [{"name": "g", "vcpu": [{"runtime": f"{runtime_ms}ms", "period": "10ms"}],
                        "gap": {"threshold": "10us"}}], duration="1s")
        bound, _ = bound_of(model, analyse_model(model), "gap:g.0")
        assert bound is not None
        holes = simulate(model).gaps["gap_ns"].to_pylist()
        assert max(holes) <= bound, (step, max(holes), bound)
        longest = max(longest, max(holes))
    assert longest > 10_000_000 + 10_000_000 - 2 * runtime_ms * 1_000_000  # past the exact server's blackout


def test_where_the_model_depends_on_chance_the_report_gives_its_spread_over_seeds(tmp_path: Path) -> None:
    """The helper's scan of the tick phase found windows (ticks within the resumptions' spread of a period's start)
    where the seeds of one model disagree by more than 15 % over 4 s: there a single run cannot be predicted, and
    the report says so with the range. Elsewhere the seeds agree and no such finding is made."""
    from rtvirt.predict.campaign import predict_configuration
    from rtvirt.predict.compare import predictions
    from rtvirt.predict.derive import Derived
    from rtvirt.store import list_runs

    spreads = {}
    for phase_us in (20, 2_782):
        model = build({"scheduler": "deadline", "enforcement": {
            "tick": "4ms", "phase": f"{phase_us}us", "resume_latencies": [f"{x}us" for x in KERNEL_LATENCIES_US]}},
            [{"name": "g", "vcpu": [{"runtime": "3ms", "period": "10ms"}], "gap": {"threshold": "20us"}}],
            duration="4s")
        results = tmp_path / f"phase-{phase_us}"
        predict_configuration(Derived(model, "gap:g.0", "gap", [], []), results, "dl / solo")
        (row,) = predictions(list_runs(results))
        seeded = row.simulated.long_gap_rates_by_seed
        assert seeded is not None and len(seeded) == 5 and seeded[0] == row.simulated.long_gap_rate, seeded
        chance = [finding for finding in row.findings if "depends on chance" in finding]
        assert bool(chance) == (max(seeded) > 1.1 * min(seeded)), (seeded, row.findings)
        spreads[phase_us] = max(seeded) / min(seeded)
    # ticks 20 us after the periods' starts: 55 to 92 holes/s by seed; at issue 39's run's phase they agree
    assert spreads[20] > 1.3 and spreads[2_782] < 1.05, spreads
