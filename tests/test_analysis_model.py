"""Whole-model analysis (the simulator's model format) and the ``rtvirt analyze`` command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_cli

from rtvirt.analysis.system import analyse_model
from rtvirt.model import model_from_dict

MS = 1_000_000


def model(hypervisor: dict[str, Any], vms: list[dict[str, Any]], **extra: Any) -> Any:
    return model_from_dict({"hypervisor": hypervisor, "vm": vms, **extra})


def bounds(analysis: Any) -> dict[str, int | None]:
    return {f"{t.vm}/{t.task}": t.wcrt for t in analysis.tasks}


BURNS_WELLINGS = [{"name": "a", "period": 7, "execution": 3, "priority": 3},
                  {"name": "b", "period": 12, "execution": 3, "priority": 2},
                  {"name": "c", "period": 20, "execution": 5, "priority": 1}]


def test_partitioned_vm_gets_the_textbook_bounds() -> None:
    m = model({"scheduler": "partitioned", "pcpus": 1}, [{"name": "rt", "vcpu": [{"affinity": [0]}],
                                                          "task": BURNS_WELLINGS}])
    analysis = analyse_model(m)
    assert bounds(analysis) == {"rt/a": 3 * MS, "rt/b": 6 * MS, "rt/c": 20 * MS}
    assert analysis.schedulable
    assert analysis.utilization["rt.vcpu0"]["rm_liu_layland"] is False  # U = 0.929 > 0.780


def test_context_switch_overhead_is_charged_per_job() -> None:
    m = model({"scheduler": "partitioned", "pcpus": 1, "overheads": {"context_switch": "0.1ms"}},
              [{"name": "rt", "vcpu": [{"affinity": [0]}], "task": BURNS_WELLINGS[:2]}])
    # C = 3.2 ms each (two switches per job as tasks share the vCPU): R_a = 3.2, R_b = 6.4.
    assert bounds(analyse_model(m)) == {"rt/a": 3_200_000, "rt/b": 6_400_000}


def test_fifo_deferrable_servers_on_one_cpu() -> None:
    vms = [{"name": "hi", "vcpu": [{"affinity": [0], "priority": 2, "budget": 2, "period": 10}],
            "task": [{"name": "t", "period": 20, "execution": 1}]},
           {"name": "lo", "vcpu": [{"affinity": [0], "priority": 1, "budget": 3, "period": 10}],
            "task": [{"name": "t", "period": 40, "execution": 2}]}]
    analysis = analyse_model(model({"scheduler": "fifo", "server": "deferrable", "pcpus": 1}, vms))
    supplies = {str(ref): s for ref, s in analysis.supplies.items()}
    # hi: R_s = 2. lo: R_s = 3 + ⌈(R + 8)/10⌉·2 -> 3 + 4 = 7 (back-to-back: the hi budget at 8..10 and 10..12).
    assert supplies["hi.vcpu0"].server_response == 2 * MS
    assert supplies["lo.vcpu0"].server_response == 7 * MS
    # lo's guest: EDP(10, 3, 7) blackout 10 + 7 - 6 = 11 ms, then 2 ms -> 13 ms.
    assert bounds(analysis)["lo/t"] == 13 * MS
    # the same servers as pure periodic ones do not defer: R_s = 3 + 2 = 5, blackout 9, bound 11 ms.
    periodic = analyse_model(model({"scheduler": "fifo", "server": "periodic", "pcpus": 1}, vms))
    assert bounds(periodic)["lo/t"] == 11 * MS


def test_arinc653_windows_bound() -> None:
    vms = [{"name": "p1", "vcpu": [{"affinity": [0], "windows": [{"start": 0, "length": 2},
                                                                  {"start": 5, "length": 2}]}],
            "task": [{"name": "t", "period": 50, "execution": 3}]},
           {"name": "p2", "vcpu": [{"affinity": [0], "windows": [{"start": 2, "length": 3}]}]}]
    m = model({"scheduler": "arinc653", "pcpus": 1, "arinc653": {"major_frame": 10}}, vms)
    # From the end of a window (2 or 7), 3 ms of p1-windows take until 7+3 (from 7: 10..12, 15..16) = 9 ms.
    assert bounds(analyse_model(m))["p1/t"] == 9 * MS


def test_unschedulable_task_says_by_how_much() -> None:
    vms = [{"name": "rt", "vcpu": [{"affinity": [0], "budget": 2, "period": 10}],
            "task": [{"name": "t", "period": 20, "execution": 3, "deadline": 15}]}]
    analysis = analyse_model(model({"scheduler": "rtds", "mode": "partitioned", "pcpus": 1}, vms))
    task = analysis.tasks[0]
    # Γ(10, 2): blackout 16, 2 ms, gap 8, 1 ms -> 27 ms: misses its 15 ms deadline by 12 ms.
    assert task.wcrt == 27 * MS and task.slack == -12 * MS and not analysis.schedulable


def test_chain_end_to_end_bound() -> None:
    vms = [{"name": "drv", "vcpu": [{"affinity": [0]}],
            "task": [{"name": "rx", "type": "event", "execution": 1},
                     {"name": "tx", "type": "event", "execution": 1}]},
           {"name": "rt", "vcpu": [{"affinity": [1]}], "task": [{"name": "ctl", "type": "event", "execution": 2}]}]
    m = model({"scheduler": "partitioned", "pcpus": 2, "overheads": {"interrupt_delay": "0.5ms"}}, vms,
              chain=[{"name": "loop", "period": 10, "deadline": 8, "stages": ["drv/rx", "rt/ctl", "drv/tx"]}])
    chain = analyse_model(m).chains[0]
    # rx and tx share the driver (FIFO-equal priority): R_rx = 2 (tx may be queued before it); ctl alone: 2,
    # jitter 1 -> R = 3; tx: jitter 3-2 = 1 -> R = 1 + 1 + 1 = 3. Earliest releases 0.5, 2, 4.5: bound 7.5 ms.
    assert chain.stage_release == (500_000, 2 * MS, 4_500_000)
    assert chain.bound == 7_500_000 and chain.schedulable


def test_analyze_cli_writes_an_analysis_record(tmp_path: Path, results_dir: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("""
[hypervisor]
scheduler = "partitioned"
[[vm]]
name = "rt"
[[vm.vcpu]]
affinity = [0]
[[vm.task]]
name = "a"
period = 7
execution = 3
priority = 2
[[vm.task]]
name = "b"
period = 12
execution = 10
priority = 1
""")
    result = run_cli("analyze", str(path), "--results", str(results_dir), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    rows = {t["task"]: t for t in document["tasks"]}
    assert rows["a"]["wcrt_bound_ns"] == 3 * MS and rows["a"]["schedulable"]
    assert rows["b"]["schedulable"] is False and rows["b"]["wcrt_bound_ns"] is None  # U = 1.26
    manifest = json.loads((Path(document["path"]) / "manifest.json").read_text())
    assert manifest["source"] == "analysis"
    assert {"vm", "task", "wcrt_bound_ns", "deadline_ns", "schedulable", "slack_ns"} <= set(
        manifest["analysis"]["tasks"][0])
    human = run_cli("analyze", str(path), "--results", str(results_dir))
    assert human.returncode == 0 and "no bound" in human.stdout and "deadlines may be missed" in human.stdout
    assert run_cli("analyze", str(path), "--results", str(results_dir), "--strict").returncode == 3


def test_analyze_cli_rejects_invalid_models(tmp_path: Path, results_dir: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[hypervisor]\nscheduler = "partitioned"\n[[vm]]\nname = "x"\n[[vm.task]]\nname = "t"\n'
                    'period = "soon"\nexecution = 1\n')
    result = run_cli("analyze", str(path), "--results", str(results_dir))
    assert result.returncode == 2
    assert "vm[0].task[0].period" in result.stderr and "Traceback" not in result.stderr
