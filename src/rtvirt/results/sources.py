"""What ``rtvirt stats`` accepts: run directories, results directories, manifests, sample streams (.rtvs)
and any Parquet file with an integer latency column. Each becomes named exact summaries."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from ..errors import InputError
from ..quantity import LATENCY, QUANTITIES, quantity_of
from ..stats import HistogramBuilder, Summary, summarize_histogram, summarize_stream
from ..store import StoredRun, open_parquet, resolve_runs, summaries_from_histogram
from ..stream import read_stream
from ..summary import Statistics

__all__ = ["summaries_of", "run_summaries"]


def run_summaries(run: StoredRun) -> dict[str, Summary]:
    """Per-group and overall summaries of a run: per CPU for measured runs, per task (the histogram's ``kind``)
    for simulated ones, whose CPU says little and whose tasks are what the model is about."""
    table = run.histogram_table()
    dropped = int(run.manifest.get("dropped") or 0)
    if table is not None:
        return summaries_from_histogram(table, "kind" if run.manifest.get("source") == "simulated" else "cpu",
                                        dropped)
    return {"all": run.summary()}


def _parquet_summary(path: Path, column: str | None) -> Summary:
    try:
        parquet = open_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    schema = parquet.schema_arrow
    if column is None:
        candidates = [f.name for f in schema if pa.types.is_integer(f.type) and f.name not in ("t_ns", "cpu", "thread")]
        if not candidates:
            raise InputError(f"{path}: no integer latency column; name one with --column")
        column = candidates[0]
    if column not in schema.names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)[:300]})")
    if not pa.types.is_integer(schema.field(column).type):
        raise InputError(f"{path}: column {column!r} holds {schema.field(column).type}, not integer ns")
    builder = HistogramBuilder()
    try:
        for batch in parquet.iter_batches(batch_size=1 << 20, columns=[column], use_threads=False):
            values = batch.column(0)
            if values.null_count:
                raise InputError(f"{path}: column {column!r} has empty values")
            builder.add(values.to_numpy())
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: corrupt Parquet data ({exc})") from None
    return summarize_histogram(builder.finish())


def summaries_of(spec: str, column: str | None = None) -> dict[str, Statistics]:
    """{source name: statistics} for one command-line argument (a foreign Parquet column: latencies in ns)."""
    path = Path(spec)
    if path.is_file() and path.suffix == ".rtvs":
        stream = read_stream(path)
        return {str(path): Statistics(quantity_of(stream.value_field), summarize_stream(stream, ("thread",)))}
    if path.is_file() and path.suffix == ".parquet" and path.name != "histogram.parquet":
        if path.name == "samples.parquet" and (path.parent / "manifest.json").exists() and column is None:
            run = resolve_runs(path.parent)[0]
            return {run.run_id: Statistics(run.quantity, run_summaries(run))}
        # a column rtvirt names (rounds of a copied run's samples) is what it says, any other one latency in ns
        return {str(path): Statistics(QUANTITIES.get(column or "", LATENCY), {"all": _parquet_summary(path, column)})}
    if path.is_file() and path.name != "manifest.json":
        raise InputError(f"{path}: not a run, results directory, .rtvs stream or .parquet file")
    return {run.run_id: Statistics(run.quantity, run_summaries(run)) for run in resolve_runs(path)}
