"""An experiment's records in the results store: one run directory (source "analysis", manifest key
``experiment``) whose ``records/`` holds one Parquet file per finished chunk of systems, one row per
(system, scheduler). A chunk file is written atomically when its chunk is back, so an interrupted run keeps
every finished chunk and ``--resume`` knows exactly which remain."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..fileio import write_atomically
from ..store import RunDir, list_runs, new_run, write_run
from .questions import RECORD_COLUMNS
from .spec import Experiment

__all__ = ["SCHEMA", "RECORDS_DIR", "chunk_path", "write_chunk", "read_records", "iter_records", "open_experiment_run",
           "finish_run", "finished_chunks"]

RECORDS_DIR = "records"
SCHEMA = pa.schema([
    ("point", pa.int32()), ("system", pa.int32()), ("target_utilization", pa.float64()), ("vms", pa.int16()),
    ("tasks_per_vm", pa.int16()), ("pcpus", pa.int16()), ("utilizations", pa.string()), ("periods", pa.string()),
    ("deadlines", pa.string()), ("guest_scheduler", pa.string()), ("server_period", pa.float64()),
    ("spare", pa.float64()), ("tasks", pa.int32()), ("utilization", pa.float64()), ("scheduler", pa.string()),
    ("question", pa.string()), ("analysis", pa.string()), ("accepted", pa.bool_()),
    ("bandwidth", pa.float64()), ("overhead", pa.float64()), ("sim_misses", pa.int64()), ("sim_jobs", pa.int64()),
    ("sim_worst_ratio", pa.float64()),
])
assert tuple(SCHEMA.names) == RECORD_COLUMNS


def chunk_path(run: Path, point: int, start: int) -> Path:
    return run / RECORDS_DIR / f"point-{point:05d}-{start:08d}.parquet"


def write_chunk(run: Path, point: int, start: int, columns: dict[str, list[Any]]) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns, schema=SCHEMA), buffer, compression="zstd")
    write_atomically(chunk_path(run, point, start), buffer.getvalue())


def finished_chunks(run: Path) -> dict[tuple[int, int], Path]:
    """(point, first system) -> file of every chunk already written."""
    out = {}
    for path in sorted((run / RECORDS_DIR).glob("point-*.parquet")):
        _, point, start = path.stem.split("-")
        out[(int(point), int(start))] = path
    return out


def read_records(run: Path) -> pa.Table:
    """Every record of the run, ordered by point, system and scheduler (the order is not the workers')."""
    files = sorted((run / RECORDS_DIR).glob("point-*.parquet"))
    if not files:
        return SCHEMA.empty_table()
    table = pa.concat_tables(pq.read_table(f, schema=SCHEMA) for f in files)
    return table.sort_by([("point", "ascending"), ("system", "ascending"), ("scheduler", "ascending"),
                          ("question", "ascending")])


def iter_records(run: Path) -> Iterator[dict[str, Any]]:
    """The records of ``read_records`` in the same order, one chunk file in memory at a time."""
    for _, path in sorted(finished_chunks(run).items()):
        table = pq.read_table(path, schema=SCHEMA).sort_by([("system", "ascending"), ("scheduler", "ascending"),
                                                            ("question", "ascending")])
        yield from table.to_pylist()


def _manifest(experiment: Experiment, status: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"experiment-{experiment.name}", "source": "analysis", "status": status,
            "params": {"experiment": experiment.name, "experiment_digest": experiment.digest(),
                       "seed": experiment.seed, **extra},
            "experiment": experiment.model_dump(mode="json")}


def open_experiment_run(results: Path, experiment: Experiment, resume: bool, extra: dict[str, Any]) -> RunDir:
    """A new run for the experiment, or (``resume``) its latest unfinished run in ``results``."""
    if resume:
        digest = experiment.digest()
        candidates = [r for r in list_runs(results) if r.manifest.get("experiment") is not None
                      and (r.manifest.get("params") or {}).get("experiment_digest") == digest]
        unfinished = [r for r in candidates if r.partial]
        if not unfinished:
            raise InputError(f"option --resume: {results} holds no unfinished run of experiment "
                             f"{experiment.name!r} with these parameters"
                             + (" (its runs are complete)" if candidates else ""))
        stored = unfinished[-1]
        return RunDir(stored.run_id, stored.path)
    run = new_run(results, f"experiment-{experiment.name}")
    (run.path / RECORDS_DIR).mkdir()
    write_run(run, None, _manifest(experiment, "partial", extra))
    return run


def finish_run(run: RunDir, experiment: Experiment, complete: bool, extra: dict[str, Any]) -> None:
    write_run(run, None, _manifest(experiment, "complete" if complete else "partial", extra))
