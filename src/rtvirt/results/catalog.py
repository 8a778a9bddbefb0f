"""The catalog: an embedded DuckDB database (RESULTS/catalog.duckdb) over every run's manifest and Parquet files.

Tables and views (docs/results-store.md):

- ``runs``: one row per run: its provenance and statistics (rtvirt.stores.provenance.COLUMNS: run_id, name,
  source, config, scenario, scenario_sha256, machine, board, kernel, preemption, hypervisor, …, quantity, unit,
  identity, min_value … max_value in the run's unit, min_ns … max_ns only where that unit is ns), path,
  manifest (JSON text).
- ``samples``: every run's samples: run_id, t_ns, value (the run's value_field), cpu, thread, kind, unit.
- ``histograms``: every run's exact histogram: run_id, cpu, kind, value, count, unit.
- ``analysis_tasks``: bounds from analysis runs: run_id, vm, task, wcrt_bound_ns, deadline_ns, schedulable.
- ``experiment_records``: every experiment run's records, one row per system and question (docs/experiments.md).
- ``explain_parts``: every explained run's outlier parts (explain.parquet, docs/explain.md): run_id, sample_t_ns,
  latency_ns, cpu, rank, layer, kind, cause, culprit (what summaries pool by), variant, offset_ns, duration_ns, detail.

The catalog is rebuilt from the store's runs each time it is opened, so it never disagrees with them: a results
directory's in RESULTS/catalog.duckdb, a shared store's in memory (its runs listed by the store's own catalog).
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from ..explain.stored import PARTS_FILE
from ..store import StoredRun
from ..stores import LocalStore, RunStore
from ..stores.provenance import COLUMNS, run_row

__all__ = ["open_catalog", "query"]

_ARROW = {"text": pa.string(), "bigint": pa.int64(), "double precision": pa.float64()}
_RUN_COLUMNS = {**{name: _ARROW[kind] for name, kind in COLUMNS.items()}, "path": pa.string(),
                "manifest": pa.string()}


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _run_row(run: StoredRun) -> dict[str, Any]:
    return {**run_row(run.manifest), "path": str(run.path), "manifest": json.dumps(run.manifest, default=str)}


def _runs_table(runs: list[StoredRun]) -> pa.Table:
    rows = [_run_row(r) for r in runs]
    return pa.table({name: pa.array([row[name] for row in rows], kind) for name, kind in _RUN_COLUMNS.items()})


_NO_RECORDS = ("SELECT NULL::VARCHAR run_id, NULL::INTEGER point, NULL::INTEGER system, NULL::VARCHAR scheduler, "
               "NULL::VARCHAR question, NULL::BOOLEAN accepted WHERE false")


# explain.parquet's columns (rtvirt.explain.stored.PARTS_SCHEMA), dictionary columns read as text; the culprit
# (what summaries pool by) and variant of files written before them are the cause and ""
_PARTS_COLUMNS = ("r.run_id, p.sample_t_ns, p.latency_ns, p.cpu, p.rank, CAST(p.layer AS VARCHAR) AS layer, "
                  "CAST(p.kind AS VARCHAR) AS kind, CAST(p.cause AS VARCHAR) AS cause, {culprit} AS culprit, "
                  "{variant} AS variant, p.offset_ns, p.duration_ns, p.detail")
_CULPRIT = {"culprit": "COALESCE(NULLIF(CAST(p.culprit AS VARCHAR), ''), CAST(p.cause AS VARCHAR))",
            "variant": "COALESCE(CAST(p.variant AS VARCHAR), '')"}
_NO_CULPRIT = {"culprit": "CAST(p.cause AS VARCHAR)", "variant": "''"}
_NO_PARTS = ("SELECT NULL::VARCHAR run_id, NULL::BIGINT sample_t_ns, NULL::BIGINT latency_ns, NULL::SMALLINT cpu, "
             "NULL::INTEGER rank, NULL::VARCHAR layer, NULL::VARCHAR kind, NULL::VARCHAR cause, "
             "NULL::VARCHAR culprit, NULL::VARCHAR variant, NULL::BIGINT offset_ns, NULL::BIGINT duration_ns, "
             "NULL::VARCHAR detail WHERE false")


def _parts_columns(has_culprit: bool) -> str:
    return _PARTS_COLUMNS.format(**(_CULPRIT if has_culprit else _NO_CULPRIT))


def _has_culprit(path: Path) -> bool:
    """Whether an explain.parquet carries culprits (its footer only is read)."""
    return "culprit" in pq.read_schema(path).names


def _union(parts: list[str], empty: str) -> str:
    return " UNION ALL BY NAME ".join(parts) if parts else empty


@contextmanager
def _catalog_file(store: RunStore) -> Iterator[str]:
    """Where the catalog is built: RESULTS/catalog.duckdb under a lock (concurrent rtvirt commands take turns
    refreshing the file), or memory for a shared store, whose readers each build their own."""
    if store.shared:
        yield ":memory:"
        return
    lock_path = store.write_dir / ".catalog.lock"
    try:
        lock = lock_path.open("w")
    except OSError as exc:
        raise InputError(f"{lock_path}: cannot lock the catalog ({exc.strerror})") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield str(store.write_dir / "catalog.duckdb")


@contextmanager
def open_catalog(results: Path | RunStore, manifests: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """Refresh the catalog of a results directory or store from its runs and yield a connection to it.
    ``manifests=False``: a shared store's runs.manifest stays NULL (the full manifests are most of what its
    catalog would transfer: 10-50 kB a run with the system audit)."""
    store = LocalStore(results) if isinstance(results, Path | str) else results
    runs = [] if store.shared else store.list_runs()
    with _catalog_file(store) as database:
        try:
            connection = duckdb.connect(database)
        except duckdb.Error as exc:
            raise InputError(f"{database}: cannot open the catalog ({exc})") from None
        try:
            connection.register("runs_arrow", store.runs_table(manifests) if store.shared  # type: ignore[attr-defined]
                                else _runs_table(runs))
            connection.execute("CREATE OR REPLACE TABLE runs AS SELECT * FROM runs_arrow")
            connection.unregister("runs_arrow")
            if store.shared:
                _shared_views(connection, store.data)  # type: ignore[attr-defined]
            else:
                _run_views(connection, runs)
        except duckdb.Error as exc:
            connection.close()
            raise InputError(f"{store.label}: cannot build the catalog ({str(exc).splitlines()[0]})") from None
        try:
            yield connection
        finally:
            connection.close()


def _run_views(connection: duckdb.DuckDBPyConnection, runs: list[StoredRun]) -> None:
    """samples, histograms and analysis_tasks of a results directory: a view of each run's files."""
    samples, histograms, tasks, experiments, explained = [], [], [], [], []
    for run in runs:
        rid = _sql_string(run.run_id)
        if (run.path / PARTS_FILE).exists():
            explained.append(f"SELECT {_parts_columns(_has_culprit(run.path / PARTS_FILE))} FROM (SELECT {rid} AS "
                             f"run_id) r, read_parquet({_sql_string(str(run.path / PARTS_FILE))}) p")
        unit = _sql_string(run.quantity.unit)
        if run.has_samples and run.value_field:
            value = _sql_name(run.value_field)
            samples.append(f"SELECT {rid} AS run_id, t_ns, {value} AS value, cpu, thread, "
                           f"CAST(kind AS VARCHAR) AS kind, {unit} AS unit "
                           f"FROM read_parquet({_sql_string(str(run.path / 'samples.parquet'))})")
        if (run.path / "histogram.parquet").exists():
            histograms.append(f"SELECT {rid} AS run_id, cpu, kind, value, count, {unit} AS unit FROM "
                              f"read_parquet({_sql_string(str(run.path / 'histogram.parquet'))})")
        if run.manifest.get("experiment") is not None and any((run.path / "records").glob("*.parquet")):
            experiments.append(f"SELECT {rid} AS run_id, * FROM "
                               f"read_parquet({_sql_string(str(run.path / 'records' / '*.parquet'))})")
        for task in ((run.manifest.get("analysis") or {}).get("tasks") or []):
            tasks.append((run.run_id, task.get("vm"), task.get("task"), task.get("wcrt_bound_ns"),
                          task.get("deadline_ns"), task.get("schedulable")))
    connection.execute("CREATE OR REPLACE VIEW experiment_records AS " + _union(experiments, _NO_RECORDS))
    connection.execute("CREATE OR REPLACE VIEW explain_parts AS " + _union(explained, _NO_PARTS))
    connection.execute("CREATE OR REPLACE VIEW samples AS " + _union(samples, (
        "SELECT NULL::VARCHAR run_id, NULL::BIGINT t_ns, NULL::BIGINT value, NULL::SMALLINT cpu, "
        "NULL::SMALLINT thread, NULL::VARCHAR kind, NULL::VARCHAR unit WHERE false")))
    connection.execute("CREATE OR REPLACE VIEW histograms AS " + _union(histograms, (
        "SELECT NULL::VARCHAR run_id, NULL::SMALLINT cpu, NULL::VARCHAR kind, NULL::BIGINT value, "
        "NULL::BIGINT count, NULL::VARCHAR unit WHERE false")))
    connection.execute("CREATE OR REPLACE TABLE analysis_tasks (run_id VARCHAR, vm VARCHAR, task VARCHAR, "
                       "wcrt_bound_ns DOUBLE, deadline_ns DOUBLE, schedulable BOOLEAN)")
    if tasks:
        connection.executemany("INSERT INTO analysis_tasks VALUES (?, ?, ?, ?, ?, ?)", tasks)


def _shared_views(connection: duckdb.DuckDBPyConnection, data: Path) -> None:
    """samples, histograms and analysis_tasks of a shared store: views over the run directories' files by glob,
    joined with the catalog's runs (files placed but not yet committed are left out), instead of a view per run.
    A run's samples hold its value_field: ``value`` is that column of each file."""
    fields = [row[0] for row in connection.execute(
        "SELECT DISTINCT value_field FROM runs WHERE value_field IS NOT NULL ORDER BY 1").fetchall()]
    root = _sql_string(str(data / "runs"))
    if fields and next(data.glob("runs/*/samples.parquet"), None) is not None:
        value = "CASE r.value_field " + " ".join(
            f"WHEN {_sql_string(f)} THEN CAST(s.{_sql_name(f)} AS BIGINT)" for f in fields) + " END"
        connection.execute(
            f"CREATE VIEW samples AS SELECT r.run_id, s.t_ns, {value} AS value, s.cpu, s.thread, "
            f"CAST(s.kind AS VARCHAR) AS kind, r.unit FROM read_parquet({root} || '/*/samples.parquet', "
            "filename = true, union_by_name = true) s JOIN runs r ON s.filename = r.path || '/samples.parquet'")
    else:
        connection.execute("CREATE VIEW samples AS SELECT NULL::VARCHAR run_id, NULL::BIGINT t_ns, NULL::BIGINT "
                           "value, NULL::SMALLINT cpu, NULL::SMALLINT thread, NULL::VARCHAR kind, NULL::VARCHAR unit "
                           "WHERE false")
    if next(data.glob("runs/*/histogram.parquet"), None) is not None:
        connection.execute(
            f"CREATE VIEW histograms AS SELECT r.run_id, h.cpu, CAST(h.kind AS VARCHAR) AS kind, h.value, h.count, "
            f"r.unit FROM read_parquet({root} || '/*/histogram.parquet', filename = true) h "
            "JOIN runs r ON h.filename = r.path || '/histogram.parquet'")
    else:
        connection.execute("CREATE VIEW histograms AS SELECT NULL::VARCHAR run_id, NULL::SMALLINT cpu, "
                           "NULL::VARCHAR kind, NULL::BIGINT value, NULL::BIGINT count, NULL::VARCHAR unit WHERE false")
    if next(data.glob("runs/*/records/*.parquet"), None) is not None:  # experiment runs (docs/experiments.md)
        connection.execute(
            f"CREATE VIEW experiment_records AS SELECT r.run_id, e.* EXCLUDE (filename) "
            f"FROM read_parquet({root} || '/*/records/*.parquet', filename = true, union_by_name = true) e "
            "JOIN runs r ON starts_with(e.filename, r.path || '/records/')")
    else:
        connection.execute("CREATE VIEW experiment_records AS " + _NO_RECORDS)
    if next(data.glob(f"runs/*/{PARTS_FILE}"), None) is not None:  # explained runs (docs/explain.md)
        files = f"read_parquet({root} || '/*/{PARTS_FILE}', filename = true, union_by_name = true)"
        columns = {row[0] for row in connection.execute(f"DESCRIBE SELECT * FROM {files}").fetchall()}
        connection.execute(
            f"CREATE VIEW explain_parts AS SELECT {_parts_columns('culprit' in columns)} FROM {files} p "
            f"JOIN runs r ON p.filename = r.path || '/{PARTS_FILE}'")
    else:
        connection.execute("CREATE VIEW explain_parts AS " + _NO_PARTS)
    connection.execute("CREATE TABLE analysis_tasks (run_id VARCHAR, vm VARCHAR, task VARCHAR, "
                       "wcrt_bound_ns DOUBLE, deadline_ns DOUBLE, schedulable BOOLEAN)")
    tasks = [(run_id, task.get("vm"), task.get("task"), task.get("wcrt_bound_ns"), task.get("deadline_ns"),
              task.get("schedulable"))
             for run_id, manifest in connection.execute(
                 "SELECT run_id, manifest FROM runs WHERE source = 'analysis' AND manifest IS NOT NULL").fetchall()
             for task in ((json.loads(manifest).get("analysis") or {}).get("tasks") or [])]
    if tasks:
        connection.executemany("INSERT INTO analysis_tasks VALUES (?, ?, ?, ?, ?, ?)", tasks)


def query(results: Path | RunStore, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one SQL statement against the catalog; returns (column names, rows)."""
    # a shared store's manifests only when the statement may read them (by name, *, or through analysis_tasks)
    wanted = any(word in sql.lower() for word in ("manifest", "analysis_tasks", "*"))
    with open_catalog(results, manifests=wanted) as connection:
        try:
            cursor = connection.execute(sql)
        except duckdb.Error as exc:
            raise InputError(f"SQL: {str(exc).splitlines()[0]}") from None
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], cursor.fetchall()
