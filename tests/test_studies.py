"""The built-in study scenarios: their matrices, `rtvirt scenarios NAME`, and small-scale runs whose reports
show the studies' tables with the published figures beside ours (real QEMU guests under TCG here)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import RAN, run_cli
from shared_runs import campaign_argv, session_memo, shared_campaign
from test_env_xen import lab_campaign, lab_cots_campaign  # noqa: F401 - the session's Xen lab campaign: one lab boot for all

from rtvirt.campaign import execute_run
from rtvirt.cli import app
from rtvirt.results.report import write_report
from rtvirt.results.studies.tables import published
from rtvirt.scenario import builtin_scenarios, load_scenario, parse_scenario
from rtvirt.scenario.matrix import PlannedRun, expand
from rtvirt.scenario.schema import Scenario
from rtvirt.scenario.studies import differences
from rtvirt.store import list_runs, load_run
from rtvirt.stream import read_stream
from rtvirt.sysaudit import audit_system

RUN_TIMEOUT_NS = 120_000_000_000


def _builtin(name: str) -> Scenario:
    return parse_scenario(builtin_scenarios()[name], name)


def _run(scenario: Scenario, scale: float, keys: list[str], results: Path,
         manifests: dict[str, dict[str, Any]] | None = None) -> str:
    """Run the named plans of ``scenario`` for real and return the Markdown report of those runs (and
    each run's manifest into ``manifests``, by key)."""
    plans: dict[str, PlannedRun] = {p.key: p for p in expand(scenario, scale)}
    system = audit_system()
    run_ids = set()
    for key in keys:
        outcome = execute_run(scenario, plans[key], results, run_timeout_ns=RUN_TIMEOUT_NS, system=system)
        assert outcome.status in RAN, (key, outcome.reason)
        run_ids.add(str(outcome.run_id))
        if manifests is not None and outcome.manifest is not None:
            manifests[key] = outcome.manifest
    return write_report(results, results / "report.md", "markdown", run_ids=run_ids).read_text()


def _table(report: str, title_start: str) -> list[list[str]]:
    """Rows of the Markdown table whose heading starts with ``title_start``."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {title_start}"))
    rows = []
    for line in lines[start + 4:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def _assert_measured(exit_status: int, statuses: set[str], output: str) -> None:
    """Every run measured to its end; `rtvirt run` exits 1 only for runs short of samples nothing accounts for
    (a loaded host decides how many periods a guest misses, docs/scenarios.md "Exit status")."""
    assert statuses <= set(RAN) and (exit_status == 0 or (exit_status == 1 and "short" in statuses)), \
        (statuses, output[-6000:])


def _whole_study(name: str, scale: float, results: Path, tmp_path_factory: pytest.TempPathFactory,
                 timeout: float = 900) -> tuple[dict[str, Any], str]:
    """`rtvirt run NAME --scale SCALE --repetitions 1`, as a user starts it (README.md and docs/studies.md show
    this very command line, and tests/test_docs_examples.py runs it: once for the session, tests/shared_runs.py),
    copied to ``results``: every run measured to its end; returns the campaign's runs and the Markdown report."""
    ran = shared_campaign(session_memo(tmp_path_factory), campaign_argv([name], scale, 1), timeout=timeout)
    shutil.copytree(ran.results, results)
    (state,) = results.glob("campaigns/*/state.json")
    runs: dict[str, Any] = json.loads(state.read_text())["runs"]
    _assert_measured(ran.status, {r["status"] for r in runs.values()}, ran.output)
    return runs, write_report(results, results / "report.md", "markdown").read_text()


# --- the matrices (no runs) ----------------------------------------------------------------------------

def test_guest_isolation_matrix_is_the_studys() -> None:
    scenario = _builtin("guest-isolation")
    assert scenario.study == "guest-isolation" and scenario.repetitions == 10
    probes = {w.name: (w.probe, w.params) for w in scenario.probe_workloads()}
    assert probes["kops"] == ("kops", {"iterations": 1000})
    assert probes["qsort"][1]["kernel"] == "qsort" and probes["basicmath"][1]["kernel"] == "basicmath"
    assert probes["threadmetric"][0] == "threadmetric"
    # every disturbance is a stressor guest, spinning at top priority or memsetting 1.5 x L2, on either core
    stressed = [d for d in scenario.disturbances if d.stressors]
    assert all(u.where == "other-vm" and u.guest == "baremetal" for d in stressed for u in d.stressors)
    placed = {(u.stressor, u.guest_cpus) for d in stressed for u in d.stressors}
    assert {("cpu", "same-core"), ("cpu", "other-core"), ("cache", "same-core"), ("cache", "other-core")} <= placed
    assert all(u.params == {"level": 2} for d in stressed for u in d.stressors if u.stressor == "cache")
    plans = expand(scenario)
    assert len(plans) == 210
    by_group: dict[str, set[tuple[str, str | None]]] = {}
    for plan in plans:
        by_group.setdefault(plan.group, set()).add((scenario.disturbances[plan.disturbance].name, plan.start_order))
    assert {d for d, _ in by_group["kops"]} == {"solo", "spin-same-core", "spin-other-core", "cache-same-core",
                                                "cache-other-core"}
    assert {o for _, o in by_group["start-order"]} == {None, "test-first", "stress-first"}
    on_off = [p for p in plans if p.group == "30min"]
    assert on_off[0].duration_ns == 1800 * 10**9
    assert on_off[0].events == ((600 * 10**9, "stress-on"), (1200 * 10**9, "stress-off"))


def test_cots_profiles_and_interrupt_latency_configurations() -> None:
    cots = _builtin("cots-hypervisor")
    profiles: dict[str, set[tuple[str, bool, str]]] = {}
    for plan in expand(cots):
        env, disturbance = cots.environments[plan.environment], cots.disturbances[plan.disturbance]
        profiles.setdefault(plan.group, set()).add((env.kind, env.pin, disturbance.name))
        assert plan.duration_ns == 8 * 3600 * 10**9
    # the baseline and each hypervisor (QEMU/KVM, libvirt/KVM, Xen) with and without affinity, no load / load inside
    for group, pin, load in (("TP1", False, "no-load"), ("TP2", True, "no-load"), ("TP3", False, "load"),
                             ("TP4", True, "load")):
        assert profiles[group] == {(kind, pin, load) for kind in ("host", "qemu", "libvirt", "xen")}
    assert profiles["TP5"] == {(kind, False, "load-in-2-vms") for kind in ("qemu", "libvirt", "xen")}
    assert profiles["TP6"] == {(kind, True, "load-in-2-vms") for kind in ("qemu", "libvirt", "xen")}
    # the KVM profiles run under a real KVM: the KVM lab here, one machine for them all, large enough for TP6
    kvm = [e for e in cots.environments if e.kind == "libvirt"]
    assert {(e.host, e.lab.memory) for e in kvm} == {("lab", 4608)} and all(e.memory == 1024 for e in kvm)
    xen = [e for e in cots.environments if e.kind == "xen"]
    # the load's blocks fit (the bare-metal guest runs no load inside)
    assert all(e.memory >= 10 * 64 for e in xen if e.guest != "baremetal")
    assert all(e.stressor_memory >= 5 * 64 for e in xen)
    # affinity: the RT domU keeps its pCPU (the last) to itself, the stressor domUs of TP6 run on pCPU 0
    assert all(e.stressor_cpus == (0,) and e.cpus is None for e in xen if e.pin)
    # general-purpose vs PREEMPT_RT vs bare-metal guest under the same profiles (issue 12); no load inside a
    # bare-metal guest
    guests: dict[str, set[tuple[str, str]]] = {}
    for plan in expand(cots):
        env = cots.environments[plan.environment]
        if env.kind in ("qemu", "libvirt", "xen") and env.pin:
            guests.setdefault(plan.group, set()).add((env.kind, env.guest))
    every = {(kind, guest) for kind in ("qemu", "libvirt", "xen") for guest in ("linux", "linux-rt", "baremetal")}
    assert guests["TP2"] == guests["TP6"] == every
    assert guests["TP4"] == every - {(kind, "baremetal") for kind in ("qemu", "libvirt", "xen")}
    load = next(d for d in cots.disturbances if d.name == "load").stressors[0]
    # 10 sqrt + 10 malloc/free workers, inside the system under test (the RT VM itself in TP3/TP4)
    assert (load.stressor, load.workers, load.params, load.where) == ("mix", 10, {"block": "64MiB"}, "inside")
    in_vms = next(d for d in cots.disturbances if d.name == "load-in-2-vms").stressors[0]
    assert (in_vms.vms, in_vms.workers * 2 * in_vms.vms) == (2, 20)
    interrupt = _builtin("interrupt-latency")
    probes = {w.name: (w.probe, w.params) for w in interrupt.probe_workloads()}
    assert probes == {"wakeup": ("wakeup", {"interval": "1ms", "loops": 105000, "threads": 1}),
                      "timer-interrupt": ("timer", {"interval": "1ms", "loops": 105000})}
    assert interrupt.repetitions == 3 and interrupt.duration == 105 * 10**9
    configs = {p.config for p in expand(interrupt)}
    stand_ins = {f"{group}: {env} / {d}" for group, env in (("virtualised", "vm"),
                                                             ("virtualised-baremetal", "vm-baremetal"))
                 for d in ("alone", "two-more-vms", "extra-interrupt-source")}
    kvm = {f"kvm-baremetal: kvm-baremetal / {d}" for d in ("alone", "two-more-vms", "extra-interrupt-source")}
    assert configs == {"native: native / alone"} | stand_ins | kvm
    assert next(e for e in interrupt.environments if e.label == "vm-baremetal").guest == "baremetal"
    # every published row names configurations the built-in runs
    assert {key for r in published()["interrupt-latency"]["rows"] for key in r["ours"]} == \
        {config.split(": ", 1)[1] for config in configs}


def test_rt_xen_servers_is_the_rt_xen_studys_matrix() -> None:
    """The RT-Xen study's scenarios as the brief describes them: one vCPU alone on a core, contention with one
    and with two other RT VMs on that core, an idle high-priority VM answering a 0.5 ms interrupt source."""
    scenario = _builtin("rt-xen-servers")
    assert scenario.study == "rt-xen-servers"
    probes = {w.name: (w.probe, w.params) for w in scenario.probe_workloads()}
    assert probes == {"gap": ("gap", {"threshold": "500us"}), "interrupt": ("timer", {"interval": "500us"})}
    runs = {(p.group, scenario.environments[p.environment].label, scenario.disturbances[p.disturbance].name)
            for p in expand(scenario)}
    assert runs == {("affinity", "rtds", "alone"), ("affinity", "credit2", "alone")} | \
        {("contention", env, d) for env in ("rtds", "credit2") for d in ("1-rt-vm", "2-rt-vms")} | \
        {("interrupt", env, d) for env in ("rtds-high-priority", "credit2") for d in ("alone", "2-rt-vms")}
    vms = {d.name: sum(u.vms for u in d.stressors) for d in scenario.disturbances}
    assert vms == {"alone": 0, "1-rt-vm": 1, "2-rt-vms": 2}
    for env in scenario.environments:  # every VM of a run on one core: the other RT VMs stay on the parent's
        assert env.cpus == (1,) and env.stressor_cpus is None
    rtds = {env.label: env for env in scenario.environments if env.scheduler == "rtds"}
    # equal priority: the other RT VMs hold the measuring VM's server; the high-priority VM's period is shorter
    assert rtds["rtds"].rtds == rtds["rtds"].stressor_rtds == rtds["rtds-high-priority"].stressor_rtds
    assert rtds["rtds-high-priority"].rtds.period < rtds["rtds"].rtds.period
    # every published figure names a configuration the built-in runs
    keys = {f"{group}: {env} / {d}" for group, env, d in runs}
    assert {key for ref in published()["rt-xen-servers"]["holes"] for key in ref["ours"]} <= keys


def test_scenarios_command_shows_the_matrix_and_json(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["scenarios", "guest-isolation"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "reproduces the guest-isolation study" in shown.output and "210 runs" in shown.output
    assert "stress-on at 10m, stress-off at 20m" in shown.output
    assert "cache x1 other-vm (1 baremetal guest, same-core) [level=2]" in shown.output  # no rich markup
    assert "guest (qemu, pinned, 1 vCPU, baremetal guest)" in shown.output
    as_json = CliRunner().invoke(app, ["scenarios", "cots-hypervisor", "--json"])
    document = json.loads(as_json.output)
    assert document["study"] == "cots-hypervisor" and document["runs"] == 37
    assert [g["name"] for g in document["groups"]] == ["TP1", "TP2", "TP3", "TP4", "TP5", "TP6"]
    tp4 = {run["environment"]: run for run in document["groups"][3]["runs"]}
    assert tp4["qemu-pinned"]["placement"] == "qemu, pinned, 1 vCPU, linux guest"
    assert tp4["qemu-pinned"]["stressors"] == ["mix x10 inside [block=64MiB]"]
    tp6 = {run["environment"]: run for run in document["groups"][5]["runs"]}
    assert tp6["xen-pinned"]["placement"] == "xen, pinned, 1 vCPU, linux guest, stressor domUs on pCPU 0"
    bad = tmp_path / "bad.toml"
    bad.write_text(builtin_scenarios()["interrupt-latency"].replace('environments = ["native"]',
                                                                    'environments = ["nowhere"]'))
    refused = CliRunner().invoke(app, ["scenarios", str(bad)])
    assert refused.exit_code == 2 and "groups[0].environments" in refused.output and "nowhere" in refused.output
    unknown = tmp_path / "study.toml"
    unknown.write_text(builtin_scenarios()["interrupt-latency"].replace('study = "interrupt-latency"', 'study = "x"'))
    refused = CliRunner().invoke(app, ["scenarios", str(unknown)])
    assert refused.exit_code == 2 and "field 'study'" in refused.output


def test_bare_metal_stressor_guests_refuse_what_they_cannot_run(tmp_path: Path) -> None:
    """Exit 2 naming the field, before anything boots: a stressor our kernel lacks, more than one worker, or
    a disturbing guest of another hypervisor (Xen makes domUs of its own)."""
    text = builtin_scenarios()["guest-isolation"]
    spin = 'stressor = "cpu"\nwhere = "other-vm"\nguest = "baremetal"\nguest_cpus = "same-core"\n'
    assert spin in text
    xen = text.replace('kind = "qemu"\nname = "guest"\nguest = "baremetal"\nvcpus = 1', 'kind = "xen"\nname = "guest"')
    for changed, field, message in (
            (text.replace(spin, spin.replace('"cpu"', '"mem"'), 1), "disturbances[1].stressors[0]",
             "runs the cpu and cache stressors, not mem"),
            (text.replace(spin, spin + "workers = 2\n", 1), "disturbances[1].stressors[0]", "one worker"),
            (xen, "disturbances[1].stressors[0].guest", "'guest' applies to QEMU and libvirt disturbing guests")):
        assert changed != text
        path = tmp_path / "bad.toml"
        path.write_text(changed)
        refused = CliRunner().invoke(app, ["scenarios", str(path)])
        assert refused.exit_code == 2 and field in refused.output and message in refused.output, refused.output


def test_inside_stressors_start_with_the_measured_system(tmp_path: Path) -> None:
    """A load inside the measured guest is one of its own jobs: it cannot be switched on later."""
    text = builtin_scenarios()["cots-hypervisor"]
    # TP3's start order, within its own [[groups]] table
    test_first = re.sub(r'(name = "TP3"\n(?:(?!\[\[)[\s\S])*?start_order = \[)"stress-first"', r'\1"test-first"', text)
    with_events = text.replace("[timeline]\n", '[timeline]\nevents = [{ at = "1h", action = "stress-on" }]\n')
    for changed, field in ((test_first, "groups[2].start_order"), (with_events, "disturbances[1].events")):
        assert changed != text
        path = tmp_path / "inside.toml"
        path.write_text(changed)
        refused = CliRunner().invoke(app, ["scenarios", str(path)])
        assert refused.exit_code == 2 and f"field '{field}'" in refused.output and "'inside'" in refused.output


def test_differences_name_the_changed_field() -> None:
    text = builtin_scenarios()["guest-isolation"]
    changed = parse_scenario(text.replace("repetitions = 10", "repetitions = 2").replace(
        'name = "guest-isolation"', 'name = "mine"'))
    assert differences(changed.model_dump(mode="json"), _builtin("guest-isolation").model_dump(mode="json")) == \
        ["repetitions"]


# --- small-scale runs, real guests -----------------------------------------------------------------------

@pytest.mark.vm
@pytest.mark.timeout(1800)
def test_the_whole_interrupt_latency_study_at_a_small_scale(tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every configuration of the built-in once at 0.02 (2.1 s runs): native, the RT VM alone, beside two more
    VMs (bare-metal guests spinning) and with the extra interrupt source, through both stand-ins for the
    paper's interrupt source (the cross-CPU wake-up in a Linux guest, the timer in the bare-metal guest), in
    QEMU here and as libvirt domains in the KVM lab (one lab boot)."""
    results = tmp_path / "results"
    runs, report = _whole_study("interrupt-latency", 0.02, results, tmp_path_factory, timeout=1500)
    assert len(runs) == 10
    status = {row[0]: row[1] for row in _table(report, "Study interrupt-latency")}
    assert status["this campaign"].startswith("the study's configuration")
    assert status["duration"] == "scaled: 0.02 of the study's durations"
    assert status["repetitions"] == "1 per configuration, fewer than the study's 3"
    table = _table(report, "Interrupt-latency study")
    # the QEMU stand-ins and the KVM lab's bare-metal guest for each of the paper's rows (the extra source of the
    # KVM row run in the lab, over SSH)
    assert [row[0] for row in table] == ["native"] + [f"virtualised, {c}" for c in ["alone"] * 3 + ["two more VMs"] * 3
                                                      + ["extra interrupt source"] * 3]
    rows = {(row[0], row[1]): row for row in table}
    native = rows[("native", "native: native / alone")]
    assert native[5:8] == ["2.28", "2.50", "3.03"]  # as the paper's table prints them
    for row in table:  # every configuration ran: min <= avg <= max, and a reading against the paper
        assert _number(row[2]) <= _number(row[3]) <= _number(row[4]), row
        assert "x the paper" in row[8], row
    for label in ("virtualised: vm / alone", "virtualised-baremetal: vm-baremetal / alone",
                  "kvm-baremetal: kvm-baremetal / alone"):
        alone = rows[("virtualised, alone", label)]
        assert alone[5:8] == ["4.67", "5.53", "11.78"]
        reading = re.search(r"avg: (same|opposite) direction \(ours ([+-][\d,]+) %, paper \+121 %\); "
                            r"([\d.,]+)x the paper", alone[8])
        assert reading is not None, alone
        ours_change = (_number(alone[3]) / _number(native[3]) - 1) * 100  # from the rounded cells
        assert reading[1] == ("same" if ours_change > 0 else "opposite")
        assert abs(_number(reading[2]) - ours_change) <= 1 + abs(ours_change) * 1e-3
        assert abs(_number(reading[3]) - _number(alone[3]) / 5.53) <= 0.01 + _number(reading[3]) * 1e-3
    extra = rows[("virtualised, extra interrupt source",
                  "virtualised-baremetal: vm-baremetal / extra-interrupt-source")]
    assert extra[5:8] == ["4.95", "5.84", "17.70"] and extra[8].startswith("avg: ") and " · max: " in extra[8]
    # the KVM row's interrupt source ran in the lab, on the lab's CPU of the RT vCPU
    manifest = load_run(results / "runs" / runs["kvm-baremetal/kvm-baremetal/extra-interrupt-source/stress-first/r1"][
        "run_id"]).manifest
    (irq,) = manifest["campaign"]["stressor_results"]
    assert irq["stressor"] == "irq" and irq["bogo_ops"] > 0, irq
    assert irq["cpus"] == manifest["environment_detail"]["vcpu_cpus"][:1] and "kvm_lab" in manifest[
        "environment_detail"], (irq, manifest["environment_detail"]["vcpu_cpus"])


def _stressor_stats(results: Path, run_id: str) -> dict[str, int]:
    """The statistics of a run's first disturbing guest (a bare-metal stressor guest writes them as it works)."""
    stream = read_stream(results / "runs" / run_id / "work" / "stress-vm-1" / "stressor.rtvs")
    assert stream.end_reason == "signal"  # stopped by the host at the end of the run, everything written out
    return {name: value for (_, name), value in stream.stats.items()}


@dataclass
class Campaign:
    """One campaign as a user runs it: its results, the summary it printed, every run's manifest (by plan key),
    and its report in Markdown and JSON."""

    results: Path
    summary: str
    manifests: dict[str, dict[str, Any]]
    markdown: str
    document: dict[str, Any]


@pytest.fixture(scope="module")
def guest_isolation(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """`rtvirt run guest-isolation --scale 0.01 --repetitions 1` (21 runs of bare-metal guests under TCG, about a
    minute here), once for the session (tests/shared_runs.py: the README's and docs/studies.md's command line,
    which tests/test_docs_examples.py runs too), copied here for every test that reads it."""
    ran = shared_campaign(session_memo(tmp_path_factory), campaign_argv(["guest-isolation"], 0.01, 1), timeout=900)
    results = tmp_path_factory.mktemp("guest-isolation") / "results"
    shutil.copytree(ran.results, results)
    manifests = {run.manifest["campaign"]["key"]: run.manifest for run in list_runs(results)}
    _assert_measured(ran.status, {m["status"] for m in manifests.values()}, ran.output)
    markdown = write_report(results, results / "report.md", "markdown").read_text()
    document = json.loads(write_report(results, results / "report.json", "json").read_text())
    return Campaign(results, ran.output, manifests, markdown, document)


@pytest.mark.vm
def test_the_whole_guest_isolation_study_at_a_small_scale(guest_isolation: Campaign) -> None:
    """Every run of the built-in (all workloads x disturbances x start orders, and the stress-on-off run) at
    0.01 with one repetition, bare-metal measuring and stressor guests: each study table in its layout."""
    results, manifests, report = guest_isolation.results, guest_isolation.manifests, guest_isolation.markdown
    assert len(manifests) == 21
    assert all(m["environment_detail"]["guest"] == "baremetal" for m in manifests.values())
    # the stressor guests ran our kernel's programs: spinning, and stores over 1.5 x the L2 CPUID reports
    spin = _stressor_stats(results, manifests["kops/guest/spin-same-core/stress-first/r1"]["run_id"])
    assert spin["spins"] >= spin["spins_per_ms"] > 0
    cache = _stressor_stats(results, manifests["qsort/guest/cache-other-core/stress-first/r1"]["run_id"])
    assert cache["cache_level"] == 2 and cache["buffer_bytes"] == (cache["cache_bytes"] * 3 // 2 + 7) // 8 * 8
    assert cache["passes"] >= 1
    # the stressor guest of the 30-minute run waited paused until minute 10 (x 0.01) and stopped at minute 20
    events = {e["event"]: e["t_ns"] for e in manifests["30min/guest/spin-other-core-10-20min/-/r1"]["timeline"]}
    assert 6e9 <= events["stress-on"] < 9e9 and 12e9 <= events["stress-off"] < 15e9, events
    status = {row[0]: row[1] for row in _table(report, "Study guest-isolation")}
    assert status["this campaign"].startswith("the study's configuration")
    assert status["duration"] == "scaled: 0.01 of the study's durations"
    assert status["repetitions"] == "1 per configuration, fewer than the study's 10"
    disturbances = {"solo", "spin-same-core", "spin-other-core", "cache-same-core", "cache-other-core"}
    outliers = {(row[0], row[1]): row for row in _table(report, "Guest-isolation study: outliers")}
    assert set(outliers) == {(w, d) for w in ("kops", "qsort", "basicmath") for d in disturbances}
    for (workload, disturbance), row in outliers.items():
        assert _number(row[3]) >= _number(row[5]) > 0 and _number(row[4]) > 0  # cycles and ms: outlier >= median
        if workload == "kops":  # the paper's outlier figures are the kernel operations'
            assert row[7] == "540,000 (≈10 ms)" and row[8] == "20–80"
            assert f"{_number(row[3]) / 540000:.2f}x the paper" in row[9]
        else:
            assert row[7] == row[8] == "-" and "kernel operations only" in row[9]
        if disturbance != "solo":
            grown = _number(row[4]) / _number(outliers[(workload, "solo")][4])  # from the rounded cells
            reading = re.match(r"(same|opposite) direction as the paper \(outlier ([\d,.]+)x the solo run's\)", row[9])
            assert reading is not None and abs(_number(reading[2]) - grown) <= 0.05 + grown * 1e-3, row
            assert reading[1] == ("same" if grown > 1 else "opposite") or abs(grown - 1) < 0.05
    increase = {(row[0], row[1]): row for row in _table(report, "Guest-isolation study: increase against the solo")}
    assert set(increase) == {(w, d) for w in ("kops", "qsort", "basicmath") for d in disturbances - {"solo"}}
    for row in increase.values():
        assert row[3].endswith("%") and row[4].endswith("%") and _number(row[5]) > 0 and _number(row[6]) > 0
        assert abs(_number(row[7]) - _number(row[5]) / _number(row[6])) < 0.01 + 0.005 * _number(row[7])
    # start orders: Thread-Metric's 5 s interval scaled with the run, so a 3 s run still has the study's 60
    order = {(row[0], row[1]): row for row in _table(report, "Guest-isolation study: start order")}
    assert set(order) == {("solo", "-")} | {(d, o) for d in ("spin-same-core", "spin-other-core")
                                            for o in ("test-first", "stress-first")}
    for row in order.values():
        assert 30 <= int(row[2]) <= 61 and row[7] == "-35.00 %", row
        change = _number(row[5].removesuffix(" %"))
        # from the rounded cells: the steady level is a median, shown to the round
        assert abs(change - (_number(row[3]) / _number(row[4]) - 1) * 100) < 0.01 + 100 * _number(row[3]) / \
            _number(row[4]) ** 2
        assert row[8].startswith("same direction" if change < 0 else "opposite direction")
    on_off = _table(report, "Guest-isolation study: the 30-minute run")
    assert len(on_off) == 1
    before, during = _number(on_off[0][1]), _number(on_off[0][2])
    assert before > 0 and during > 0 and on_off[0][7] == "-0.01 %" and on_off[0][8] == "-29.00 %"
    change = (during / before - 1) * 100
    assert abs(_number(on_off[0][4].removesuffix(" %")) - change) < 0.1  # shown rounded
    assert on_off[0][9].startswith("same direction" if change < 0 else "opposite direction")


def _workload(label: str) -> str:
    """The guest-isolation workload of a configuration label (its run group: start-order and 30min are
    Thread-Metric's)."""
    group = label.split(":")[0]
    return "threadmetric" if group in ("start-order", "30min") else group


@pytest.mark.vm
def test_the_guest_isolation_report_keeps_each_workload_to_its_unit_and_its_solo_run(
        guest_isolation: Campaign) -> None:
    """No table or verdict of the report mixes workloads or units: Thread-Metric in rounds, qsort, basicmath and
    kops in durations (µs), each against its own solo run; no verdict (latency classes) for any of them."""
    document, manifests = guest_isolation.document, guest_isolation.manifests
    units = {c["label"]: (c["quantity"], c["unit"]) for c in document["configurations"]}
    assert {units[label] for label in units if _workload(label) == "threadmetric"} == {("rounds per interval",
                                                                                        "rounds")}
    assert {units[label] for label in units if _workload(label) != "threadmetric"} == {("duration", "ns")}
    assert all(c["verdicts"] == [] and not c["judged"] for c in document["configurations"])
    verdicts = next(t for t in document["tables"] if t["title"].startswith("Verdicts"))
    assert {cell for row in verdicts["rows"] for cell in row[1:]} == {"-"}
    assert all(s["classes"] is None for s in document["served"])
    statistics = {t["title"]: t for t in document["tables"] if t["title"].startswith("Statistics per configuration")}
    assert set(statistics) == {"Statistics per configuration: duration (µs)",
                               "Statistics per configuration: rounds per interval"}
    for title, table in statistics.items():
        rounds = {_workload(row[0]) == "threadmetric" for row in table["rows"]}
        assert rounds == {title.endswith("rounds per interval")}, title
    medians = []
    for row in statistics["Statistics per configuration: rounds per interval"]["rows"]:
        # the rounds as the guest counted them, not divided by 1000: its stream's median. (How many it counted is the
        # host's to decide: beside a suite's labs one run's guest did 2 an interval, its vCPU held off for 1.75 s.)
        run = next(m for m in manifests.values() if m["config"] == row[0].removesuffix(" (partial)"))
        if len([m for m in manifests.values() if m["config"] == run["config"]]) == 1:
            counted = read_stream(guest_isolation.results / "runs" / run["run_id"] / "samples.rtvs").records["value"]
            assert _number(row[4]) == pytest.approx(run["summary"]["all"]["median_ns"]) == float(np.median(counted))
            medians.append(_number(row[4]))
    assert max(medians) > 1000  # thousands an interval where the guest ran
    # isolation: every configuration against the solo run of its own workload (the 30-minute run: Thread-Metric's)
    isolation = [t for t in document["tables"] if t["title"].startswith("Isolation against the baseline")]
    baselines = {t["title"].removeprefix("Isolation against the baseline ").split(": ")[0]: t for t in isolation}
    expected_baselines = {"kops", "qsort", "basicmath", "start-order"}
    assert set(baselines) == expected_baselines
    for baseline, table in baselines.items():
        assert table["title"].endswith("rounds per interval" if baseline == "start-order" else "duration (µs)")
        assert {_workload(row[0]) for row in table["rows"]} == {_workload(baseline + ":")}, table["rows"]
    assert {(r["label"], r["baseline"]) for r in document["isolation"]} == {
        (label, f"{'start-order' if _workload(label) == 'threadmetric' else label.split(':')[0]}: guest / solo")
        for label in units if not label.endswith("/ solo")}
    qsort = next(r for r in document["isolation"] if r["label"] == "qsort: guest / cache-other-core")
    solo = next(c for c in document["configurations"] if c["label"] == "qsort: guest / solo")["summary"]
    spun = next(c for c in document["configurations"] if c["label"] == qsort["label"])["summary"]
    assert qsort["median_increase_pct"] == pytest.approx((spun["median_ns"] / solo["median_ns"] - 1) * 100)
    assert qsort["unit"] == "ns" and abs(qsort["median_increase_pct"]) < 1000  # a duration against a duration
    # the same in Markdown, and the figures' tables of outliers keep to one unit each
    markdown = guest_isolation.markdown
    assert "Statistics per configuration (µs)" not in markdown and "## Outliers (largest samples of each run): " \
        "rounds per interval" in markdown
    outliers = _table(markdown, "Outliers (largest samples of each run): rounds per interval")
    assert {_workload(row[0]) for row in outliers} == {"threadmetric"} and {row[6] for row in outliers} == {"-"}


@pytest.mark.vm
def test_the_guest_isolation_campaign_summary_gives_each_run_its_unit(guest_isolation: Campaign) -> None:
    rows = {}
    for line in guest_isolation.summary.splitlines():
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if len(cells) == 7 and cells[0] in guest_isolation.manifests:
            rows[cells[0]] = cells
    assert set(rows) == set(guest_isolation.manifests)
    header = next(line for line in guest_isolation.summary.splitlines() if "median" in line)
    assert " us" not in header and "unit" in header
    for key, cells in rows.items():
        summary = guest_isolation.manifests[key]["summary"]["all"]
        if key.startswith(("start-order", "30min")):
            assert cells[6] == "rounds" and _number(cells[3]) == summary["median_ns"], cells
        else:
            assert cells[6] == "µs" and _number(cells[3]) == pytest.approx(summary["median_ns"] / 1000, abs=1e-3)


@pytest.mark.vm
def test_modified_study_scenario_runs_and_says_so(tmp_path: Path) -> None:
    """One field changed (Thread-Metric's interval): the run and its study table still come out, and the report
    says the configuration is no longer the study's."""
    text = builtin_scenarios()["guest-isolation"].replace('params = { report_interval = "5s" }',
                                                          'params = { report_interval = "2.5s" }')
    path = tmp_path / "mine.toml"
    path.write_text(text)
    scenario, _, _ = load_scenario(path)
    report = _run(scenario, 0.01, ["start-order/guest/solo/-/r1"], tmp_path / "results")
    status = {row[0]: row[1] for row in _table(report, "Study guest-isolation")}
    assert status["this campaign"] == \
        "modified from the study's configuration: field workloads[3].params.report_interval"
    assert status["repetitions"] == "10 per configuration (the study's)"
    order = _table(report, "Guest-isolation study: start order")
    assert order[0][0] == "solo" and 60 <= int(order[0][2]) <= 121  # 2.5 s x 0.01: 25 ms intervals in 3 s


@pytest.mark.vm
@pytest.mark.quiet  # its TCG guests must take >= 10 samples in 2.9 s: beside other workers' guests one took 1
def test_cots_profiles_with_the_load_inside_the_vm(tmp_path: Path) -> None:
    """TP1 on the baseline, TP2, TP4 and TP6 in the RT VM: TP4's 20 workers run inside the measured VM (the
    study's placement), which keeps its vCPU busy where TP2's idles; TP6's run in two other VMs, each as large
    as the RT VM so that their 64 MB blocks fit (a disturbing guest killed by the OOM killer fails the run).
    The bare-metal guest (booted in under a second) under TP2 and TP6 too."""
    manifests: dict[str, dict[str, Any]] = {}
    keys = ["TP1/baseline-free/no-load/-/r1", "TP2/qemu-pinned/no-load/-/r1", "TP4/qemu-pinned/load/stress-first/r1",
            "TP6/qemu-pinned/load-in-2-vms/stress-first/r1", "TP2/qemu-baremetal-pinned/no-load/-/r1",
            "TP6/qemu-baremetal-pinned/load-in-2-vms/stress-first/r1"]
    scale = 0.0001  # 8 h -> 2.9 s
    report = _run(_builtin("cots-hypervisor"), scale, keys, tmp_path, manifests)
    status = {row[0]: row[1] for row in _table(report, "Study cots-hypervisor")}
    assert status["this campaign"] == "the study's configuration (the built-in scenario unchanged)"
    assert status["duration"] == f"scaled: {scale:g} of the study's durations"
    assert status["repetitions"] == "1 per configuration (the study's)"
    # the domain brief quotes no figure of the COTS tables: each title says so instead of showing a number
    titles = [line for line in report.splitlines() if line.startswith("## COTS-hypervisor study")]
    assert len(titles) == 2 and all(t.endswith("not quoted in rtvirt's reference data") for t in titles), titles
    rows = {(row[0], row[1]): row for row in _table(report, "COTS-hypervisor study: statistics")}
    stats = {key: row for key, row in rows.items() if row[2] != "not run"}
    assert set(stats) == {("baseline-free", "TP1"), ("qemu-pinned", "TP2"), ("qemu-pinned", "TP4"),
                          ("qemu-pinned", "TP6"), ("qemu-baremetal-pinned", "TP2"), ("qemu-baremetal-pinned", "TP6")}
    # the study's other 31 profiles are listed as not run, not left out
    assert len(rows) == 37 and ("xen-rt-pinned", "TP6") in rows and ("kvm-rt-pinned", "TP6") in rows
    assert rows[("xen-rt-pinned", "TP6")][3:] == ["-"] * 9
    for key in keys[4:]:  # our own kernel measured, beside two Linux stressor guests in TP6
        detail = manifests[key]["environment_detail"]
        assert (detail["guest"], detail["guest_kernel"]) == ("baremetal", "rtvirt-baremetal"), detail
    assert [(u["where"], u["vms"]) for u in manifests[keys[5]]["campaign"]["stressors"]] == [("other-vm", 2)]
    for row in stats.values():
        whisker_low, q1, median, q3, whisker_high = (_number(row[i]) for i in (3, 4, 5, 8, 9))
        # samples: 864 planned; an overloaded TCG guest misses periods (37 seen under load 11 here)
        assert whisker_low <= q1 <= median <= q3 <= whisker_high and int(row[2]) >= 10
    stability = _table(report, "COTS-hypervisor study: stability")
    for env, group in stats:
        assert [r[2].split(" (")[0] for r in stability if (r[0], r[1]) == (env, group)] == \
            ["1 h mark", "2 h mark", "4 h mark", "8 h mark"]
    idle, loaded = (manifests[k]["environment_detail"] for k in keys[1:3])
    assert idle["jobs_beside"] == [] and len(loaded["jobs_beside"]) == 1
    argv = loaded["jobs_beside"][0].split()
    assert argv[:2] == ["/rtvirt/bin/rtvirt-stress", "mix"] and {"--workers=10", "--block=67108864"} <= set(argv)
    duration_s = 8 * 3600 * scale
    # after boot, the idle guest's vCPU sleeps between timer periods; the loaded one runs whenever the host
    # lets it (its share depends on the host's other load: 0.05 of the run is a floor, not a goal)
    busy, quiet = loaded["vcpu_cpu_seconds_after_boot"], idle["vcpu_cpu_seconds_after_boot"]
    assert busy > 2 * quiet and busy > 0.05 * duration_s, (quiet, busy)
    in_two_vms = manifests[keys[3]]["campaign"]
    assert [(u["where"], u["vms"], u["workers"]) for u in in_two_vms["stressors"]] == [("other-vm", 2, 5)]


def test_a_modified_cots_scenario_runs_and_says_so(tmp_path: Path) -> None:
    """The timer's period changed from the study's 10 ms: the baseline run (no guest to boot) still comes out
    with its study tables, measured at the new period, and the report names the field that differs."""
    text = builtin_scenarios()["cots-hypervisor"]
    changed = text.replace('params = { interval = "10ms", threads = 1 }', 'params = { interval = "5ms", threads = 1 }')
    assert changed != text
    path = tmp_path / "mine.toml"
    path.write_text(changed)
    scenario, _, _ = load_scenario(path)
    manifests: dict[str, dict[str, Any]] = {}
    report = _run(scenario, 0.0001, ["TP1/baseline-free/no-load/-/r1"], tmp_path / "results", manifests)
    status = {row[0]: row[1] for row in _table(report, "Study cots-hypervisor")}
    assert status["this campaign"] == "modified from the study's configuration: field workload.params.interval"
    stats = [row for row in _table(report, "COTS-hypervisor study: statistics") if row[2] != "not run"]
    assert [(row[0], row[1]) for row in stats] == [("baseline-free", "TP1")]
    # 2.88 s at 5 ms: about 576 periods, more than the study's 10 ms would give (288)
    assert manifests["TP1/baseline-free/no-load/-/r1"]["params"]["interval"] == "5ms" and int(stats[0][2]) > 300


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_the_xen_lab_campaign_reports_the_rt_xen_study(
        lab_campaign: tuple[Path, dict[str, Any]]) -> None:  # noqa: F811 - the imported fixture
    """The Xen lab test campaign declares the RT-Xen study (tests/test_env_xen.py: a modified configuration of
    it, real domUs in the lab): its report has the study's tables, says which fields differ, shows the RTDS
    runs' interruptions with their server, and the paper's configurations it did not run as not run."""
    results, summary = lab_campaign
    ids = {str(run["run_id"]) for run in summary["runs"].values() if run.get("run_id")}
    report = write_report(results, results / "study-report.md", "markdown", run_ids=ids).read_text()
    status = {row[0]: row[1] for row in _table(report, "Study rt-xen-servers")}
    assert status["this campaign"].startswith("modified from the study's configuration: field ")
    holes = {(row[0], row[1], row[2]): row for row in _table(report, "RT-Xen study: interruptions")}
    rtds = holes[("rtds", "rtds-4-10", "alone")]
    assert rtds[3] == "RTDS 4ms every 10ms" and int(rtds[4].replace(",", "")) >= 10
    assert 0.5 <= _number(rtds[5]) <= _number(rtds[6]) and _number(rtds[7]) > 0  # holes above the threshold
    assert rtds[10] == "no published figure for this configuration"
    for key in ("affinity", "rtds", "alone"), ("contention", "rtds", "1-rt-vm"):  # the paper's rows
        assert holes[key][4] == "not run" and holes[key][10] == "not run here"
    assert holes[("affinity", "rtds", "alone")][9] == "25 every 100 (a server's budget ran out)"
    response = {(row[0], row[1]): row for row in _table(report, "RT-Xen study: an idle high-priority VM")}
    timer = response[("default-pool", "alone")]
    assert int(timer[3]) > 0 and _number(timer[4]) <= _number(timer[5]) <= _number(timer[8])



@pytest.mark.vm
@pytest.mark.timeout(1800)
def test_the_cots_studys_xen_profiles_run_on_the_lab_campaigns_boot(
        lab_campaign: tuple[Path, dict[str, Any]],  # noqa: F811 - the imported fixture
        lab_cots_campaign: tuple[Path, dict[str, Any]]) -> None:  # noqa: F811 - the imported fixture
    """The COTS study's TP2 on a Linux domU and on the bare-metal PVH domU (tests/test_env_xen.py
    cots_xen_subset, run in the same `rtvirt run` as the lab campaign, on its lab boot): the study's statistics
    and stability tables carry the Xen rows, the rest of the study's matrix shows as not run."""
    results, summary = lab_cots_campaign
    assert set(summary["runs"]) == {"TP2/xen-pinned/no-load/-/r1", "TP2/xen-baremetal-pinned/no-load/-/r1"}
    assert {run["status"] for run in summary["runs"].values()} <= set(RAN)
    manifests = {key: load_run(results / "runs" / run["run_id"]).manifest for key, run in summary["runs"].items()}
    boots = {m["environment_detail"]["lab"]["boot_seconds"] for m in manifests.values()}
    lab_boot = load_run(results / "runs" / next(iter(lab_campaign[1]["runs"].values()))["run_id"]).manifest
    assert boots == {lab_boot["environment_detail"]["lab"]["boot_seconds"]}  # one lab boot for both campaigns
    bare = manifests["TP2/xen-baremetal-pinned/no-load/-/r1"]["environment_detail"]
    assert bare["guest"] == "baremetal" and bare["applied"]["type"] == "pvh"
    ids = {str(run["run_id"]) for run in summary["runs"].values()}
    report = write_report(results, results / "cots-report.md", "markdown", run_ids=ids).read_text()
    status = {row[0]: row[1] for row in _table(report, "Study cots-hypervisor")}
    assert status["this campaign"].startswith("modified from the study's configuration: field ")
    rows = {(row[0], row[1]): row for row in _table(report, "COTS-hypervisor study: statistics")}
    measured = {key: row for key, row in rows.items() if row[2] != "not run"}
    assert set(measured) == {("xen-pinned", "TP2"), ("xen-baremetal-pinned", "TP2")} and len(rows) == 37
    for row in measured.values():  # 3 s at 10 ms: up to 300 periods (a TCG-nested domU misses some)
        whisker_low, q1, median, q3, whisker_high = (_number(row[i]) for i in (3, 4, 5, 8, 9))
        assert whisker_low <= q1 <= median <= q3 <= whisker_high and 50 <= int(row[2]) <= 301
    stability = _table(report, "COTS-hypervisor study: stability")
    assert sorted((r[0], r[2].split(" (")[0]) for r in stability if r[0] == "xen-pinned") == \
        [("xen-pinned", f"{h} h mark") for h in (1, 2, 4, 8)]

def test_repetitions_are_kept_for_resume(tmp_path: Path) -> None:
    """--repetitions belongs to the campaign like --scale: a --resume with another count is refused (exit 2,
    naming the option) before anything runs."""
    from rtvirt.campaign import CampaignState

    results = tmp_path / "results"
    state = CampaignState.create(results, "interrupt-latency", builtin_scenarios()["interrupt-latency"],
                                 "interrupt-latency", 0.02)
    state.repetitions = 1
    state.save()
    assert CampaignState.load(state.path).repetitions == 1
    refused = run_cli("run", "--resume", "--repetitions", "2", "--out", str(results))
    assert refused.returncode == 2 and "--repetitions" in refused.stderr and "runs 1 repetitions" in refused.stderr
    assert "Traceback" not in refused.stderr
