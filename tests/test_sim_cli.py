"""`rtvirt sim` as users run it: bad models exit 2 naming the field, runs land in the store, caps are clear."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import RTVIRT, run_cli

from rtvirt.errors import InputError
from rtvirt.model import load_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"

GOOD = """
[hypervisor]
scheduler = "fifo"
server = "deferrable"

[[vm]]
name = "rt"
[[vm.vcpu]]
priority = 2
budget = "2ms"
period = "5ms"
[[vm.task]]
name = "ctl"
period = "5ms"
execution = "1ms"
"""


@pytest.mark.parametrize(("change", "field", "line"), [
    (('period = "5ms"\n[[vm.task]]', 'period = "5 parsecs"\n[[vm.task]]'), "vm[0].vcpu[0].period", 11),
    (('execution = "1ms"', 'execution = "1ms"\nwcet = 3'), "vm[0].task[0].wcet", 16),
    (('budget = "2ms"\n', ''), "vm[0].vcpu[0]", 8),
    (('budget = "2ms"', 'budget = "6ms"'), "vm[0].vcpu[0].budget", 10),
    (('scheduler = "fifo"', 'scheduler = "cfs"'), "hypervisor.scheduler", 3),
    (('name = "ctl"', 'name = "ctl"\nvcpu = 3'), "vm[0].task[0].vcpu", 14),
    (('priority = 2', 'priority = 2\naffinity = "0-3"'), "vm[0].vcpu[0].affinity", 10),
])
def test_invalid_model_exits_2_naming_field_and_line(tmp_path: Path, change: tuple[str, str], field: str,
                                                      line: int) -> None:
    assert change[0] in GOOD
    model = tmp_path / "bad.toml"
    model.write_text(GOOD.replace(change[0], change[1], 1))
    result = run_cli("sim", str(model), "--results", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert str(model) in result.stderr and field in result.stderr and f"line {line}" in result.stderr
    assert "Traceback" not in result.stderr


def test_chain_naming_a_missing_task_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "chain.toml"
    model.write_text(GOOD + '\n[[chain]]\nname = "c"\nperiod = "10ms"\nstages = ["rt/nope"]\n')
    with pytest.raises(InputError, match=r"chain\[0\]\.stages\[0\].*'rt/nope' is not an event task"):
        load_model(model)


def test_toml_syntax_error_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[hypervisor\nscheduler = 1\n")
    result = run_cli("sim", str(broken))
    assert result.returncode == 2 and "not valid TOML" in result.stderr and "line 1" in result.stderr
    result = run_cli("sim", str(tmp_path / "missing.toml"))
    assert result.returncode == 2 and "missing.toml" in result.stderr


def test_bad_options_exit_2(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text(GOOD)
    for args, needle in ((["-D", "soon"], "--duration"), (["--set", "vm.nobody.load=0.5"], "vm.nobody"),
                         (["--sweep", "vm.rt.load"], "--sweep"), (["--gantt", "g.svg", "--from", "5", "--to", "1"],
                                                                  "--to")):
        result = run_cli("sim", str(model), "--results", str(tmp_path / "r"), *args)
        assert result.returncode == 2 and needle in result.stderr, (args, result.stderr)


def test_a_results_directory_that_cannot_hold_a_run_exits_2_naming_it(tmp_path: Path) -> None:
    # the run is made in the writer thread while the core starts: its failure still ends the command as bad input
    model = tmp_path / "m.toml"
    model.write_text(GOOD)
    result = run_cli("sim", str(model), "--results", "/proc/rtvirt-results", "-D", "60")
    assert result.returncode == 2 and "results directory /proc/rtvirt-results" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_event_cap_stops_with_a_clear_partial_run(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text(GOOD + "\n[simulation]\nduration = \"1h\"\nevent_cap = 5000\n")
    result = run_cli("sim", str(model), "--results", str(tmp_path / "r"), timeout=60)
    assert result.returncode == 0
    assert "event cap" in result.stdout and "simulation.event_cap = 5000" in result.stdout
    document = json.loads(run_cli("sim", str(model), "--results", str(tmp_path / "r"), "--json").stdout)
    assert document["status"] == "partial" and document["end_reason"] == "event-cap"
    assert 0 < document["simulated_ns"] < 3_600_000_000_000
    manifest = json.loads((Path(document["path"]) / "manifest.json").read_text())
    assert manifest["status"] == "partial" and manifest["source"] == "simulated"


def test_run_is_stored_and_readable_by_stats_with_gantt(tmp_path: Path) -> None:
    results, svg = tmp_path / "r", tmp_path / "g.svg"
    result = run_cli("sim", str(EXAMPLES / "esc-psedf.toml"), "-D", "0.2", "--results", str(results), "--json",
                     "--gantt", str(svg), "--from", "0", "--to", "5ms", check=True)
    document = json.loads(result.stdout)
    assert document["chains"]["wheel1"]["jobs"] == 80 and document["misses"] == 0
    run_dir = Path(document["path"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["source"] == "simulated" and manifest["value_field"] == "response_ns"
    assert manifest["summary"]["chain:wheel1"]["samples"] == 80
    stats = run_cli("stats", str(run_dir), "--json", check=True)
    assert "response" in stats.stdout or "samples" in stats.stdout
    root = ET.fromstring(svg.read_text())  # well-formed XML: labels are escaped
    assert sum(1 for e in root.iter() if e.tag.endswith("rect")) > 10


def test_gap_probe_run_has_gap_probe_layout(tmp_path: Path) -> None:
    # G spins at priority 1, H takes the pCPU 2 ms of every 10 ms: gaps of 2 ms at 10, 20, ... 90 ms.
    model = tmp_path / "gap.toml"
    model.write_text('[hypervisor]\nscheduler = "fifo"\n[[vm]]\nname = "g"\n[[vm.vcpu]]\npriority = 1\n'
                     '[vm.gap]\nthreshold = "10us"\n[[vm]]\nname = "h"\n[[vm.vcpu]]\npriority = 2\n'
                     '[[vm.task]]\nname = "t"\nperiod = "10ms"\nexecution = "2ms"\n')
    document = json.loads(run_cli("sim", str(model), "-D", "0.1", "--results", str(tmp_path / "r"), "--json",
                                  check=True).stdout)
    assert document["gaps"]["g.0"] == {"gaps": 9, "max_gap_ns": 2_000_000, "total_gap_ns": 18_000_000}
    gaps = pq.read_table(Path(document["path"]) / "gaps.parquet")
    assert gaps.column_names[:5] == ["t_ns", "duration_ns", "cpu", "thread", "kind"]
    assert gaps["t_ns"].to_pylist() == [k * 10_000_000 for k in range(1, 10)]
    assert set(gaps["duration_ns"].to_pylist()) == {2_000_000}


def test_sweep_writes_one_run_per_value(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text(GOOD + '\n[[vm]]\nname = "be"\n[[vm.vcpu]]\npriority = 3\nbudget = "5ms"\nperiod = "5ms"\n')
    result = run_cli("sim", str(model), "-D", "0.1", "--results", str(tmp_path / "r"), "--json",
                     "--sweep", "vm.be.load=0,0.2,0.4", check=True)
    runs = json.loads(result.stdout)["runs"]
    assert [r["sweep"]["vm.be.load"] for r in runs] == [0, 0.2, 0.4]
    # the loaded VM has the higher priority and runs first every 10 ms (2 ms, then 4 ms): rt/ctl waits for it
    assert [r["tasks"]["rt/ctl"]["max_response_ns"] for r in runs] == [1_000_000, 3_000_000, 5_000_000]
    # on two worker processes: the same runs, written by the workers into the same store
    parallel = json.loads(run_cli("sim", str(model), "-D", "0.1", "--results", str(tmp_path / "r"), "--json",
                                  "--sweep", "vm.be.load=0,0.2,0.4", "--workers", "2", check=True).stdout)["runs"]
    assert [{k: v for k, v in r.items() if k not in ("run_id", "path")} for r in parallel] == \
        [{k: v for k, v in r.items() if k not in ("run_id", "path")} for r in runs]
    assert all(Path(r["path"], "manifest.json").exists() for r in parallel)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_shipped_examples_run(example: str, tmp_path: Path) -> None:
    result = run_cli("sim", str(EXAMPLES / example), "-D", "0.05", "--results", str(tmp_path / "r"), "--json",
                     check=True)
    assert json.loads(result.stdout)["status"] == "complete"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stores_the_partial_run(tmp_path: Path, sig: signal.Signals) -> None:
    # busy but with few records: background load (not recorded) in 10 us pieces, one recorded task per 100 ms
    model = tmp_path / "busy.toml"
    model.write_text('[hypervisor]\nscheduler = "partitioned"\n[[vm]]\nname = "busy"\nload = 0.5\n'
                     'load_period = "10us"\n[[vm.vcpu]]\naffinity = [0]\n[[vm.task]]\nname = "t"\n'
                     'period = "100ms"\nexecution = "1us"\npriority = 1\n[simulation]\n'
                     'event_cap = 1_000_000_000_000\n')
    proc = subprocess.Popen([*RTVIRT, "sim", str(model), "-D", "1000h", "--results", str(tmp_path / "r"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wait until it has used 2.5 s of CPU: past the imports (~1 s), inside the core (100 h would take minutes)
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        if int(fields[11]) + int(fields[12]) >= 2.5 * ticks:  # utime + stime
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    finally:  # a run that ignored the signal must not outlive the test (a 1000 h simulation)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    document = json.loads(out)
    assert document["status"] == "partial" and document["end_reason"] == "interrupted"
    assert 0 < document["simulated_ns"] < 100 * 3_600_000_000_000
    assert sum(t["jobs"] for t in document["tasks"].values()) > 0
