"""The electronic-stability-control case study: SEDF, SEDF' and PSEDF parameters and bounds side by side with
the simulated sweep of non-RT load (`rtvirt analyze MODEL --sweep`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_cli

from rtvirt.analysis.automotive_sweep import automotive_sweep

ESC = Path(__file__).parent.parent / "examples" / "models" / "esc-psedf.toml"
LOADS = [0, 0.45, 0.9]


def _check_rows(rows: list[dict[str, Any]]) -> None:
    assert [row["rule"] for row in rows] == ["sedf", "sedf-prime", "psedf"]
    for row in rows:
        assert [entry["value"] for entry in row["simulated"]] == LOADS
        domains = {d["name"]: d for d in row["domains"]}
        for entry in row["simulated"]:
            assert entry["status"] == "complete"
            if row["rule"] == "psedf":  # r_i bounds the RT-domain stage alone
                for name, response in entry["rt_stage_ns"].items():
                    assert 0 < response <= domains[name]["worst_case_ns"], (name, response)
            else:  # 4p_N + p_i and 2p_N + p_i bound the whole chain
                assert 0 < entry["worst_chain_ns"] <= row["rule_worst_case_ns"]
            if row["analysed_chain_bound_ns"] is not None:
                assert entry["worst_chain_ns"] <= row["analysed_chain_bound_ns"]
            if row["meets_every_deadline"]:
                assert entry["misses"] == 0, (row["rule"], entry)
    psedf = rows[2]
    assert len({entry["worst_chain_ns"] for entry in psedf["simulated"]}) == 1  # isolated from the non-RT load
    # the non-RT domain gets what it asks for under PSEDF, while SEDF's reservations cap it
    served = [max(entry["nonrt_served"].values()) for entry in psedf["simulated"]]
    assert served[0] == 0 and abs(served[2] - 0.9) < 0.02
    assert max(rows[0]["simulated"][2]["nonrt_served"].values()) < 0.2


def test_library_sweep_matches_the_rules() -> None:
    rows = automotive_sweep(ESC, "vm.nonrt.load", LOADS)
    assert all(row.rule.meets_every_deadline for row in rows)
    _check_rows([row.as_dict() for row in rows])


def test_cli_sweep_table_and_record(tmp_path: Path) -> None:
    results = tmp_path / "r"
    text = run_cli("analyze", str(ESC), "--results", str(results), "--sweep", "vm.nonrt.load=0,0.45,0.9",
                   check=True).stdout
    assert "automotive rules vs simulated sweep of vm.nonrt.load" in text
    for rule in ("sedf", "sedf-prime", "psedf"):
        assert f"│ {rule} " in text
    document = json.loads(run_cli("analyze", str(ESC), "--results", str(results), "--json", "--sweep",
                                  "vm.nonrt.load=0,0.45,0.9", check=True).stdout)
    manifest = json.loads((Path(document["path"]) / "manifest.json").read_text())
    record = manifest["analysis"]["automotive_sweep"]
    assert record == document["automotive_sweep"] and record["key"] == "vm.nonrt.load"
    _check_rows(record["rules"])


def test_bad_sweep_exits_2_naming_the_option(tmp_path: Path) -> None:
    for sweep in ("vm.nonrt.load", "=0,1", "vm.nonrt.load=0,lots", "vm.nobody.load=0.5"):
        result = run_cli("analyze", str(ESC), "--results", str(tmp_path / "r"), "--sweep", sweep)
        assert result.returncode == 2 and "--sweep" in result.stderr and "Traceback" not in result.stderr, sweep


def test_sweep_on_local_workers_equals_the_sweep_in_process(tmp_path: Path) -> None:
    documents = []
    for extra in ([], ["--workers", "2"]):
        documents.append(json.loads(run_cli("analyze", str(ESC), "--results", str(tmp_path / "r"), "--json",
                                            "--sweep", "vm.nonrt.load=0,0.9", *extra, check=True,
                                            timeout=300).stdout))
    assert documents[0]["automotive_sweep"] == documents[1]["automotive_sweep"]
    assert [len(rule["simulated"]) for rule in documents[1]["automotive_sweep"]["rules"]] == [2, 2, 2]
