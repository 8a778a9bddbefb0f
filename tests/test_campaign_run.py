"""Campaigns end to end: the default main job, direction checks, kill -9 and --resume without strays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RAN, assert_ran, children_of, run_cli, samples_so_far

from rtvirt.campaign import CampaignState, run_campaign
from rtvirt.environments import ENVIRONMENTS
from rtvirt.environments.host import HostEnvironment
from rtvirt.errors import RunError
from rtvirt.explain.outer import cpu_steal_ns
from rtvirt.scenario import parse_scenario
from rtvirt.stats import quantile
from rtvirt.store import load_run

LAST_CPU = max(os.sched_getaffinity(0))
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2

# a run that ended: complete, or short where a loaded machine's timer missed periods (counted, so accounted for)
FINISHED = ("complete", "short")
KILL_AFTER_SAMPLES = 200  # the disturbed run's samples on disk before the test kills the campaign

HOST_SCENARIO = """\
name = "directions"
duration = "{duration}"
repetitions = {repetitions}
run_timeout = "60s"

[workload]
probe = "timer"
params = {{ interval = "1ms" }}  # the interferer's 1 ms slice delays a wake-up, it does not skip a period

[[environments]]
kind = "host"

[[disturbances]]
name = "solo"

[[disturbances]]
name = "same-core"
[[disturbances.stressors]]
stressor = "cpu"
where = "same-core"
params = {{ priority = 99, slice = "1ms", period = "4.9ms" }}

[[disturbances]]
name = "other-core"
[[disturbances.stressors]]
stressor = "cpu"
where = "other-core"
params = {{ priority = 99, slice = "1ms", period = "4.9ms" }}

[timeline]
settle = "100ms"
"""


def _sigterm_once_streaming(scenarios: list[Path], results: Path, settle_s: float,
                            env: dict[str, str] | None = None) -> tuple[int, str]:
    """Start `rtvirt run SCENARIOS`, send SIGTERM ``settle_s`` after the first run's samples appear; its exit
    status and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "rtvirt", "run", *map(str, scenarios), "--out", str(results),
                             "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(results.glob("runs/*/samples.rtvs")):
        time.sleep(0.1)
    time.sleep(settle_s)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


STARVED_MS = 100  # of steal during a 10 s campaign: the host VM did not run for that long


def _steal_ms() -> int:
    """Time this VM's host took from it, over the CPUs this test may use (the explanation's per-CPU reader)."""
    return sum(cpu_steal_ns(Path("/proc/stat").read_text(), os.sched_getaffinity(0)).values()) // 1_000_000


def _quantile(results: Path, outcome: Any, q: float) -> float:
    latencies = load_run(results / "runs" / outcome.run_id).samples().column("latency_ns").to_numpy()
    return quantile(latencies, q)


@pytest.mark.skipif(not TWO_CPUS, reason="other-core stress needs a second CPU")
@pytest.mark.quiet  # latency with and without a stressor on the measured CPU: no other test's load there
def test_same_core_stress_raises_p95_against_solo_and_other_core(tmp_path: Path) -> None:
    text = HOST_SCENARIO.format(duration="3s", repetitions=1)
    scenario = parse_scenario(text, "directions.toml")
    # This machine is a VM: its host once starved it during the campaign (all three runs lost 7-12 % of their
    # samples to overruns, each with a 32-36 ms worst case), and our run rightly said "short". Such a campaign
    # is made again once, only when the kernel's steal counter shows the host took the time.
    for attempt in (1, 2):
        results = tmp_path / f"attempt-{attempt}"
        state = CampaignState.create(results, scenario.name, text, "directions.toml", 1.0)
        steal_before = _steal_ms()
        outcomes = run_campaign(scenario, state, results, show_progress=False, write_report=False).outcomes
        stolen_ms = _steal_ms() - steal_before
        if {o.status for o in outcomes.values()} == {"complete"} or stolen_ms < STARVED_MS:
            break
    assert {o.status for o in outcomes.values()} == {"complete"}, (
        {k: o.reason for k, o in outcomes.items()}, f"{stolen_ms} ms stolen", attempt)
    # The interferer holds the measured core for 1 ms in every 4.9 ms at the same top priority: a fifth of the
    # samples wait for it, so it shows at p95. The top 1 % on this VM also holds its host's stalls (seen in CI:
    # seven of 31-32 ms in a solo run that stayed complete, p99 1.48 ms against 1.00 ms same-core).
    p95 = {key.split("/")[1]: _quantile(results, o, 0.95) for key, o in outcomes.items()}
    assert p95["same-core"] > 1.5 * p95["solo"], p95
    assert p95["same-core"] > 1.5 * p95["other-core"], p95
    assert outcomes["host/same-core/test-first/r1"].manifest["summary"]["all"]["p99_ns"] > 200_000
    same = load_run(results / "runs" / outcomes["host/same-core/test-first/r1"].run_id).manifest
    assert [e["event"] for e in same["timeline"]] == ["workload-start", "stress-on", "stress-off"]
    assert same["system"]["preemption"] and isinstance(same["system"]["warnings"], list)
    assert same["config"] == "host / same-core" and same["environment"] == "host"


def _tagged_processes(tag: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"RTVIRT_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not TWO_CPUS, reason="other-core stress needs a second CPU")
def test_resume_does_not_measure_again_a_run_whose_manifest_was_written_before_the_interrupt(
        tmp_path: Path) -> None:
    """An interrupt between a run's manifest and the campaign's state leaves the run "running" in the state
    (seen: Ctrl-C of `rtvirt lab` as a run ended; its --resume measured that run twice). Made here by putting
    a finished run's state back to what that interrupt leaves; --resume takes the manifest's outcome."""
    scenario = tmp_path / "resume.toml"
    scenario.write_text(HOST_SCENARIO.format(duration="300ms", repetitions=1))
    results = tmp_path / "results"
    assert run_cli("run", "--no-report", str(scenario), "--out", str(results), "--no-progress").returncode == 0
    [state_path] = results.glob("campaigns/*/state.json")
    document = json.loads(state_path.read_text())
    key = next(iter(document["runs"]))
    run_id = document["runs"][key]["run_id"]
    document["runs"][key]["status"], document["finished"] = "running", False
    state_path.write_text(json.dumps(document))
    before = sorted(p.name for p in (results / "runs").iterdir())

    resumed = run_cli("run", "--no-report", "--resume", "--out", str(results), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    after = json.loads(state_path.read_text())
    # the state takes the manifest's outcome (short where the loaded machine's timer missed periods)
    status = json.loads((results / "runs" / run_id / "manifest.json").read_text())["status"]
    assert status in FINISHED
    assert after["finished"] is True and after["runs"][key] | {"status": status, "run_id": run_id} == \
        after["runs"][key]
    assert sorted(p.name for p in (results / "runs").iterdir()) == before  # nothing measured again


def test_kill_9_then_resume_keeps_finished_runs_and_leaves_no_strays(tmp_path: Path) -> None:
    scenario = tmp_path / "resume.toml"
    scenario.write_text(HOST_SCENARIO.format(duration="2s", repetitions=2))
    results = tmp_path / "results"
    tag = uuid.uuid4().hex
    env = {**os.environ, "RTVIRT_TEST_TAG": tag, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "rtvirt", "run", str(scenario), "--out", str(results),
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    state_path, seen = None, 0
    while time.monotonic() < deadline and seen < KILL_AFTER_SAMPLES:
        states = list(results.glob("campaigns/*/state.json"))
        if states:
            state_path = states[0]
            runs = json.loads(state_path.read_text())["runs"]
            done = [k for k, r in runs.items() if r["status"] in FINISHED]
            # kill while a disturbed run is in progress (probe and stressor both alive), once its stream holds
            # samples: under the parallel suite's load its probe started up to a second after the run did
            if len(done) >= 1 and any(r["status"] == "running" and "same-core" in k for k, r in runs.items()):
                streams = sorted(results.glob("runs/*same-core*/samples.rtvs"))
                seen = samples_so_far(streams[-1]) if streams else 0
        time.sleep(0.1)
    assert state_path is not None and proc.poll() is None and seen >= KILL_AFTER_SAMPLES, \
        f"campaign did not reach its second run's samples ({seen} seen)"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for _ in range(50):
        if not _tagged_processes(tag):
            break
        time.sleep(0.1)
    assert _tagged_processes(tag) == []
    before = json.loads(state_path.read_text())["runs"]
    finished = {k: r["run_id"] for k, r in before.items() if r["status"] in FINISHED}
    manifests = {k: (results / "runs" / rid / "manifest.json").read_bytes() for k, rid in finished.items()}
    assert finished

    resumed = subprocess.run([sys.executable, "-m", "rtvirt", "run", "--resume", "--out", str(results),
                              "--no-progress"], env=env, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    after = json.loads(state_path.read_text())
    assert after["finished"] is True
    assert {r["status"] for r in after["runs"].values()} <= set(FINISHED) and len(after["runs"]) == 6
    for key, run_id in finished.items():
        assert after["runs"][key]["run_id"] == run_id
        assert (results / "runs" / run_id / "manifest.json").read_bytes() == manifests[key]
    # the run in progress at the kill keeps its samples as a partial run beside its redone twin
    killed_key = next(k for k, r in before.items() if r["status"] == "running")
    salvaged = after["runs"][killed_key]["salvaged"]
    assert len(salvaged) == 1 and salvaged[0] != after["runs"][killed_key]["run_id"]
    partial = load_run(results / "runs" / salvaged[0]).manifest
    assert partial["status"] == "partial" and partial["campaign"]["outcome"] == "killed"
    # it stands where its twin does in the matrix (the study tables read a configuration's first run)
    redone = load_run(results / "runs" / after["runs"][killed_key]["run_id"]).manifest["campaign"]
    identity = ("key", "group", "workload", "disturbance", "start_order")
    assert {k: partial["campaign"][k] for k in identity} == {k: redone[k] for k in identity}, partial["campaign"]
    assert partial["summary"]["all"]["samples"] >= seen  # every sample on disk at the kill, and any after it
    assert _tagged_processes(tag) == []
    assert "report:" in resumed.stdout


@pytest.mark.vm
def test_default_campaign_end_to_end_at_small_scale(tmp_path: Path) -> None:
    result = run_cli("run", "--scale", "0.05", "--out", str(tmp_path), "--no-progress", timeout=900)
    assert_ran(result)
    state = json.loads(next(tmp_path.glob("campaigns/default-*/state.json")).read_text())
    assert len(state["runs"]) == 9 and {r["status"] for r in state["runs"].values()} <= set(RAN)
    qemu = load_run(tmp_path / "runs" / state["runs"]["qemu/solo/-/r1"]["run_id"]).manifest
    assert qemu["environment_detail"]["acceleration"] in ("kvm", "tcg")
    if qemu["environment_detail"]["acceleration"] == "tcg":
        assert any("TCG" in w for w in qemu["system"]["warnings"])
    partition = load_run(tmp_path / "runs" / state["runs"]["partition/solo/-/r1"]["run_id"]).manifest
    assert partition["environment_detail"]["cgroup_version"] in (1, 2)
    report = Path(result.stdout.split("report:")[1].split()[0])
    assert report.exists() and report.stat().st_size > 1000
    assert "qemu/same-core/test-first/r1" in result.stdout


@pytest.mark.skipif(not TWO_CPUS, reason="other-core stress needs a second CPU")
def test_sigterm_stops_everything_and_keeps_the_partial_run(tmp_path: Path) -> None:
    scenario = tmp_path / "term.toml"
    scenario.write_text(HOST_SCENARIO.format(duration="20s", repetitions=1))
    results = tmp_path / "results"
    tag = uuid.uuid4().hex
    env = {**os.environ, "RTVIRT_TEST_TAG": tag, "COLUMNS": "200"}
    returncode, stderr = _sigterm_once_streaming([scenario], results, 2.0, env)
    assert returncode == 130
    assert "--resume" in stderr  # the hint is a diagnostic: stderr, so stdout stays the summary alone
    assert _tagged_processes(tag) == []
    state = json.loads(next(results.glob("campaigns/*/state.json")).read_text())
    entry = state["runs"]["host/solo/-/r1"]
    assert entry["status"] == "interrupted" and state["finished"] is False
    manifest = load_run(results / "runs" / entry["run_id"]).manifest
    assert manifest["status"] == "partial" and manifest["summary"]["all"]["samples"] > 100


@pytest.mark.skipif(not TWO_CPUS, reason="needs a second CPU for the campaign's own work")
@pytest.mark.quiet  # p99 while the stressor is on against while it is off: no other test's load in either
def test_timeline_events_switch_stress_on_and_off(tmp_path: Path) -> None:
    text = HOST_SCENARIO.format(duration="3s", repetitions=1).replace(
        'name = "same-core"\n', 'name = "same-core"\nevents = [{ at = "1s", action = "stress-on" }, '
                                '{ at = "2s", action = "stress-off" }]\n')
    scenario = parse_scenario(text, "events.toml")
    scenario.disturbances = [d for d in scenario.disturbances if d.name == "same-core"]
    state = CampaignState.create(tmp_path, scenario.name, text, "events.toml", 1.0)
    outcome = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes[
        "host/same-core/-/r1"]
    assert outcome.status in FINISHED, outcome.reason
    run = load_run(tmp_path / "runs" / outcome.run_id)
    events = {e["event"]: e["t_ns"] / 1e9 for e in run.manifest["timeline"]}
    assert abs(events["stress-on"] - 1.0) < 0.5 and abs(events["stress-off"] - 2.0) < 0.5
    samples = run.samples(["t_ns", "latency_ns"])
    t = (samples["t_ns"].to_numpy() - samples["t_ns"].to_numpy().min()) / 1e9
    latency = samples["latency_ns"].to_numpy()
    during = latency[(t > events["stress-on"] + 0.2) & (t < events["stress-off"] - 0.2)]
    outside = latency[(t < events["stress-on"] - 0.2) | (t > events["stress-off"] + 0.2)]
    assert during.size > 100 and outside.size > 100
    # the stressor holds the CPU a fifth of the time (1 ms in 4.9): the 90th percentile shows it, where the 99th
    # is the outer host's (a suite run here: outside the stress 2 % of wake-ups over 200 us, p99 777 us, the
    # longest 4 ms, at FIFO 99 on this VM; during it p90 521 us against 43 us outside, p99 925 against 777 us)
    assert float(np.percentile(during, 90)) > 3 * float(np.percentile(outside, 90)), (
        np.percentile(during, [50, 90, 99]), np.percentile(outside, [50, 90, 99]))


WATCHDOG_SCENARIO = """\
name = "watchdog"
duration = "1s"
run_timeout = "30s"

[workload]
probe = "timer"

[[environments]]
kind = "qemu"
accel = "tcg"
boot_timeout = "1s"

# exclusive = false: a pinned reservation without a root domain of its own, which the kernel refuses
[[environments]]
kind = "partition"
sched = {{ policy = "deadline", runtime = "100us", period = "1ms" }}
exclusive = false

[[environments]]
kind = "host"
"""


@pytest.mark.vm
@pytest.mark.skipif(not TWO_CPUS, reason="a pinned partition is narrower than the root domain only with 2+ CPUs")
def test_watchdog_fails_runs_with_their_reason_and_moves_on(tmp_path: Path) -> None:
    text = WATCHDOG_SCENARIO.format()
    scenario = parse_scenario(text, "watchdog.toml")
    state = CampaignState.create(tmp_path, scenario.name, text, "watchdog.toml", 1.0)
    outcomes = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes
    assert outcomes["qemu/solo/-/r1"].status == "failed"
    assert "did not boot within 1s" in outcomes["qemu/solo/-/r1"].reason
    assert outcomes["partition/solo/-/r1"].status == "failed"
    assert "deadline" in outcomes["partition/solo/-/r1"].reason
    assert outcomes["host/solo/-/r1"].status in FINISHED
    saved = json.loads(state.path.read_text())["runs"]
    assert saved["qemu/solo/-/r1"]["reason"] == outcomes["qemu/solo/-/r1"].reason
    assert not list(Path("/sys/fs/cgroup/cpuset").glob(f"rtvirt-{os.getpid()}-*"))


SLOW_BOOT_SCENARIO = """\
name = "slow-boot"
duration = "1s"
run_timeout = "3s"

[workload]
probe = "timer"

[[environments]]
kind = "qemu"
accel = "tcg"
boot_timeout = "90s"
"""


HELD_BOOT_S = 5.0


def _hold_the_boot(found: threading.Event, stop_looking: threading.Event) -> None:
    """SIGSTOP the guest's QEMU (this test's child) as soon as it appears (in its firmware, before the kernel
    calibrates its clock), HELD_BOOT_S long: its boot is then longer than duration + run_timeout on any machine,
    as it would be on a starved one."""
    while not stop_looking.wait(0.005):
        for pid in children_of(os.getpid(), "qemu-system-x86"):
            os.kill(pid, signal.SIGSTOP)
            found.set()
            time.sleep(HELD_BOOT_S)
            os.kill(pid, signal.SIGCONT)
            return


@pytest.mark.vm
@pytest.mark.quiet
def test_a_guest_boot_within_its_boot_timeout_is_not_cut_by_the_run_timeout(tmp_path: Path) -> None:
    """run_timeout bounds a run beyond its duration; the guest's boot, which takes seconds under TCG, is bounded by
    its boot_timeout: a run_timeout shorter than the boot does not stop the run. The boot is held HELD_BOOT_S from
    outside (a quiet machine boots this guest in 3.4 s, shorter than duration + run_timeout = 4 s); the guest's end
    (its samples handed over, its power-off) must stay shorter than run_timeout, which scales with how starved the
    guest is, so it runs on a quiet machine (beside the suite's labs it took over 2 s after its 1 s duration)."""
    scenario = parse_scenario(SLOW_BOOT_SCENARIO, "slow-boot.toml")
    state = CampaignState.create(tmp_path, scenario.name, SLOW_BOOT_SCENARIO, "slow-boot.toml", 1.0)
    found, stop_looking = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_the_boot, args=(found, stop_looking), daemon=True)
    holder.start()
    try:
        outcome = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes[
            "qemu/solo/-/r1"]
    finally:
        stop_looking.set()
        holder.join()
    assert found.is_set(), "the guest's QEMU was never seen"
    assert outcome.status in FINISHED, outcome.reason
    manifest = load_run(tmp_path / "runs" / outcome.run_id).manifest
    assert manifest["summary"]["all"]["samples"] > 0
    # what makes the test tell: the boot took longer than the watchdog allows from the workload's start
    assert manifest["environment_detail"]["boot_seconds"] > 1 + 3, manifest["environment_detail"]["boot_seconds"]


QUIET_GAP_SCENARIO = """\
name = "quiet-gap"
duration = "1s"
run_timeout = "60s"

[workload]
probe = "gap"
# below FIFO 99: in the parallel phase another test's measuring thread at 99 may share its CPU
params = { threshold = "900ms", priority = 80 }

[[environments]]
kind = "host"

[[disturbances]]
name = "solo"
"""


def test_a_probe_that_ran_to_its_end_and_saw_nothing_is_a_stored_measurement(tmp_path: Path) -> None:
    # nothing on a host takes a CPU for 0.9 s: the gap probe ends "complete" with no record, which is a result
    # (no interruption above the threshold), not a failed run
    scenario = parse_scenario(QUIET_GAP_SCENARIO, "quiet-gap.toml")
    state = CampaignState.create(tmp_path, scenario.name, QUIET_GAP_SCENARIO, "quiet-gap.toml", 1.0)
    outcome = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes[
        "host/solo/-/r1"]
    assert outcome.status == "complete" and outcome.reason == ""
    manifest = load_run(tmp_path / "runs" / outcome.run_id).manifest
    assert manifest["status"] == "complete" and manifest["summary"]["all"]["samples"] == 0


def test_several_scenarios_run_as_campaigns_of_one_command_and_resume_together(tmp_path: Path) -> None:
    """`rtvirt run A B`: two campaigns, both made up front; stopped during A, `--resume A B` finishes A's
    unfinished run and all of B, and --json lists both campaigns."""
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(HOST_SCENARIO.format(duration="2s", repetitions=1).replace('"directions"', '"first"', 1))
    second.write_text(HOST_SCENARIO.format(duration="0.5s", repetitions=1).replace('"directions"', '"second"', 1))
    results = tmp_path / "results"
    returncode, stderr = _sigterm_once_streaming([first, second], results, 1.0)
    assert returncode == 130 and f"--resume {first} {second} --out" in stderr, stderr
    states = {json.loads(p.read_text())["scenario"]: p for p in results.glob("campaigns/*/state.json")}
    assert set(states) == {"first", "second"}  # B exists before it ran, so that --resume finds it
    assert json.loads(states["second"].read_text())["runs"] == {}

    resumed = run_cli("run", "--resume", str(first), str(second), "--out", str(results), "--no-progress", "--json",
                      "--scale", "0.1", timeout=240)
    assert resumed.returncode == 2 and "option --scale" in resumed.stderr  # the campaigns ran at scale 1
    resumed = run_cli("run", "--resume", str(first), str(second), "--out", str(results), "--no-progress", "--json",
                      "--no-report", timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    documents = json.loads(resumed.stdout)["campaigns"]
    assert [d["scenario"] for d in documents] == ["first", "second"]
    assert [len(d["runs"]) for d in documents] == [3, 3]
    # every run finished and measured its periods: a timer run the loaded machine made miss over a tenth of them
    # is `short` with the misses counted as overran (CI's parallel phase once did), which still exits 0
    runs = [r for d in documents for r in d["runs"].values()]
    assert {r["status"] for r in runs} <= set(FINISHED), runs
    for run in runs:
        expectation = load_run(results / "runs" / run["run_id"]).manifest.get("expectation") or {}
        assert expectation["taken"] + expectation["overruns"] >= 0.9 * expectation["expected"], expectation
    assert all(json.loads(p.read_text())["finished"] for p in states.values())
    # --no-report: the runs are stored, no campaign wrote a report
    assert [d["report"] for d in documents] == [None, None] and not list(results.glob("campaigns/*/report.*"))


def test_a_failing_teardown_fails_its_run_keeps_its_samples_and_the_campaign_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an `xl` that does not return in a lab's dom0 under load once ended rtvirt after a whole measurement: the
    # platform's teardown failing here is the host environment's record-keeping raising the same error, once
    closed: list[str] = []

    class HungReadback(HostEnvironment):
        def describe(self) -> dict[str, Any]:
            if not closed:
                raise RunError("ssh target root@127.0.0.1:22: xl cpupool-list did not finish within 120s")
            return super().describe()

        def close(self) -> None:
            closed.append(self.config.label)
            super().close()

    monkeypatch.setitem(ENVIRONMENTS, "host", HungReadback)
    text = HOST_SCENARIO.format(duration="300ms", repetitions=2)
    scenario = parse_scenario(text, "teardown.toml")
    scenario = scenario.model_copy(update={"disturbances": scenario.disturbances[:1]})
    state = CampaignState.create(tmp_path, scenario.name, text, "teardown.toml", 1.0)
    outcomes = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes
    first, second = outcomes["host/solo/-/r1"], outcomes["host/solo/-/r2"]
    assert first.status == "failed" and first.reason.startswith("teardown: ") and "xl cpupool-list" in first.reason
    # the second run ends as any run does on this machine: short when the parallel phase's load made its timer miss
    # periods (CI once saw 56 of 300), counted as overruns
    assert second.status in FINISHED and closed == ["host", "host"]
    manifest = load_run(tmp_path / "runs" / first.run_id).manifest
    assert manifest["campaign"]["outcome"] == "failed" and manifest["summary"]["all"]["samples"] > 100
