"""How a simulation reaches the results store: the core hands over chunks of jobs, written while it simulates on.
Every record is kept, nothing derivable is stored, and the histogram counted beside the writer is exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from simcases import build

import rtvirt.sim.core as sim_core
from rtvirt.errors import InputError
from rtvirt.model import load_model
from rtvirt.sim import simulate, simulate_to_store, write_simulated_run
from rtvirt.store import _group_histograms, summaries_from_histogram

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
# jitter (release_ns kept), a chain (event kept), random execution times, and a gap probe beside them
JITTER_CHAIN = [{"name": "vm", "vcpu": [{"affinity": [0]}], "task": [
    {"name": "uni", "period": "10ms", "jitter": "1ms", "priority": 3,
     "execution": {"distribution": "uniform", "min": "0.1ms", "max": "0.5ms"}},
    {"name": "ev", "type": "event", "execution": "0.1ms", "priority": 4}]}]
CHAIN = [{"name": "c", "period": "4ms", "jitter": "0.5ms", "stages": ["vm/ev"]}]


def _jobs(result: sim_core.SimResult) -> dict[str, list[int]]:
    return {name: result.jobs[name].to_pylist() for name in result.jobs.column_names}


def test_chunk_boundaries_do_not_change_the_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(EXAMPLES / "eight-vms-rtds.toml", [("simulation.duration", "3s")])
    whole = simulate(model)
    monkeypatch.setattr(sim_core, "CHUNK_ROWS", 997)  # a prime: chunks end anywhere in the schedule
    pieces = simulate(model)
    assert len(pieces.job_chunks) > 5 and len(whole.job_chunks) == 1
    assert _jobs(pieces) == _jobs(whole)
    assert pieces.counters == whole.counters
    assert {k: v.tolist() for k, v in pieces.task_stats.items()} == {k: v.tolist() for k, v in whole.task_stats.items()}
    # the supply comes in blocks of ended windows, vCPU-major within each: the same rows in another order
    assert _supply_rows(pieces) == _supply_rows(whole) and len(_supply_rows(whole)) == 8 * 300


def _supply_rows(result: sim_core.SimResult | pq.ParquetFile) -> list[tuple[str, int, int]]:
    table = result.supply if isinstance(result, sim_core.SimResult) else result.read()
    return sorted(zip(map(str, table["vcpu"].to_pylist()), table["window_start_ns"].to_pylist(),
                      table["supply_ns"].to_pylist(), strict=True))


def test_the_supply_is_stored_a_block_of_windows_at_a_time_while_the_core_simulates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(EXAMPLES / "eight-vms-rtds.toml", [("simulation.duration", "3s")])
    whole = simulate(model)
    monkeypatch.setattr(sim_core, "CHUNK_ROWS", 997)
    _, run, summary = simulate_to_store(model, tmp_path, model_path="inline", params={})
    stored = pq.ParquetFile(run.path / "supply.parquet")
    assert stored.metadata.num_row_groups > 5  # one per chunk the core handed over
    assert _supply_rows(stored) == _supply_rows(whole)
    # every window of every vCPU (10 ms windows over 3 s), adding up to what each vCPU was supplied in total
    rows = _supply_rows(stored)
    assert len(rows) == 8 * 300 and len({(vcpu, start) for vcpu, start, _ in rows}) == len(rows)
    totals: dict[str, int] = {}
    for vcpu, _, supplied in rows:
        totals[vcpu] = totals.get(vcpu, 0) + supplied
    assert totals == summary["supplied_ns"] and min(totals.values()) > 0


def test_stored_samples_hold_every_record_and_an_exact_histogram(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_core, "CHUNK_ROWS", 1000)  # several row groups, each counted on its own
    model = build({"scheduler": "partitioned"}, JITTER_CHAIN, duration="5s", chain=CHAIN)
    result = simulate(model)
    run, summary = write_simulated_run(result, tmp_path, model_path="inline", params={})
    samples = pq.ParquetFile(run.parquet_path)
    assert samples.metadata.num_row_groups > 2
    table = samples.read()
    assert table.column_names == ["t_ns", "response_ns", "cpu", "thread", "kind", "start_ns", "release_ns", "event"]
    jobs, chains = result.jobs, result.chains
    assert table.num_rows == jobs.num_rows + chains.num_rows
    head = table.slice(0, jobs.num_rows)
    assert head["t_ns"].to_pylist() == jobs["arrival_ns"].to_pylist()
    # derived, not stored: finish = t_ns + response_ns
    assert (head["t_ns"].to_numpy() + head["response_ns"].to_numpy()).tolist() == jobs["finish_ns"].to_pylist()
    assert head["release_ns"].to_pylist() == jobs["release_ns"].to_pylist()
    assert head["start_ns"].to_pylist() == jobs["start_ns"].to_pylist()
    assert head["event"].to_pylist() == jobs["event"].to_pylist()
    assert [str(k) for k in head["kind"].to_pylist()] == [str(k) for k in jobs["task"].to_pylist()]
    tail = table.slice(jobs.num_rows)
    assert set(tail["kind"].to_pylist()) == {"chain:c"}
    assert tail["response_ns"].to_pylist() == chains["response_ns"].to_pylist()
    stored = pq.read_table(run.histogram_path)
    recounted = _group_histograms(table, "response_ns")

    def rows(t):  # type: ignore[no-untyped-def]
        return sorted(zip(t["cpu"].to_pylist(), map(str, t["kind"].to_pylist()), t["value"].to_pylist(),
                          t["count"].to_pylist(), strict=True))

    assert rows(stored) == rows(recounted) and len(rows(stored)) > 100  # drawn execution times: many values
    assert _supply_rows(pq.ParquetFile(run.path / "supply.parquet")) == _supply_rows(result) != []
    manifest = json.loads((run.path / "manifest.json").read_text())
    # the statistics counted from the sorted histogram are those the store computes from any histogram
    expected = {group: s.as_dict() for group, s in summaries_from_histogram(stored, "kind").items()}
    assert json.loads(json.dumps(expected)) == manifest["summary"] and list(manifest["summary"])[-1] == "all"
    # the digest holds the same statistics (handed over by the sim, not recomputed by the store)
    digest = json.loads((run.path / "digest.json").read_text())
    assert digest["groups"] == json.loads(json.dumps({g: s.as_json() for g, s in
                                                      summaries_from_histogram(stored, "kind").items()}))
    assert manifest["summary"]["vm/uni"]["samples"] == summary["tasks"]["vm/uni"]["jobs"] > 400
    assert manifest["summary"]["vm/uni"]["max_ns"] == summary["tasks"]["vm/uni"]["max_response_ns"]


@pytest.mark.parametrize("spread", [1_000, 1 << 45], ids=["packed-keys", "wide-values"])
def test_core_histogram_entries_match_numpy(spread: int) -> None:
    """The core's counts sorted by kind, value, cpu and pooled over every group, whether its values fit the
    packed radix-sort keys (a range below 2**40) or take the comparison sort."""
    from rtvirt import _simcore

    rng = np.random.default_rng(5)
    values = rng.integers(0, 1_000, 20_000, dtype=np.int64) * (spread // 1_000)  # values recur
    cpu = rng.integers(0, 4, values.size).astype(np.int16)
    kind = rng.integers(0, 3, values.size).astype(np.int16)
    counts = _simcore.Histograms()
    counts.add(values[:7_000], cpu[:7_000], kind[:7_000])  # two chunks, as the writer thread adds them
    counts.add(values[7_000:], cpu[7_000:], kind[7_000:])
    found = counts.entries()
    keys, expected_counts = np.unique(np.stack([kind, values, cpu]), axis=1, return_counts=True)
    row_kind = found["kinds"][found["kind_index"]]  # each row's kind code
    assert row_kind.tolist() == keys[0].tolist() and found["value"].tolist() == keys[1].tolist()
    assert found["cpu"].tolist() == keys[2].tolist() and found["count"].tolist() == expected_counts.tolist()
    pooled, pooled_counts = np.unique(values, return_counts=True)
    assert found["all_value"].tolist() == pooled.tolist() and found["all_count"].tolist() == pooled_counts.tolist()
    assert len(pooled) < len(keys[0])  # some values recur across groups: the pooling merged them
    # per kind present, its values summed over the CPUs
    assert found["kinds"].tolist() == [0, 1, 2]
    offsets = found["kind_offsets"].tolist()
    for index, code in enumerate(found["kinds"].tolist()):
        mine, mine_counts = np.unique(values[kind == code], return_counts=True)
        a, b = offsets[index], offsets[index + 1]
        assert found["kind_value"][a:b].tolist() == mine.tolist()
        assert found["kind_count"][a:b].tolist() == mine_counts.tolist()
    assert offsets[-1] == found["kind_value"].size


def test_columns_that_would_repeat_t_ns_or_minus_one_are_left_out(tmp_path: Path) -> None:
    model = tmp_path / "plain.toml"
    model.write_text('[hypervisor]\nscheduler = "partitioned"\n[[vm]]\nname = "vm"\n[[vm.vcpu]]\naffinity = [0]\n'
                     '[[vm.task]]\nname = "t"\nperiod = "1ms"\nexecution = "0.2ms"\n')
    document = json.loads(run_cli("sim", str(model), "-D", "0.1", "--results", str(tmp_path / "r"), "--json",
                                  check=True).stdout)
    table = pq.read_table(Path(document["path"]) / "samples.parquet")
    assert table.column_names == ["t_ns", "response_ns", "cpu", "thread", "kind", "start_ns"]
    assert table.num_rows == document["tasks"]["vm/t"]["jobs"] == 100
    assert np.all(table["response_ns"].to_numpy() == 200_000)


def test_more_kinds_than_the_int16_codes_hold_is_refused() -> None:
    tasks = [{"name": f"t{i}", "period": "1s", "execution": "1us"} for i in range(32767)]
    model = build({"scheduler": "partitioned"}, [{"name": "vm", "vcpu": [{"affinity": [0]}], "task": tasks}])
    with pytest.raises(InputError, match="more than 32767 tasks, chains and vCPUs"):
        simulate(model)
