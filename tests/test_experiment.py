"""rtvirt experiment: generators, reproducible systems, records in the store, stopping rules, bad input, and the
same records with 1 or 2 local workers, after Ctrl-C + --resume, and on a real Dask cluster (test_experiment_dask)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import RTVIRT, run_cli

from rtvirt.experiment import load, read_records
from rtvirt.experiment.generators import PERIOD_GENERATORS, UTILISATION_GENERATORS, GeneratorError
from rtvirt.experiment.generators.randfixedsum import randfixedsum
from rtvirt.experiment.generators.uunifast import uunifast_discard
from rtvirt.experiment.spec import Experiment, parse_experiment
from rtvirt.experiment.systems import draw_system
from rtvirt.results.catalog import query

SMALL = """
name = "small"
seed = 7
[grid]
utilization = [0.2, 0.5, 0.9]
vms = 3
tasks_per_vm = 3
[samples]
count = 16
chunk = 4
[questions]
schedulers = ["fifo-periodic", "rtds"]
simulate = "300ms"
"""


def experiment_file(tmp_path: Path, text: str = SMALL) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def only_run(results: Path) -> Path:
    runs = list((results / "runs").iterdir())
    assert len(runs) == 1
    return runs[0]


def records_of(results: Path) -> pa.Table:
    return read_records(only_run(results))


@pytest.mark.parametrize("name", ["uunifast-discard", "randfixedsum"])
def test_fixed_count_generators_sum_exactly_within_bounds(name: str) -> None:
    rng = np.random.default_rng(3)
    for total in (0.3, 1.7, 3.6):
        values = UTILISATION_GENERATORS[name](rng, 4, total)
        assert values.size == 4
        assert values.sum() == pytest.approx(total, abs=1e-9)
        assert (values > 0).all() and (values <= 1 + 1e-12).all()


def test_randfixedsum_is_uniform_on_the_simplex() -> None:
    # uniform on {x in [0,1]^3, sum = 1.5}: by symmetry every coordinate has mean 0.5; a wrong table skews them
    rng = np.random.default_rng(11)
    draws = np.array([randfixedsum(rng, 3, 1.5) for _ in range(4000)])
    assert np.allclose(draws.mean(axis=0), 0.5, atol=0.02)
    # the slice is a hexagon: x_1's density is 0.5 + a below 0.5 (the length of {x_2 + x_3 = 1.5 - a} in the
    # unit square), so P(x_1 < 0.25) = (0.125 + 0.03125) / 0.75 = 0.2083, not the 0.25 of a uniform marginal
    assert (draws[:, 0] < 0.25).mean() == pytest.approx(0.2083, abs=0.02)


def test_uunifast_discard_refuses_the_impossible() -> None:
    with pytest.raises(GeneratorError, match="cannot sum"):
        uunifast_discard(np.random.default_rng(1), 2, 2.5)


def test_schedcat_named_distributions() -> None:
    rng = np.random.default_rng(5)
    heavy = UTILISATION_GENERATORS["uni-heavy"](rng, 0, 4.0)
    assert heavy.sum() == pytest.approx(4.0) and (heavy[:-1] >= 0.5).all() and (heavy <= 0.9).all()
    light = UTILISATION_GENERATORS["uni-light"](rng, 0, 1.0)
    assert light.size > 10 and (light <= 0.1).all()
    periods = PERIOD_GENERATORS["uni-short"](rng, 1000)
    assert periods.min() >= 3 and periods.max() <= 33
    engine = PERIOD_GENERATORS["automotive"](rng, 5000)
    assert set(engine.tolist()) <= {1, 2, 5, 10, 20, 50, 100, 200, 1000}
    assert (engine == 10).mean() == pytest.approx(25 / 85, abs=0.03)
    logs = PERIOD_GENERATORS["log-uni-long"](rng, 1000)
    assert logs.min() >= 50 and logs.max() <= 250 and np.median(logs) < 150  # log-uniform leans to the short end


def test_every_system_comes_back_from_seed_point_and_index(tmp_path: Path) -> None:
    plan = load(str(experiment_file(tmp_path)))
    point = plan.points()[1]
    first = draw_system(plan.seed, point, 5, plan.questions)
    again = draw_system(plan.seed, point, 5, plan.questions)
    other = draw_system(plan.seed, point, 6, plan.questions)
    assert first.model == again.model and first.sim_seed == again.sim_seed
    assert first.model != other.model
    assert first.utilization == pytest.approx(0.5, rel=1e-6)
    assert first.tasks == 9 and [len(vm.task) for vm in first.model.vm] == [3, 3, 3]


@pytest.mark.parametrize(("field", "text"), [
    ("questions.schedulers", SMALL.replace('"rtds"]', '"nope"]')),
    ("grid.utilization", SMALL.replace("[0.2, 0.5, 0.9]", "{from = 0.5, to = 0.1, step = 0.1}")),
    ("samples.chunk", SMALL.replace("chunk = 4", "chunk = 0")),
    ("grid.periods", SMALL.replace("tasks_per_vm = 3", 'tasks_per_vm = 3\nperiods = "uni-weird"')),
    ("grid.colour", SMALL.replace("vms = 3", "vms = 3\ncolour = 1")),
])
def test_bad_experiment_files_exit_2_naming_the_field(tmp_path: Path, field: str, text: str) -> None:
    result = run_cli("experiment", str(experiment_file(tmp_path, text)), "--results", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert field in result.stderr and "Traceback" not in result.stderr


def test_unreachable_cluster_exits_2_naming_it(tmp_path: Path) -> None:
    result = run_cli("experiment", str(experiment_file(tmp_path)), "--results", str(tmp_path / "r"),
                     "--cluster", "tcp://127.0.0.1:9", timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--cluster" in result.stderr and "tcp://127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr


def test_one_and_two_workers_give_identical_records_that_simulation_backs(tmp_path: Path) -> None:
    path = experiment_file(tmp_path)
    for workers in (1, 2):
        result = run_cli("experiment", str(path), "--results", str(tmp_path / f"w{workers}"), "--workers",
                         str(workers), "--json", timeout=300)
        assert result.returncode == 0, result.stderr
    one, two = records_of(tmp_path / "w1"), records_of(tmp_path / "w2")
    assert one.num_rows == 3 * 16 * 2 and one.equals(two)
    rows = one.to_pylist()
    # no analysis claims more than simulation shows: an accepted system never misses in its simulation
    assert all(r["sim_misses"] == 0 for r in rows if r["accepted"])
    assert all(r["sim_worst_ratio"] is None or r["sim_worst_ratio"] <= 1.0 for r in rows if r["accepted"])
    summary = json.loads((only_run(tmp_path / "w1") / "summary.json").read_text())
    for scheduler in ("fifo-periodic", "rtds"):
        curve = [c for c in summary["curves"] if c["scheduler"] == scheduler]
        ratios = [c["acceptance"] for c in sorted(curve, key=lambda c: c["target_utilization"])]
        assert ratios == sorted(ratios, reverse=True) and ratios[0] > ratios[-1]
        assert all(c["acceptance"] <= c["sim_no_miss"] for c in curve)
    manifest = json.loads((only_run(tmp_path / "w1") / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["source"] == "analysis"
    columns, found = query(tmp_path / "w1", "SELECT scheduler, count(*), sum(accepted::INT) FROM experiment_records "
                          "GROUP BY scheduler ORDER BY scheduler")
    assert [row[:2] for row in found] == [("fifo-periodic", 48), ("rtds", 48)]
    assert found[0][2] == sum(r["accepted"] for r in rows if r["scheduler"] == "fifo-periodic")
    assert (only_run(tmp_path / "w1") / "experiment.html").read_text().count("<img") == 1


def test_confidence_width_stops_each_point_at_the_same_chunk_whatever_the_workers(tmp_path: Path) -> None:
    text = SMALL.replace("count = 16", "count = 400\nci_width = 0.5").replace('simulate = "300ms"', "")
    path = experiment_file(tmp_path, text)
    for workers in (1, 2):
        result = run_cli("experiment", str(path), "--results", str(tmp_path / f"w{workers}"), "--workers",
                         str(workers), "--json", timeout=300)
        assert result.returncode == 0, result.stderr
    one, two = records_of(tmp_path / "w1"), records_of(tmp_path / "w2")
    assert one.equals(two)
    summary = json.loads(result.stdout)
    for curve in summary["curves"]:
        assert curve["acceptance_high"] - curve["acceptance_low"] < 0.5
        assert curve["systems"] < 400 and curve["systems"] % 4 == 0


def test_ctrl_c_keeps_finished_chunks_and_resume_completes_identically(tmp_path: Path) -> None:
    text = SMALL.replace("count = 16", "count = 48")
    path = experiment_file(tmp_path, text)
    results = tmp_path / "interrupted"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = subprocess.Popen([*RTVIRT, "experiment", str(path), "--results", str(results), "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmpdir)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(results.glob("runs/*/records/*.parquet"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not list(tmpdir.iterdir()), "the local Dask cluster's scratch directory outlived it"
    run = only_run(results)
    kept = len(list((run / "records").glob("*.parquet")))
    assert 3 <= kept < 3 * 12
    assert json.loads((run / "manifest.json").read_text())["status"] == "partial"
    resumed = run_cli("experiment", str(path), "--results", str(results), "--resume", "--workers", "2", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    whole = run_cli("experiment", str(path), "--results", str(tmp_path / "whole"), "--workers", "2", timeout=300)
    assert whole.returncode == 0, whole.stderr
    assert read_records(run).equals(records_of(tmp_path / "whole"))
    again = run_cli("experiment", str(path), "--results", str(results), "--resume")
    assert again.returncode == 2 and "--resume" in again.stderr


def test_builtin_experiments_parse_and_restate_findings() -> None:
    for name in ("rtxen-servers", "sedf-rules"):
        plan = load(name)
        assert plan.findings and plan.description
    assert len(load("rtxen-servers").points()) == 20
    with pytest.raises(Exception, match="not a built-in"):
        load("no-such-experiment")


def test_experiment_travels_to_workers_exactly() -> None:
    plan = parse_experiment({"grid": {"utilization": 0.5}, "questions": {
        "schedulers": ["rtds"], "simulate": "1234567ns", "context_switch": 3.5}}, "x")
    document = json.dumps(plan.model_dump(mode="json"))
    assert Experiment.model_validate(json.loads(document)) == plan  # no duration rounded on the way
    assert plan.questions.simulate == 1_234_567 and plan.questions.context_switch == 3_500


def test_design_on_local_workers_equals_design_in_process(tmp_path: Path) -> None:
    model = str(Path(__file__).parents[1] / "examples" / "models" / "rtxen-servers.toml")
    outputs = []
    for extra in ([], ["--workers", "2"]):
        result = run_cli("design", model, "-s", "rtds", "-s", "arinc653", "-s", "psedf", "--json", "--results",
                         str(tmp_path / "r"), *extra, timeout=300)
        assert result.returncode == 0, result.stderr
        outputs.append(json.loads(result.stdout))
    assert outputs[0]["designs"] == outputs[1]["designs"] and outputs[0]["proven"] == outputs[1]["proven"]
    assert [d["scheduler"] for d in outputs[1]["designs"]] == ["rtds", "arinc653", "psedf"]


def test_uunifast_point_beyond_the_task_count_is_an_input_error() -> None:
    plan = parse_experiment({"grid": {"utilization": 5.0, "vms": 1, "tasks_per_vm": 2},
                             "questions": {"schedulers": ["rtds"]}}, "x")
    with pytest.raises(GeneratorError, match="uunifast-discard"):
        draw_system(plan.seed, plan.points()[0], 0, plan.questions)


def test_design_question_reports_bandwidth_no_smaller_than_the_load(tmp_path: Path) -> None:
    text = SMALL.replace("count = 16", "count = 4").replace("[0.2, 0.5, 0.9]", "[0.4]") \
        .replace('["fifo-periodic", "rtds"]', '["deadline"]').replace('simulate = "300ms"', "design = true")
    result = run_cli("experiment", str(experiment_file(tmp_path, text)), "--results", str(tmp_path / "r"),
                     "--workers", "1", timeout=300)
    assert result.returncode == 0, result.stderr
    rows = records_of(tmp_path / "r").to_pylist()
    assert sorted({r["question"] for r in rows}) == ["design", "shared"] and len(rows) == 8
    designed = [r for r in rows if r["question"] == "design" and r["accepted"]]
    assert designed, "SCHED_DEADLINE designs a 40 % load of 3 VMs"
    # an interface that proves a load can never reserve less than the load (bandwidth per pCPU vs utilisation)
    assert all(r["overhead"] >= -1e-9 and r["bandwidth"] <= 1 + 1e-9 for r in designed)
    shared = {r["system"]: r["bandwidth"] for r in rows if r["question"] == "shared"}
    assert any(r["bandwidth"] < shared[r["system"]] for r in designed)  # design reserves less than sharing all


def test_report_and_list_show_experiments(tmp_path: Path) -> None:
    listed = run_cli("experiment", "--list", "--json")
    assert json.loads(listed.stdout)["experiments"] == ["rtxen-servers", "sedf-rules"]
    text = SMALL.replace("count = 16", "count = 4").replace('simulate = "300ms"', "")
    assert run_cli("experiment", str(experiment_file(tmp_path, text)), "--results", str(tmp_path / "r"),
                   timeout=300).returncode == 0
    out = tmp_path / "report.json"
    assert run_cli("report", str(tmp_path / "r"), "--format", "json", "--out", str(out)).returncode == 0
    section = json.loads(out.read_text())["experiments"][0]
    assert section["name"] == "small" and len(section["curves"]) == 6
    assert section["where"] and all(s.startswith("shared: ") for s in section["where"])
    assert run_cli("report", str(tmp_path / "r"), "--out", str(tmp_path / "r.html")).returncode == 0
    assert "<h2>Experiments</h2>" in (tmp_path / "r.html").read_text()


def test_findings_call_a_lead_insignificant_only_against_schedulers_whose_intervals_overlap() -> None:
    """At U 0.3: fifo-periodic 10/10 [0.72, 1], deadline 9/10 (overlapping) and rtds 3/10 [0.11, 0.60] (not): the
    sentence names deadline as within the interval and never rtds (it used to say "within each other's 95 % CI"
    of the lead over rtds too). At U 0.4 nothing overlaps the lead: no tie is claimed."""
    from rtvirt.experiment.summary import summarize

    axes = {"analysis": "fp-rta", "vms": 4, "tasks_per_vm": 5, "pcpus": 1, "utilizations": "uunifast-discard",
            "periods": "uni-moderate", "deadlines": "implicit", "guest_scheduler": "fp", "server_period": 0.25,
            "spare": 0.5}
    accepted = {(0, 0.3): {"fifo-periodic": 10, "deadline": 9, "rtds": 3},
                (1, 0.4): {"fifo-periodic": 10, "deadline": 2, "rtds": 0}}
    rows = [{**axes, "point": point, "target_utilization": u, "question": "shared", "scheduler": scheduler,
             "accepted": index < count, "utilization": u, "bandwidth": None, "overhead": None, "sim_misses": None,
             "sim_worst_ratio": None}
            for (point, u), by in accepted.items() for scheduler, count in by.items() for index in range(10)]
    sentences = summarize(rows)["where"]
    assert sentences == ["shared: fifo-periodic accepts most at U 0.3 (not significantly more than deadline: their "
                         "95 % CIs overlap)", "shared: fifo-periodic accepts most at U 0.4"], sentences
