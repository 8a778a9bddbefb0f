"""An explanation on disk, beside the run's samples: ``explain.parquet`` (one row per outlier part, what
``rtvirt sql`` queries as the ``explain_parts`` view) and ``explain.json`` (threshold, layers, summary, the
occupancies kept for timelines). Format: docs/explain.md."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .model import Explanation, LayerTrace, Occupancy, Part

__all__ = ["PARTS_FILE", "SUMMARY_FILE", "PARTS_SCHEMA", "write_explanation", "read_explanation"]

PARTS_FILE = "explain.parquet"
SUMMARY_FILE = "explain.json"
EXPLAIN_VERSION = 1

PARTS_SCHEMA = pa.schema([
    ("sample_t_ns", pa.int64()), ("latency_ns", pa.int64()), ("cpu", pa.int16()), ("rank", pa.int32()),
    ("layer", pa.dictionary(pa.int8(), pa.string())), ("kind", pa.dictionary(pa.int16(), pa.string())),
    ("cause", pa.dictionary(pa.int32(), pa.string())), ("offset_ns", pa.int64()), ("duration_ns", pa.int64()),
    ("detail", pa.string()),
    # the culprit each part is pooled under and its variant (an explanation written before them has neither:
    # its readers take the cause as the culprit)
    ("culprit", pa.dictionary(pa.int32(), pa.string())), ("variant", pa.dictionary(pa.int16(), pa.string())),
])


def write_explanation(run_dir: Path, explanation: Explanation) -> None:
    """Write both files; the Parquet table is written first so a reader that finds the JSON finds both."""
    columns: dict[str, list[Any]] = {name: [] for name in PARTS_SCHEMA.names}
    for part in explanation.parts:
        for name in PARTS_SCHEMA.names:
            columns[name].append(getattr(part, name))
    table = pa.table({name: pa.array(values, type=PARTS_SCHEMA.field(name).type if name not in
                                     ("layer", "kind", "cause", "culprit", "variant") else pa.string())
                      for name, values in columns.items()})
    table = table.cast(PARTS_SCHEMA)
    pq.write_table(table, run_dir / PARTS_FILE, compression="zstd")
    document = {
        "explain_version": EXPLAIN_VERSION,
        "threshold_ns": explanation.threshold_ns,
        "threshold_rule": explanation.threshold_rule,
        "outliers": explanation.outliers,
        "summary": explanation.summary,
        "layers": [dataclasses.asdict(layer) for layer in explanation.layers],
    }
    temporary = run_dir / (SUMMARY_FILE + ".tmp")
    temporary.write_text(json.dumps(document, separators=(",", ":")))
    temporary.replace(run_dir / SUMMARY_FILE)


def read_explanation(run_dir: Path) -> Explanation | None:
    """The run's explanation, or None when it has none (not explained, or written by an older version)."""
    summary_path, parts_path = run_dir / SUMMARY_FILE, run_dir / PARTS_FILE
    if not summary_path.exists() or not parts_path.exists():
        return None
    document = json.loads(summary_path.read_text())
    if document.get("explain_version") != EXPLAIN_VERSION:
        return None
    rows = pq.read_table(parts_path).to_pylist()
    parts = [Part(**row) for row in rows]  # dictionary columns read back as plain strings
    layers = []
    for layer in document["layers"]:
        occupancies = [Occupancy(**occupancy) for occupancy in layer.pop("occupancies")]
        layers.append(LayerTrace(**layer, occupancies=occupancies))
    return Explanation(threshold_ns=document["threshold_ns"], threshold_rule=document["threshold_rule"],
                       outliers=document["outliers"], parts=parts, layers=layers, summary=document["summary"])
