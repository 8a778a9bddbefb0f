"""jitterdebugger raw samples (``-o DIR -s`` writes DIR/samples.raw).

Records are 28 bytes, little endian, packed: u32 CPU, i64 seconds, i64 nanoseconds (wake-up time), u64
latency. The latency unit is µs unless the run used -N (ns): DIR/results.json's
``sysinfo.resolution_in_ns`` says which; --unit overrides.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ..errors import InputError
from .base import UNIT_NS, Imported, ImporterSpec, ImportOptions, lenient_json, unit_scale

RECORD = np.dtype([("cpu", "<u4"), ("sec", "<i8"), ("nsec", "<i8"), ("value", "<u8")])


def _scale_from_results(raw: Path, options: ImportOptions) -> int:
    if options.unit:
        return unit_scale(raw, options, "us")
    results = raw.with_name("results.json")
    try:
        resolution = lenient_json(results.read_text())["sysinfo"]["resolution_in_ns"]
    except (OSError, ValueError, KeyError, TypeError):
        return UNIT_NS["us"]
    return 1 if resolution == 1 else UNIT_NS["us"]


def parse(path: Path, options: ImportOptions) -> Imported:
    raw = path / "samples.raw" if path.is_dir() else path
    try:
        data = raw.read_bytes()
    except OSError as exc:
        raise InputError(f"{raw}: cannot read ({exc.strerror})") from None
    if not data:
        raise InputError(f"{raw}: empty jitterdebugger sample file")
    warnings = []
    if len(data) % RECORD.itemsize:
        warnings.append(f"{len(data) % RECORD.itemsize} trailing bytes (a cut-short record) ignored")
    records = np.frombuffer(data[: len(data) - len(data) % RECORD.itemsize], RECORD)
    if records.size == 0:
        raise InputError(f"{raw}: shorter than one jitterdebugger record ({RECORD.itemsize} bytes)")
    bad = (records["nsec"] < 0) | (records["nsec"] >= 1_000_000_000) | (records["cpu"] > 4095) \
        | (records["value"] > 1 << 40)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise InputError(f"{raw}: record {index} is not a jitterdebugger sample (corrupt or foreign file)")
    t_ns = records["sec"] * 1_000_000_000 + records["nsec"]
    table = pa.table({
        "t_ns": pa.array(t_ns - t_ns.min()),
        "latency_ns": pa.array(records["value"].astype(np.int64) * _scale_from_results(raw, options)),
        "cpu": pa.array(records["cpu"].astype(np.int16)),
        "thread": pa.array(records["cpu"].astype(np.int16)),
        "kind": pa.array(["wakeup"] * records.size, pa.string()).dictionary_encode(),
    })
    return Imported(table=table, meta={"probe": "jitterdebugger"}, warnings=warnings)


SPEC = ImporterSpec("jitterdebugger", "jitterdebugger raw samples (samples.raw or its -o directory)", parse)
