"""Simulated runs in the results store, and the per-task summary.

samples.parquet holds one row per record, all durations in ns in ``response_ns`` (the value field):
job response times (kind ``vm/task``), end-to-end responses of event chains (kind ``chain:NAME``) and gap
probe interruptions (kind ``gap:vm.vcpu``); ``t_ns`` is the job's arrival, the event's arrival or the gap's
start. supply.parquet holds the time each vCPU ran per supply window; gaps.parquet repeats the gaps in the real
``gap`` probe's layout (t_ns, duration_ns, cpu, thread, kind).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..store import RunDir, new_run, write_run
from .core import SimResult, supply_window

__all__ = ["samples_table", "gap_probe_table", "task_summary", "write_simulated_run"]

_SUPPLY_ENCODING = {"window_start_ns": "DELTA_BINARY_PACKED", "supply_ns": "DELTA_BINARY_PACKED"}


def _names(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    array = column.combine_chunks()
    return [str(n) for n in array.dictionary.to_pylist()], array.indices.to_numpy(zero_copy_only=False)


_SAMPLE_TYPES = {"t_ns": pa.int64(), "response_ns": pa.int64(), "cpu": pa.int16(), "thread": pa.int16(),
                 "release_ns": pa.int64(), "start_ns": pa.int64(), "finish_ns": pa.int64(),
                 "deadline_met": pa.bool_(), "event": pa.int64()}


def samples_table(result: SimResult) -> pa.Table:
    """Jobs, chain events and gaps as one table in the store's sample layout (plus extra columns).

    Each column is three chunks (jobs, chain events, gaps) over the core's own buffers: no row is copied or
    reordered in Python. Rows are in the core's order (jobs as they finished), not sorted by ``t_ns``;
    readers that need time order sort (results.windows.load_series), as for multi-thread probe runs.
    """
    task_names, task_codes = _names(result.jobs["task"])
    chain_names, chain_codes = _names(result.chains["chain"])
    vcpu_names, vcpu_codes = _names(result.gaps["vcpu"])
    kinds = pa.array(task_names + [f"chain:{n}" for n in chain_names] + [f"gap:{n}" for n in vcpu_names],
                     pa.string())
    j, c, g = result.jobs, result.chains, result.gaps
    kind_codes = [task_codes, chain_codes + len(task_names), vcpu_codes + len(task_names) + len(chain_names)]
    gap_end = pc.add(g["start_ns"], g["gap_ns"])
    parts = {
        "t_ns": (j["arrival_ns"], c["arrival_ns"], g["start_ns"]),
        "response_ns": (j["response_ns"], c["response_ns"], g["gap_ns"]),
        "cpu": (j["cpu"], c["cpu"], g["cpu"]),
        "thread": [codes.astype(np.int16) for codes in kind_codes],
        "release_ns": (j["release_ns"], c["arrival_ns"], g["start_ns"]),
        "start_ns": (j["start_ns"], np.full(c.num_rows, -1, np.int64), g["start_ns"]),
        "finish_ns": (j["finish_ns"], c["finish_ns"], gap_end),
        "deadline_met": (j["met"], c["met"], np.ones(g.num_rows, np.bool_)),
        "event": (j["event"], c["event"], np.full(g.num_rows, -1, np.int64)),
    }
    columns = {name: _chunked(chunks, _SAMPLE_TYPES[name]) for name, chunks in parts.items()}
    columns["kind"] = pa.chunked_array([pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32, copy=False)),
                                                                       kinds) for codes in kind_codes])
    records = pa.array(["job", "chain", "gap"], pa.string())
    columns["record"] = pa.chunked_array([
        pa.DictionaryArray.from_arrays(pa.array(np.full(n, index, np.int32)), records)
        for index, n in enumerate((j.num_rows, c.num_rows, g.num_rows))])
    ordered = ["t_ns", "response_ns", "cpu", "thread", "kind", "record", "release_ns", "start_ns", "finish_ns",
               "deadline_met", "event"]
    return pa.table({name: columns[name] for name in ordered})


def _chunked(chunks: Sequence[Any], kind: pa.DataType) -> pa.ChunkedArray:
    """One column from the jobs', chains' and gaps' parts (zero-copy where the type already matches)."""
    arrays = []
    for part in chunks:
        if isinstance(part, pa.ChunkedArray):
            arrays.extend(part.chunks)
        else:
            arrays.append(pa.array(part))
    return pa.chunked_array([a if a.type == kind else a.cast(kind) for a in arrays], kind)


def gap_probe_table(result: SimResult) -> pa.Table:
    """Gaps in the real gap probe's layout: t_ns (start), duration_ns (length), cpu, thread (vCPU), kind "gap"."""
    g = result.gaps
    vcpu = g["vcpu"].combine_chunks()
    return pa.table({
        "t_ns": g["start_ns"], "duration_ns": g["gap_ns"], "cpu": g["cpu"],
        "thread": pa.array(vcpu.indices.to_numpy(zero_copy_only=False).astype(np.int16)),
        "kind": pa.DictionaryArray.from_arrays(pa.array(np.zeros(g.num_rows, np.int32)), pa.array(["gap"])),
        "vcpu": vcpu,
    })


def _stats(names: list[str], codes: np.ndarray, response: np.ndarray, met: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per name: count, mean and max response, misses (one hash aggregation in Arrow, not a pass per name)."""
    grouped = pa.table({"code": codes, "response": response, "missed": ~met}).group_by("code").aggregate(
        [("response", "count"), ("response", "mean"), ("response", "max"), ("missed", "sum")])
    found = {code: (jobs, mean, top, missed) for code, jobs, mean, top, missed in zip(
        *(grouped[name].to_pylist() for name in ("code", "response_count", "response_mean", "response_max",
                                                  "missed_sum")), strict=True)}
    out: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(names):
        jobs, mean, top, missed = found.get(index, (0, None, None, 0))
        out[name] = {"jobs": int(jobs), "mean_response_ns": mean, "max_response_ns": top, "misses": int(missed)}
    return out


def task_summary(result: SimResult) -> dict[str, Any]:
    """Per task and per chain: jobs, mean and max response, deadline misses (including jobs still unfinished
    past their deadline at the end); per gap probe: count and max."""
    task_names, task_codes = _names(result.jobs["task"])
    recorded = [n for n in task_names if "/load." not in n]
    tasks = _stats(task_names, task_codes, result.jobs["response_ns"].to_numpy(),
                   result.jobs["met"].to_numpy(zero_copy_only=False))
    for stats in tasks.values():
        stats["unfinished"] = 0
    pending_names, pending_codes = _names(result.unfinished["task"])
    overdue = result.unfinished["deadline_ns"].to_numpy() < result.end_time_ns
    for index, name in enumerate(pending_names):
        mask = pending_codes == index
        if name in tasks and mask.any():
            tasks[name]["unfinished"] = int(mask.sum())
            tasks[name]["misses"] += int((mask & overdue).sum())  # still running past its deadline
    chain_names, chain_codes = _names(result.chains["chain"])
    chains = _stats(chain_names, chain_codes, result.chains["response_ns"].to_numpy(),
                    result.chains["met"].to_numpy(zero_copy_only=False))
    gap_names, gap_codes = _names(result.gaps["vcpu"])
    lengths = result.gaps["gap_ns"].to_numpy()
    gaps = {}
    for vm in result.model.vm:
        if vm.gap is None:
            continue
        name = f"{vm.name}.{vm.gap.vcpu}"
        values = lengths[gap_codes == gap_names.index(name)] if name in gap_names else lengths[:0]
        gaps[name] = {"gaps": int(values.size), "max_gap_ns": int(values.max()) if values.size else None,
                      "total_gap_ns": int(values.sum())}
    return {
        "status": "complete" if result.end_reason == "complete" else "partial",
        "end_reason": result.end_reason,
        "simulated_ns": result.end_time_ns,
        "tasks": {name: tasks[name] for name in recorded},
        "chains": chains,
        "gaps": gaps,
        "misses": sum(t["misses"] for t in tasks.values() if t) + sum(c["misses"] for c in chains.values()),
        "supplied_ns": {k.removeprefix("supplied_ns "): v for k, v in result.counters.items()
                        if k.startswith("supplied_ns ")},
    }


def write_simulated_run(result: SimResult, results: Path, *, model_path: str, params: dict[str, Any],
                        label: str | None = None, extra: dict[str, Any] | None = None) -> tuple[RunDir, dict[str, Any]]:
    """Store one simulation as a run (manifest source "simulated"); returns the run and its task summary.
    ``label`` names the configuration in reports and comparisons (default: the model's name); ``extra``
    adds manifest keys (a prediction's link to the measured configuration)."""
    run = new_run(results, f"sim-{result.model.name}")
    # Parquet encoding releases the GIL: the side files are written while the samples are put together
    with ThreadPoolExecutor(max_workers=1) as writer:
        side_files = [writer.submit(pq.write_table, result.supply, run.path / "supply.parquet", compression="zstd",
                                    use_dictionary=["vcpu"], column_encoding=_SUPPLY_ENCODING)]
        if result.gaps.num_rows:
            side_files.append(writer.submit(pq.write_table, gap_probe_table(result), run.path / "gaps.parquet",
                                            compression="zstd"))
        summary = task_summary(result)
        manifest = {
            "name": f"sim {result.model.name}",
            "source": "simulated",
            "probe": "sim",
            "value_field": "response_ns",
            "status": summary["status"],
            "end_reason": result.end_reason,
            "params": params,
            "config": label or result.model.name,
            "model_path": model_path,
            "model": result.model.model_dump(mode="json"),
            "simulation": {"scheduler": result.model.hypervisor.scheduler, "duration_ns": result.duration_ns,
                           "supply_window_ns": supply_window(result.model, result.duration_ns),
                           "simulated_ns": result.end_time_ns, **{k: v for k, v in result.counters.items()
                                                                  if not k.startswith("supplied_ns ")}},
            "sim_summary": summary,
            **(extra or {}),
        }
        write_run(run, samples_table(result), manifest)
        for written in side_files:
            written.result()
    return run, summary
