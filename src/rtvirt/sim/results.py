"""Simulated runs in the results store, and the per-task summary.

samples.parquet holds one row per record, all durations in ns in ``response_ns`` (the value field):
job response times (kind ``vm/task``), end-to-end responses of event chains (kind ``chain:NAME``) and gap
probe interruptions (kind ``gap:vm.vcpu``); ``t_ns`` is the job's arrival, the event's arrival or the gap's
start. Nothing derivable is stored (docs/simulator.md): finish = t_ns + response_ns, the record type is the
kind's prefix, a job met its deadline if response_ns <= the task's deadline in the manifest's model;
``release_ns`` is a column only when a task has release jitter, ``event`` only when the model has chains.
The jobs are written a chunk (row group) at a time straight from the core's buffers, in a background thread
while the core simulates the next chunk. supply.parquet holds the time each vCPU ran per supply window, written
the same way, a block of ended windows at a time; gaps.parquet repeats the gaps in the real ``gap`` probe's
layout (t_ns, duration_ns, cpu, thread, kind).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..model import Model
from .core import (
    JobChunk,
    SimResult,
    SupplyChunk,
    core_config,
    optional_columns,
    simulate,
    supply_table,
    supply_window,
    vcpu_names,
)

if TYPE_CHECKING:  # numpy and pyarrow are imported by the writer thread while the core starts (SamplesFile)
    import numpy as np
    import pyarrow as pa

    from ..stats import Summary
    from ..store import RunDir

__all__ = ["simulate_to_store_summary", "gap_probe_table", "task_summary", "simulate_to_store", "write_simulated_run"]

_SUPPLY_ENCODING = {"window_start_ns": "DELTA_BINARY_PACKED", "supply_ns": "DELTA_BINARY_PACKED"}
# Cheap to write (the writer must keep up with the core): no column statistics, delta-encoded time stamps,
# dictionaries only where values repeat by nature (response times of periodic work do, but dictionary encoding
# gives up on the random ones at a cost), zstd on top (fewer bytes to write than lz4/none, as fast here).
_SAMPLES_OPTIONS: dict[str, Any] = {
    "compression": "zstd", "write_statistics": False, "use_dictionary": ["kind", "cpu", "thread"],
    "column_encoding": {name: "DELTA_BINARY_PACKED" for name in ("t_ns", "start_ns", "release_ns", "event")},
}


class SamplesFile:
    """samples.parquet and supply.parquet, written one chunk (row group) at a time by a background thread:
    Parquet encoding releases the GIL, so the core simulates the next chunk meanwhile. pyarrow is imported and
    the files opened in that thread too, while the core simulates its first chunk (the import is ~0.05 s of
    every `rtvirt sim`)."""

    def __init__(self, results: Path, run_name: str, kinds: list[str], vcpu_names: list[str], with_release: bool,
                 with_event: bool) -> None:
        from .. import _simcore  # type: ignore[attr-defined]

        self._counts = _simcore.Histograms()
        self._kind_names = kinds
        self._vcpu_names = vcpu_names
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._opened = self._pool.submit(self._open, results, run_name, with_release, with_event)
        self._pending: list[Future[Any]] = [self._opened]
        self._counted: list[tuple[Future[None], tuple[np.ndarray, ...]]] = []  # each chunk's count, its columns

    def _open(self, results: Path, run_name: str, with_release: bool, with_event: bool) -> RunDir:
        """A new run directory with its samples.parquet open (the store and pyarrow imported here, not before
        the core starts)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..store import new_run

        run = new_run(results, run_name)
        self._kinds = pa.array(self._kind_names, pa.string())
        fields = [("t_ns", pa.int64()), ("response_ns", pa.int64()), ("cpu", pa.int16()), ("thread", pa.int16()),
                  ("kind", pa.dictionary(pa.int16(), pa.string())), ("start_ns", pa.int64())]
        fields += [("release_ns", pa.int64())] * with_release + [("event", pa.int64())] * with_event
        self._schema = pa.schema(fields)
        encodings = {k: v for k, v in _SAMPLES_OPTIONS["column_encoding"].items() if k in self._schema.names}
        self._writer = pq.ParquetWriter(run.parquet_path, self._schema,
                                        **{**_SAMPLES_OPTIONS, "column_encoding": encodings})
        self._supply_writer = pq.ParquetWriter(run.path / "supply.parquet", supply_table([], self._vcpu_names).schema,
                                               compression="zstd", use_dictionary=["vcpu"],
                                               column_encoding=_SUPPLY_ENCODING)
        return run

    @property
    def run(self) -> RunDir:
        """The run the samples go to (once the writer thread has made it)."""
        return self._opened.result()

    def add(self, columns: dict[str, np.ndarray]) -> None:
        """Queue one chunk (numpy columns named as the schema, kind codes as ``thread``); no copy is made."""
        if self._opened.done():
            self._opened.result()  # a run that could not be made stops the simulation here, not at its end
        # counted before written: the statistics wait for the last count, not for the last chunk's encoding
        counted = (columns["response_ns"], columns["cpu"], columns["thread"])
        self._counted.append((self._pool.submit(self._counts.add, *counted), counted))
        self._pending.append(self._pool.submit(self._write, columns))

    def add_jobs(self, chunk: JobChunk) -> None:
        arrival = chunk["arrival"]
        columns = {"t_ns": arrival, "response_ns": chunk["response"], "cpu": chunk["cpu"], "thread": chunk["task"],
                   "start_ns": chunk["start"], "release_ns": chunk.get("release", arrival)}
        if "event" in chunk:
            columns["event"] = chunk["event"]
        self.add(columns)

    def _write(self, columns: dict[str, np.ndarray]) -> None:
        # in the writer thread, encoding without the GIL: the core simulates the next chunk meanwhile
        import pyarrow as pa

        arrays = [pa.array(columns[name]) for name in ("t_ns", "response_ns", "cpu", "thread")]
        arrays.append(pa.DictionaryArray.from_arrays(arrays[3], self._kinds))  # the same buffer as thread
        arrays += [pa.array(columns[name]) for name in self._schema.names[5:]]
        batch = pa.record_batch(arrays, schema=self._schema)
        self._writer.write_batch(batch, row_group_size=max(1, batch.num_rows))

    def add_supply(self, block: SupplyChunk) -> None:
        """Queue one block of supply windows as the core handed it over (no copy is made)."""
        self._pending.append(self._pool.submit(self._write_supply, block))

    def _write_supply(self, block: SupplyChunk) -> None:
        table = supply_table([block], self._vcpu_names)
        self._supply_writer.write_table(table, row_group_size=max(1, table.num_rows))

    def add_supply_table(self, table: pa.Table) -> None:
        """Queue a whole supply table (a finished simulation's, in supply.parquet's layout)."""
        self.later(lambda: self._supply_writer.write_table(table))  # the writer exists once the run is open

    def later(self, write: Callable[..., None], *args: Any, **options: Any) -> None:
        """Run another write in the writer thread, after the chunks queued so far."""
        self._pending.append(self._pool.submit(write, *args, **options))

    def histogram(self, path: Path) -> dict[str, Summary]:
        """Write the exact histogram per (cpu, kind) of every row added to ``path`` in the store's layout
        (histogram.parquet, as store.write_run would; in the writer thread while the statistics are computed)
        and return the statistics per kind and ``all`` that the manifest and digest hold."""
        import pyarrow as pa

        from ..stats import Histogram, summarize_histogram
        from ..store import write_histogram

        # The counts still queued behind an encoding are counted here instead (the order does not matter), once
        # the writer has finished those it started; the side files queued after them are written meanwhile.
        queued = [columns for counted, columns in self._counted if counted.cancel()]
        for counted, _ in self._counted:
            if not counted.cancelled():
                counted.result()
        for columns in queued:
            self._counts.add(*columns)
        found = self._counts.entries()  # sorted by kind, value, cpu; per kind and pooled totals beside
        # kind as a dictionary of the kinds present: the store groups it by its codes (a string column would
        # be factorized with pyarrow.compute, whose import alone costs ~0.1 s)
        present = [self._kind_names[code] for code in found["kinds"]]
        kinds = pa.DictionaryArray.from_arrays(pa.array(found["kind_index"]), pa.array(present, pa.string()))
        table = pa.table({"cpu": found["cpu"], "kind": kinds, "value": found["value"], "count": found["count"]})
        self.later(write_histogram, table, path)
        bounds = found["kind_offsets"].tolist()
        value, count = found["kind_value"], found["kind_count"]
        groups = {name: summarize_histogram(Histogram(value[a:b], count[a:b]))
                  for name, a, b in zip(present, bounds[:-1], bounds[1:], strict=True)}
        result = {name: groups[name] for name in sorted(groups)}
        # pooled by the core: no merge of 1.75 M values here
        result["all"] = summarize_histogram(Histogram(found["all_value"], found["all_count"]))
        return result

    def close(self) -> None:
        try:
            for pending in self._pending:
                pending.result()
        finally:
            self._pool.shutdown()
            for writer in ("_writer", "_supply_writer"):  # those opened (opening the run may have failed)
                if hasattr(self, writer):
                    getattr(self, writer).close()

    def __enter__(self) -> SamplesFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _names(column: pa.ChunkedArray) -> tuple[list[str], np.ndarray]:
    array = column.combine_chunks()
    return [str(n) for n in array.dictionary.to_pylist()], array.indices.to_numpy(zero_copy_only=False)


def _kinds(result_names: list[str], model: Model) -> list[str]:
    return result_names + [f"chain:{c.name}" for c in model.chain] + [f"gap:{v}" for v in vcpu_names(model)]


def _add_chains_and_gaps(samples: SamplesFile, result: SimResult) -> None:
    """The chain events and gaps after the jobs, as the last row group (kind codes after the tasks')."""
    import numpy as np

    c, g = result.chains, result.gaps
    if not c.num_rows and not g.num_rows:
        return
    first_chain, first_gap = len(result.task_names), len(result.task_names) + len(result.model.chain)

    def codes(column: pa.ChunkedArray, offset: int) -> np.ndarray:
        return column.combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int16) + offset

    def both(chain: Any, gap: Any) -> np.ndarray:
        return np.concatenate([np.asarray(chain, np.int64), np.asarray(gap, np.int64)])

    chain_t, gap_t = c["arrival_ns"].to_numpy(), g["start_ns"].to_numpy()
    samples.add({
        "t_ns": both(chain_t, gap_t), "response_ns": both(c["response_ns"].to_numpy(), g["gap_ns"].to_numpy()),
        "cpu": np.concatenate([c["cpu"].to_numpy(), g["cpu"].to_numpy()]).astype(np.int16),
        "thread": np.concatenate([codes(c["chain"], first_chain), codes(g["vcpu"], first_gap)]).astype(np.int16),
        "start_ns": both(np.full(c.num_rows, -1), gap_t), "release_ns": both(chain_t, gap_t),
        "event": both(c["event"].to_numpy(), np.full(g.num_rows, -1)),
    })


def gap_probe_table(result: SimResult) -> pa.Table:
    """Gaps in the real gap probe's layout: t_ns (start), duration_ns (length), cpu, thread (vCPU), kind "gap"."""
    import numpy as np
    import pyarrow as pa

    g = result.gaps
    vcpu = g["vcpu"].combine_chunks()
    return pa.table({
        "t_ns": g["start_ns"], "duration_ns": g["gap_ns"], "cpu": g["cpu"],
        "thread": pa.array(vcpu.indices.to_numpy(zero_copy_only=False).astype(np.int16)),
        "kind": pa.DictionaryArray.from_arrays(pa.array(np.zeros(g.num_rows, np.int32)), pa.array(["gap"])),
        "vcpu": vcpu,
    })


def _stats(names: list[str], codes: np.ndarray, response: np.ndarray, met: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per name: count, mean and max response, misses (numpy counting passes: Arrow's group_by would import
    pyarrow.acero and pyarrow.compute, ~0.1-0.2 s of every `rtvirt sim` here)."""
    import numpy as np

    size = len(names)
    jobs = np.bincount(codes, minlength=size)
    sums = np.bincount(codes, weights=response, minlength=size)  # exact below 2**53 ns in total
    misses = np.bincount(codes, weights=~met, minlength=size)
    top = np.full(size, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(top, codes, response)
    return {name: {"jobs": int(jobs[i]), "mean_response_ns": float(sums[i]) / int(jobs[i]) if jobs[i] else None,
                   "max_response_ns": int(top[i]) if jobs[i] else None, "misses": int(misses[i])}
            for i, name in enumerate(names)}


def task_summary(result: SimResult) -> dict[str, Any]:
    """Per task and per chain: jobs, mean and max response, deadline misses (including jobs still unfinished
    past their deadline at the end); per gap probe: count and max. The tasks' figures are the core's counts."""
    task_names = result.task_names
    recorded = [n for n in task_names if "/load." not in n]
    counts = result.task_stats
    tasks: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(task_names):
        jobs = int(counts["jobs"][index])
        tasks[name] = {"jobs": jobs, "mean_response_ns": float(counts["response_sum"][index]) / jobs if jobs else None,
                       "max_response_ns": int(counts["response_max"][index]) if jobs else None,
                       "misses": int(counts["misses"][index]), "unfinished": 0}
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


def _store(result: SimResult, run: RunDir, samples: SamplesFile, *, model_path: str, params: dict[str, Any],
           label: str | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The rest of a simulated run once its jobs are queued: chains and gaps, side files, histogram, manifest."""
    import pyarrow.parquet as pq

    from ..store import write_run

    _add_chains_and_gaps(samples, result)
    # the side files go to the writer thread too, after the samples
    if result.gaps.num_rows:
        samples.later(pq.write_table, gap_probe_table(result), run.path / "gaps.parquet", compression="zstd")
    statistics = samples.histogram(run.histogram_path)
    summary = task_summary(result)
    samples.close()
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
        "summary": {group: s.as_dict() for group, s in statistics.items()},
        **(extra or {}),
    }
    write_run(run, None, manifest, groups=statistics)  # histogram.parquet is written: only digest and manifest
    return summary


def simulate_to_store(model: Model, results: Path, *, model_path: str, params: dict[str, Any],
                      duration_ns: int | None = None, seed: int | None = None, gantt: tuple[int, int] | None = None,
                      label: str | None = None,
                      extra: dict[str, Any] | None = None) -> tuple[SimResult, RunDir, dict[str, Any]]:
    """Simulate ``model`` into a new run (manifest source "simulated"), writing each chunk of jobs while the
    core simulates the next; returns the result, the run and its task summary. ``label`` names the
    configuration in reports and comparisons (default: the model's name); ``extra`` adds manifest keys.
    The result keeps no jobs (they are in the store): its summary, chains, gaps, supply and Gantt segments."""
    config = core_config(model, duration_ns=duration_ns, seed=seed, gantt=gantt)
    with SamplesFile(results, f"sim-{model.name}", _kinds(config[1], model), vcpu_names(model),
                     *optional_columns(config[0])) as samples:
        result = simulate(model, config=config, on_chunk=samples.add_jobs, on_supply=samples.add_supply,
                          keep_records=False)
        run = samples.run
        summary = _store(result, run, samples, model_path=model_path, params=params, label=label, extra=extra)
    return result, run, summary


def simulate_to_store_summary(model: Model, results: Path, model_path: str, params: dict[str, Any],
                              duration_ns: int | None, seed: int | None,
                              label: str | None) -> tuple[str, str, str, dict[str, Any]]:
    """simulate_to_store for a worker process (positional arguments, as a pool submits them): only plain values
    come back (end reason, run id, run path, task summary); the worker writes the run into ``results``."""
    result, run, summary = simulate_to_store(model, results, model_path=model_path, params=params,
                                             duration_ns=duration_ns, seed=seed, label=label)
    return result.end_reason, run.run_id, str(run.path), summary


def simulate_for_driver(model: Model, duration_ns: int | None, seed: int | None) -> SimResult:
    """A simulation for a cluster worker (positional arguments): every record comes back in the result and the
    driver writes the run (``write_simulated_run``), since a cluster's workers do not see our results directory."""
    return simulate(model, duration_ns=duration_ns, seed=seed, keep_records=True)


def write_simulated_run(result: SimResult, results: Path, *, model_path: str, params: dict[str, Any],
                        label: str | None = None, extra: dict[str, Any] | None = None) -> tuple[RunDir, dict[str, Any]]:
    """Store a finished simulation as a run; as simulate_to_store() otherwise."""
    with_release = bool(result.job_chunks) and "release" in result.job_chunks[0]
    with_event = bool(result.model.chain)
    with SamplesFile(results, f"sim-{result.model.name}", _kinds(result.task_names, result.model),
                     result.vcpu_names, with_release, with_event) as samples:
        run = samples.run
        for chunk in result.job_chunks:
            samples.add_jobs(chunk)
        samples.add_supply_table(result.supply)
        summary = _store(result, run, samples, model_path=model_path, params=params, label=label, extra=extra)
    return run, summary
