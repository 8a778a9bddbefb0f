"""Simulated runs in the results store, and the per-task summary.

samples.parquet holds one row per record, all durations in ns in ``response_ns`` (the value field):
job response times (kind ``vm/task``), end-to-end responses of event chains (kind ``chain:NAME``) and gap
probe interruptions (kind ``gap:vm.vcpu``); ``t_ns`` is the job's arrival, the event's arrival or the gap's
start. supply.parquet holds the time each vCPU ran per supply window; gaps.parquet repeats the gaps in the real
``gap`` probe's layout (t_ns, duration_ns, cpu, thread, kind).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..store import RunDir, new_run, write_run
from .core import SimResult, supply_window

__all__ = ["samples_table", "gap_probe_table", "task_summary", "write_simulated_run"]

_SUPPLY_ENCODING = {"window_start_ns": "DELTA_BINARY_PACKED", "supply_ns": "DELTA_BINARY_PACKED"}


def _names(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    array = column.combine_chunks()
    return [str(n) for n in array.dictionary.to_pylist()], array.indices.to_numpy(zero_copy_only=False)


def samples_table(result: SimResult) -> pa.Table:
    """Jobs, chain events and gaps as one table in the store's sample layout (plus extra columns)."""
    task_names, task_codes = _names(result.jobs["task"])
    chain_names, chain_codes = _names(result.chains["chain"])
    vcpu_names, vcpu_codes = _names(result.gaps["vcpu"])
    kinds = task_names + [f"chain:{n}" for n in chain_names] + [f"gap:{n}" for n in vcpu_names]
    j, c, g = result.jobs, result.chains, result.gaps
    n_jobs, n_chains, n_gaps = j.num_rows, c.num_rows, g.num_rows

    def cat(*parts: Any) -> np.ndarray:
        return np.concatenate([np.asarray(p) for p in parts])

    no = np.full
    kind_codes = cat(task_codes, chain_codes + len(task_names), vcpu_codes + len(task_names) + len(chain_names))
    record = cat(no(n_jobs, 0, np.int8), no(n_chains, 1, np.int8), no(n_gaps, 2, np.int8))
    order = np.argsort(cat(j["arrival_ns"], c["arrival_ns"], g["start_ns"]), kind="stable")
    columns = {
        "t_ns": cat(j["arrival_ns"], c["arrival_ns"], g["start_ns"]),
        "response_ns": cat(j["response_ns"], c["response_ns"], g["gap_ns"]),
        "cpu": cat(j["cpu"], c["cpu"], g["cpu"]).astype(np.int16),
        "thread": kind_codes.astype(np.int16),
        "kind": kind_codes.astype(np.int32),
        "record": record,
        "release_ns": cat(j["release_ns"], c["arrival_ns"], g["start_ns"]),
        "start_ns": cat(j["start_ns"], no(n_chains, -1, np.int64), g["start_ns"]),
        "finish_ns": cat(j["finish_ns"], c["finish_ns"], np.asarray(g["start_ns"]) + np.asarray(g["gap_ns"])),
        "deadline_met": cat(j["met"], c["met"], no(n_gaps, True)),
        "event": cat(j["event"], c["event"], no(n_gaps, -1, np.int64)),
    }
    table = {name: values[order] for name, values in columns.items()}
    kind = pa.DictionaryArray.from_arrays(pa.array(table.pop("kind"), pa.int32()), pa.array(kinds, pa.string()))
    arrays = {name: pa.array(values) for name, values in table.items()}
    arrays["kind"] = kind
    record_names = pa.array(["job", "chain", "gap"], pa.string())
    arrays["record"] = pa.DictionaryArray.from_arrays(pa.array(table["record"].astype(np.int32)), record_names)
    ordered = ["t_ns", "response_ns", "cpu", "thread", "kind", "record", "release_ns", "start_ns", "finish_ns",
               "deadline_met", "event"]
    return pa.table({name: arrays[name] for name in ordered})


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
    """Per name: count, mean and max response, misses; one grouping sort instead of a pass per name."""
    size = max(len(names), 1)
    jobs = np.bincount(codes, minlength=size)
    sums = np.bincount(codes, weights=response, minlength=size)
    misses = np.bincount(codes[~met], minlength=size)
    maxima = np.zeros(size, np.int64)
    if codes.size:
        order = np.argsort(codes.astype(np.uint16 if size < 1 << 16 else np.int64), kind="stable")  # radix sort
        present = np.flatnonzero(jobs)
        maxima[present] = np.maximum.reduceat(response[order], (np.cumsum(jobs) - jobs)[present])
    return {name: {"jobs": int(jobs[i]), "mean_response_ns": float(sums[i] / jobs[i]) if jobs[i] else None,
                   "max_response_ns": int(maxima[i]) if jobs[i] else None, "misses": int(misses[i])}
            for i, name in enumerate(names)}


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
                        label: str | None = None) -> tuple[RunDir, dict[str, Any]]:
    """Store one simulation as a run (manifest source "simulated"); returns the run and its task summary.
    ``label`` names the configuration in reports and comparisons (default: the model's name)."""
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
        }
        write_run(run, samples_table(result), manifest)
        for written in side_files:
            written.result()
    return run, summary
