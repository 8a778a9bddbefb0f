"""Any CSV or Parquet file with a column of latencies (--column NAME, default the first integer column).

Values are integers in ns unless --unit says us or ms. Optional columns ``t_ns`` and ``cpu`` are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from ..errors import InputError
from .base import Imported, ImporterSpec, ImportOptions, unit_scale


def _read(path: Path) -> pa.Table:
    try:
        if path.suffix.lower() == ".parquet":
            return pq.read_table(path)
        return pcsv.read_csv(path)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, pa.ArrowException) as exc:
        kind = "Parquet" if path.suffix.lower() == ".parquet" else "CSV"
        raise InputError(f"{path}: not a readable {kind} file ({str(exc).splitlines()[0][:200]})") from None


def parse(path: Path, options: ImportOptions) -> Imported:
    table = _read(path)
    name = options.column
    if name is None:
        numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) and f.name not in ("t_ns", "cpu")]
        if not numeric:
            raise InputError(f"{path}: no integer column of latencies; name one with --column")
        name = numeric[0]
    if name not in table.column_names:
        raise InputError(f"{path}: no column {name!r} (columns: {', '.join(table.column_names)[:300]})")
    column = table[name]
    if not pa.types.is_integer(column.type):
        raise InputError(f"{path}: column {name!r} holds {column.type}, not integer latencies")
    if column.null_count:
        raise InputError(f"{path}: column {name!r} has {column.null_count} empty values")
    scale = unit_scale(path, options, "ns")
    n = table.num_rows
    if n == 0:
        raise InputError(f"{path}: no rows")
    latency = column.cast(pa.int64())
    if scale != 1:
        latency = pc.multiply(latency, scale)
    columns = {
        "t_ns": table["t_ns"].cast(pa.int64()) if "t_ns" in table.column_names else pa.array(np.arange(n)),
        "latency_ns": latency,
        "cpu": table["cpu"].cast(pa.int16()) if "cpu" in table.column_names else pa.array(np.zeros(n, np.int16)),
        "thread": pa.array(np.zeros(n, np.int16)),
        "kind": pa.array([name] * n, pa.string()).dictionary_encode(),
    }
    warnings = [] if "t_ns" in table.column_names else ["no t_ns column: samples are numbered, not timed"]
    return Imported(table=pa.table(columns), meta={"probe": "import"}, warnings=warnings)


SPEC = ImporterSpec("column", "a latency column of any CSV or Parquet file (--column, --unit)", parse)
