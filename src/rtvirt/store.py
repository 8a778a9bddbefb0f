"""The results store: one directory per run with its manifest, raw stream, Parquet samples and histogram.

Layout and schema: docs/results-store.md ::

    RESULTS/runs/<run_id>/manifest.json       what ran, where, with which parameters; complete or partial
    RESULTS/runs/<run_id>/samples.rtvs        the agent's raw stream, kept as taken (measured runs)
    RESULTS/runs/<run_id>/samples.parquet     the samples as columns: t_ns, <value_field>, cpu, thread, kind, [aux]
    RESULTS/runs/<run_id>/histogram.parquet   exact histogram per (cpu, kind): cpu, kind, value, count
    RESULTS/runs/<run_id>/digest.json         statistics, time profile, largest samples (digest.py)
    RESULTS/runs/<run_id>/series.parquet      every k-th sample, for plots
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import __version__
from .errors import InputError, first_validation_error
from .fileio import write_atomically
from .identity import run_identity
from .quantity import Quantity, run_quantity
from .stats import Histogram, HistogramBuilder, Summary, summarize_histogram, summarize_stream
from .stream import MISSED_PERIOD_STATS, SampleStream

__all__ = ["RunDir", "Manifest", "StoredRun", "new_run", "write_run", "write_measured_run", "write_failed_run",
           "write_digest", "load_run", "missed_periods",
           "list_runs", "resolve_runs", "histogram_table", "open_parquet", "write_histogram", "MANIFEST_VERSION"]

MANIFEST_VERSION = 1
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class RunDir:
    run_id: str
    path: Path

    @property
    def stream_path(self) -> Path:
        return self.path / "samples.rtvs"

    @property
    def parquet_path(self) -> Path:
        return self.path / "samples.parquet"

    @property
    def histogram_path(self) -> Path:
        return self.path / "histogram.parquet"

    @property
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"


class TimelineEvent(BaseModel):
    t_ns: int
    event: str = Field(max_length=500)


class AnalysisTask(BaseModel):
    model_config = ConfigDict(extra="allow")
    vm: str
    task: str
    wcrt_bound_ns: float | None = None
    deadline_ns: float | None = None
    schedulable: bool | None = None


class Analysis(BaseModel):
    model_config = ConfigDict(extra="allow")
    tasks: list[AnalysisTask] = []


class Manifest(BaseModel):
    """What every manifest.json holds; producers may add more keys (kept as given)."""

    model_config = ConfigDict(extra="allow")
    manifest_version: int = MANIFEST_VERSION
    run_id: str
    name: str = Field(max_length=500)
    source: Literal["measured", "simulated", "imported", "analysis"]
    probe: str | None = None
    value_field: str | None = None
    quantity: str | None = None  # what the values measure and their unit (rtvirt.quantity, from value_field)
    unit: str | None = None
    # failed: no sample reached the host; short: ran to its end with far fewer samples than it promised
    status: Literal["complete", "partial", "short", "failed"] = "complete"
    params: dict[str, Any] = {}
    summary: dict[str, dict[str, float | int | None]] = {}
    dropped: int = 0
    created: str
    scenario: str | None = None
    environment: str | None = None
    config: str | None = None
    identity: dict[str, Any] | None = None  # what makes runs comparable (rtvirt.identity, from the fields above)
    repetition: int | None = None
    timeline: list[TimelineEvent] = []
    system: dict[str, Any] = {}
    analysis: Analysis | None = None


def new_run(results: Path, label: str) -> RunDir:
    """Create a fresh, uniquely named run directory under ``results/runs``."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    safe_label = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:64]
    run_id = f"{stamp}-{safe_label}-{secrets.token_hex(2)}"
    path = Path(results) / "runs" / run_id
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"results directory {results}: cannot create a run there ({exc.strerror})") from None
    return RunDir(run_id, path)


def _validated(manifest: dict[str, Any], where: str) -> Manifest:
    try:
        return Manifest.model_validate(manifest)
    except ValidationError as exc:
        path, message = first_validation_error(exc)
        raise InputError(f"{where}: manifest field '{path}': {message}") from None


def _compact(table: pa.Table, value_field: str) -> pa.Table:
    """Store latencies as int32 when they fit: half the bytes to read back, same values."""
    column = table[value_field]
    if pa.types.is_integer(column.type) and column.type != pa.int32() and len(column):
        import pyarrow.compute as pc  # ~50 ms to import: only the write paths need it, not `rtvirt stats`

        lo, hi = pc.min_max(column).values()
        if lo.as_py() is not None and _INT32.min <= lo.as_py() and hi.as_py() <= _INT32.max:
            table = table.set_column(table.schema.get_field_index(value_field), value_field,
                                     column.cast(pa.int32()))
    return table


def histogram_table(groups: Iterable[tuple[int, str, Histogram]]) -> pa.Table:
    """The stored histogram layout (cpu, kind, value, count) from per-(cpu, kind) histograms."""
    import pyarrow.compute as pc

    groups = list(groups)
    kind_names = list(dict.fromkeys(kind for _, kind, _ in groups))
    code = {kind: i for i, kind in enumerate(kind_names)}

    def joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)

    kinds = joined([np.full(h.values.size, code[kind], np.int32) for _, kind, h in groups], np.int32)
    return pa.table({
        "cpu": pa.array(joined([np.full(h.values.size, cpu, np.int16) for cpu, _, h in groups], np.int16)),
        # strings gathered in Arrow, not a Python object per row (a long simulation has millions of rows)
        "kind": pc.take(pa.array(kind_names, pa.string()), pa.array(kinds)),
        "value": pa.array(joined([h.values for _, _, h in groups], np.int64)),
        "count": pa.array(joined([h.counts for _, _, h in groups], np.int64)),
    })


def _group_histograms(table: pa.Table, value_field: str) -> pa.Table:
    """Exact histogram of the value column per (cpu, kind) group."""
    values = table[value_field].to_numpy()
    n = len(values)
    cpus = table["cpu"].to_numpy() if "cpu" in table.column_names else np.zeros(n, np.int16)
    if "kind" in table.column_names:
        kind_column = table["kind"].combine_chunks()
        if pa.types.is_dictionary(kind_column.type):
            kind_names = [str(k) for k in kind_column.dictionary.to_pylist()]
            kinds = kind_column.indices.to_numpy(zero_copy_only=False)
        else:
            kind_names, kinds = _factorize(kind_column)
    else:
        kind_names, kinds = [""], np.zeros(n, np.int32)
    if _repetitive(values):
        return _hashed_histograms(cpus, kinds, kind_names, values)
    keys = cpus.astype(np.int64) * (len(kind_names) + 1) + kinds.astype(np.int64)
    sizes = np.bincount(keys)  # a counting pass
    distinct_keys = np.flatnonzero(sizes)
    if distinct_keys.size > 1:
        # one stable sort by group (radix on small keys) instead of a masked pass over every sample per group
        compact = np.searchsorted(distinct_keys, keys).astype(np.uint16 if distinct_keys.size < 1 << 16 else np.int64)
        values = values[np.argsort(compact, kind="stable")]
    ends = np.cumsum(sizes[distinct_keys])
    groups = []
    for key, end, size in zip(distinct_keys, ends, sizes[distinct_keys], strict=True):
        cpu, kind = divmod(int(key), len(kind_names) + 1)
        groups.append((cpu, kind_names[kind], Histogram.of(values[end - size:end])))
    return histogram_table(groups)


def _repetitive(values: np.ndarray) -> bool:
    """Few distinct values (simulated response times repeat, measured ns latencies rarely do), judged on a
    strided subsample: then one hash aggregation counts every group at once, ~10x faster than sorting."""
    probe = values[:: max(1, values.size // 65_536)]
    return probe.size >= 1024 and np.unique(probe).size * 64 <= probe.size


def _hashed_histograms(cpus: np.ndarray, kinds: np.ndarray, kind_names: list[str], values: np.ndarray) -> pa.Table:
    import pyarrow.compute as pc

    counted = pa.table({"cpu": cpus, "kind": kinds, "value": values}).group_by(
        ["cpu", "kind", "value"], use_threads=False).aggregate([("value", "count")])
    counted = counted.sort_by([("cpu", "ascending"), ("kind", "ascending"), ("value", "ascending")])
    return pa.table({
        "cpu": counted["cpu"].cast(pa.int16()),
        "kind": pc.take(pa.array(kind_names, pa.string()), counted["kind"]),
        "value": counted["value"].cast(pa.int64()),
        "count": counted["value_count"].cast(pa.int64()),
    })


def _factorize(column: pa.Array) -> tuple[list[str], np.ndarray]:
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column.cast(pa.string()))
    return [str(k) for k in encoded.dictionary.to_pylist()], encoded.indices.to_numpy(zero_copy_only=False)


def summaries_from_histogram(histogram: pa.Table, group_by: str | None, dropped: int = 0) -> dict[str, Summary]:
    """Per-group (``cpu`` or ``kind``) and ``all`` summaries from a stored histogram table."""
    result: dict[str, Summary] = {}
    if group_by and histogram.num_rows:
        column = histogram[group_by].combine_chunks()
        # codes, not a Python object per row; stored kinds are read as a dictionary (histogram_table)
        if pa.types.is_dictionary(column.type):
            groups, codes = column.dictionary.to_pylist(), column.indices.to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(column.type):
            distinct, codes = np.unique(column.to_numpy(), return_inverse=True)
            groups = distinct.tolist()
        else:
            groups, codes = _factorize(column)
        values, counts = histogram["value"].to_numpy(), histogram["count"].to_numpy()
        for code, group in sorted(enumerate(groups), key=lambda item: str(item[1])):
            mask = codes == code
            label = f"cpu {group}" if group_by == "cpu" else str(group)
            result[label] = summarize_histogram(Histogram.merged([Histogram(values[mask], counts[mask])]))
    result["all"] = summarize_histogram(Histogram.merged([_as_histogram(histogram)]), dropped)
    return result


def _as_histogram(table: pa.Table) -> Histogram:
    return Histogram(table["value"].to_numpy(), table["count"].to_numpy())


def write_run(run: RunDir, table: pa.Table | None, manifest: dict[str, Any], *,
              histogram: pa.Table | None = None, group_by: str | None = "kind",
              groups: dict[str, Summary] | None = None) -> dict[str, Any]:
    """Write any run: samples (if any), their exact histogram, and the validated manifest.

    ``manifest`` needs at least ``name`` and ``source``; ``run_id``, ``created`` and ``manifest_version``
    are filled in, and ``summary`` (per ``group_by`` column and ``all``) is computed when absent.
    ``histogram`` (columns cpu, kind, value, count) is for sources that only kept counts (imported
    cyclictest -h, rtla hist); with samples it is computed from them. ``groups`` are the digest's statistics
    when the writer already has them (a simulated run: the core counted them), else they come from ``histogram``.
    """
    document = {"manifest_version": MANIFEST_VERSION, "run_id": run.run_id,
                "created": dt.datetime.now(dt.UTC).isoformat(), "status": "complete", "dropped": 0,
                "rtvirt_version": __version__, **manifest}
    if document.get("value_field"):
        document |= run_quantity(document).as_dict()
    document["identity"] = run_identity(document)
    if table is not None:
        value_field = document.get("value_field")
        if not value_field or value_field not in table.column_names:
            raise InputError(f"run {run.run_id}: value_field {value_field!r} is not a column of the samples")
        table = _compact(table, value_field)
        # Parquet encoding releases the GIL: the exact histogram is counted while the samples are written
        with ThreadPoolExecutor(max_workers=1) as writer:
            written = writer.submit(pq.write_table, table, run.parquet_path, compression="zstd",
                                    use_dictionary=["kind"], column_encoding=_delta_encoded(table))
            histogram = _group_histograms(table, value_field)
            write_digest(run, document, table, histogram, groups)  # while the samples are still being encoded
            written.result()
    else:
        write_digest(run, document, None, histogram, groups)
    if histogram is not None:
        write_histogram(histogram, run.histogram_path)
        if "summary" not in document:
            summaries = summaries_from_histogram(histogram, group_by, int(document.get("dropped", 0)))
            document["summary"] = {group: s.as_dict() for group, s in summaries.items()}
    _validated(document, str(run.manifest_path))
    write_atomically(run.manifest_path, json.dumps(_json_safe(document), indent=2, default=str))
    return document


def write_digest(run: RunDir, manifest: dict[str, Any], table: pa.Table | None, histogram: pa.Table | None,
                 groups: dict[str, Summary] | None = None) -> None:
    """digest.json and series.parquet beside the samples: the statistics, time profile, largest samples and
    plot series that `rtvirt stats` and the report read instead of the samples (rtvirt.digest).
    Every writer of runs must call it; write_run does. ``manifest`` needs ``run_id`` (and ``timeline``,
    ``source``, ``dropped``, ``value_field`` as the manifest will hold them)."""
    from .digest import stats_grouping
    from .digest import write_digest as write

    if groups is None and histogram is not None:
        groups = summaries_from_histogram(histogram, stats_grouping(manifest), int(manifest.get("dropped") or 0))
    write(run.path, manifest, table, histogram, groups)


def write_histogram(histogram: pa.Table, path: Path) -> None:
    """histogram.parquet: values ascending within each group are delta-encoded, the few distinct CPUs, kinds
    and counts go to dictionaries (the 8-VM hour's 1.76 M rows: 0.08 s and 1.5 MB instead of 0.22 s and
    3.6 MB with zstd alone)."""
    names = histogram.column_names
    delta = "value" in names and pa.types.is_integer(histogram.schema.field("value").type)
    pq.write_table(histogram, path, compression="zstd", write_statistics=False,  # one row group: no pruning
                   use_dictionary=[name for name in ("cpu", "kind", "count") if name in names],
                   column_encoding={"value": "DELTA_BINARY_PACKED"} if delta else None)


def _delta_encoded(table: pa.Table) -> dict[str, str]:
    """Time stamps (ascending or nearly so) and event numbers: delta encoding is smaller and faster to write
    than dictionary or plain encoding."""
    return {name: "DELTA_BINARY_PACKED" for name in ("t_ns", "release_ns", "start_ns", "finish_ns", "event")
            if name in table.column_names and pa.types.is_integer(table.schema.field(name).type)}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_measured_run(run: RunDir, stream: SampleStream, *, name: str, params: dict[str, Any],
                       group_by: tuple[str, ...] = ("thread",), extra: dict[str, Any] | None = None,
                       short: bool = False) -> dict[str, Any]:
    """Write the Parquet samples and the manifest of a finished (or interrupted) probe run; ``short``: it ran to
    its end with far fewer samples than it promised (its ``expectation`` says why)."""
    summaries = summarize_stream(stream, group_by)
    manifest = {
        "name": name,
        "source": "measured",
        "probe": stream.probe,
        "value_field": stream.value_field,
        "status": "partial" if stream.end_reason != "complete" else "short" if short else "complete",
        "end_reason": stream.end_reason or "cut-short",
        "params": params,
        "stream_header": stream.header,
        "dropped": stream.total_dropped,
        "probe_stats": {f"{name} thread {thread}": value for (thread, name), value in sorted(stream.stats.items())},
        "summary": {group: summary.as_dict() for group, summary in summaries.items()},
        **(extra or {}),
    }
    return write_run(run, stream.to_table(), manifest)


@dataclass(frozen=True)
class StoredRun:
    """A run read back from the store."""

    path: Path
    manifest: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])

    @property
    def label(self) -> str:
        """Configuration label used to group runs in reports (falls back to the run's name)."""
        return str(self.manifest.get("config") or self.manifest.get("name") or self.run_id)

    @property
    def value_field(self) -> str | None:
        return self.manifest.get("value_field")

    @property
    def quantity(self) -> Quantity:
        """What the run's values measure, and their unit."""
        return run_quantity(self.manifest)

    @property
    def identity(self) -> dict[str, Any]:
        """What makes the run comparable with another (rtvirt.identity), from its manifest."""
        return run_identity(self.manifest)

    @property
    def partial(self) -> bool:
        return self.manifest.get("status") == "partial"

    @property
    def short(self) -> bool:
        """A run that ran to its end with far fewer samples than it promised (its ``expectation`` says why)."""
        return self.manifest.get("status") == "short"

    @property
    def failed(self) -> bool:
        """A run that started and ended without samples: its manifest says why (``campaign.reason``)."""
        return self.manifest.get("status") == "failed"

    @property
    def has_samples(self) -> bool:
        return (self.path / "samples.parquet").exists()

    def histogram_table(self) -> pa.Table | None:
        path = self.path / "histogram.parquet"
        if path.exists():
            return _read_parquet(path, read_dictionary=["kind"])
        return None

    def histogram(self) -> Histogram | None:
        """The exact histogram of all samples (from histogram.parquet, else one chunked pass over the samples)."""
        table = self.histogram_table()
        if table is not None:
            return Histogram.merged([_as_histogram(table)])
        if not self.has_samples or not self.value_field:
            return None
        builder = HistogramBuilder()
        for batch in self.iter_batches([self.value_field]):
            builder.add(batch.column(0).to_numpy(zero_copy_only=False))
        return builder.finish()

    def iter_batches(self, columns: list[str], batch_size: int = 1 << 20) -> Iterator[pa.RecordBatch]:
        path = self.path / "samples.parquet"
        try:
            yield from open_parquet(path).iter_batches(batch_size=batch_size, columns=columns, use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{path}: cannot read samples ({exc})") from None

    def _samples_file(self) -> pq.ParquetFile:
        path = self.path / "samples.parquet"
        try:
            return pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{path}: cannot read samples ({exc})") from None

    def row_count(self) -> int:
        return self._samples_file().metadata.num_rows

    def sample_columns(self) -> list[str]:
        return list(self._samples_file().schema_arrow.names)

    def samples(self, columns: list[str] | None = None) -> pa.Table:
        return _read_parquet(self.path / "samples.parquet", columns)

    def summary(self) -> Summary:
        return summarize_histogram(self.histogram(), int(self.manifest.get("dropped") or 0))


def open_parquet(path: Path) -> pq.ParquetFile:
    """A Parquet file for streaming: no pre-buffering of whole row groups (bounded memory, and faster here)."""
    return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 22)


def _read_parquet(path: Path, columns: list[str] | None = None, read_dictionary: list[str] | None = None) -> pa.Table:
    try:
        # one file: ParquetFile, not read_table, whose dataset layer costs ~70 ms of imports (pyarrow.dataset)
        return pq.ParquetFile(path, read_dictionary=read_dictionary).read(columns=columns, use_threads=True)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None


def missed_periods(manifest: dict[str, Any]) -> int:
    """The periods a stored run's probe counted as missed (its manifest's probe_stats: "overruns thread 0", ...)."""
    return sum(value for name, value in (manifest.get("probe_stats") or {}).items()
               if str(name).split(" ", 1)[0] in MISSED_PERIOD_STATS and isinstance(value, int))


def load_run(path: Path) -> StoredRun:
    """Read a run directory (or its manifest.json); errors name the file."""
    path = Path(path)
    directory = path.parent if path.name == "manifest.json" else path
    manifest_path = directory / "manifest.json"
    try:
        document = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{manifest_path}: no such run manifest") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{manifest_path}: corrupt run manifest ({exc})") from None
    if not isinstance(document, dict):
        raise InputError(f"{manifest_path}: corrupt run manifest (not a JSON object)")
    _validated(document, str(manifest_path))
    return StoredRun(directory, document)


def list_runs(results: Path) -> list[StoredRun]:
    """Every run under ``results/runs`` in creation order (unreadable runs raise InputError)."""
    runs_dir = Path(results) / "runs"
    if not runs_dir.is_dir():
        raise InputError(f"{results}: not a results directory (no runs/ inside)")
    runs = [load_run(d) for d in sorted(runs_dir.iterdir()) if (d / "manifest.json").exists()]
    return sorted(runs, key=lambda r: str(r.manifest.get("created", "")))


def resolve_runs(spec: str | Path, results: Path | None = None) -> list[StoredRun]:
    """A run directory, a manifest, a results directory (all its runs that hold results; the failed ones are
    in the catalog) or a run id under ``results``."""
    path = Path(spec)
    if (path / "manifest.json").exists() or path.name == "manifest.json":
        return [_with_results(load_run(path))]
    if (path / "runs").is_dir():
        return [run for run in list_runs(path) if not run.failed]
    if results is not None and (Path(results) / "runs" / str(spec) / "manifest.json").exists():
        return [_with_results(load_run(Path(results) / "runs" / str(spec)))]
    raise InputError(f"{spec}: not a run directory, manifest, results directory or known run id")


def _with_results(run: StoredRun) -> StoredRun:
    if run.failed:
        reason = str((run.manifest.get("campaign") or {}).get("reason") or "no reason recorded")[:300]
        raise InputError(f"{run.path}: this run failed without samples ({reason})")
    return run


def write_failed_run(run: RunDir, *, name: str, params: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a run that started and ended without a sample: what it was, and why (``extra``)."""
    document = {"manifest_version": MANIFEST_VERSION, "run_id": run.run_id, "name": name, "source": "measured",
                "status": "failed", "created": dt.datetime.now(dt.UTC).isoformat(), "params": params, **extra}
    _validated(document, str(run.manifest_path))
    write_atomically(run.manifest_path, json.dumps(_json_safe(document), indent=2, default=str))
    return document
