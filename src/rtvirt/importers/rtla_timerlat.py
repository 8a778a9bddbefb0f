"""``rtla timerlat hist`` output: one row per bucket, one column per CPU and context (IRQ/Thr/Usr).

The unit comes from the ``# Time unit is …`` line; the bucket size (rtla -b) from --bucket-size is not in
the output, so buckets are read as 1 unit wide unless --unit says otherwise. ``over:`` counts are kept
at the column's ``max:``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..stats import Histogram
from ..store import histogram_table
from .base import UNIT_NS, Imported, ImporterSpec, ImportOptions, read_text, unit_scale

_UNIT = re.compile(r"#\s*Time unit is (\w+)")
_COLUMN = re.compile(r"^(IRQ|Thr|Usr)-(\d+)$")
_UNIT_WORDS = {"microseconds": "us", "nanoseconds": "ns"}


def parse(path: Path, options: ImportOptions) -> Imported:
    text = read_text(path)
    unit_match = _UNIT.search(text)
    if options.unit:
        scale = unit_scale(path, options, "us")
    else:
        scale = UNIT_NS[_UNIT_WORDS.get(unit_match.group(1), "us")] if unit_match else UNIT_NS["us"]
    columns: list[tuple[str, int]] | None = None
    buckets: list[int] = []
    rows: list[list[int]] = []
    footer: dict[str, list[int]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "Index":
            columns = []
            for name in fields[1:]:
                match = _COLUMN.match(name)
                if not match:
                    raise InputError(f"{path}: line {number}: unknown column {name[:40]!r}")
                columns.append((match.group(1), int(match.group(2))))
            continue
        if columns is None:
            raise InputError(f"{path}: line {number}: no 'Index' header before the data: not rtla timerlat hist")
        if fields[0] == "ALL:":
            break  # newer rtla adds an all-CPU summary after the per-CPU table
        if fields[0].endswith(":"):
            cells = fields[1:1 + len(columns)]
            if all(v.lstrip("-").isdigit() for v in cells):
                footer[fields[0][:-1]] = [int(v) for v in cells]
            continue
        if len(fields) != len(columns) + 1 or not all(f.isdigit() for f in fields):
            raise InputError(f"{path}: line {number}: expected {len(columns) + 1} integers: {raw[:80]!r}")
        buckets.append(int(fields[0]))
        rows.append([int(f) for f in fields[1:]])
    if columns is None or not rows:
        raise InputError(f"{path}: no histogram rows found: not rtla timerlat hist output")
    counts = np.array(rows, np.int64)
    values = np.array(buckets, np.int64) * scale
    groups = []
    warnings = []
    for index, (context, cpu) in enumerate(columns):
        column_values, column_counts = values, counts[:, index]
        over = footer.get("over", [0] * len(columns))[index]
        if over:
            maximum = footer.get("max", [None] * len(columns))[index]
            if maximum is None:
                raise InputError(f"{path}: {context}-{cpu:03d} has {over} overflows but no 'max:' row")
            column_values = np.append(column_values, maximum * scale)
            column_counts = np.append(column_counts, over)
            warnings.append(f"{context}-{cpu:03d}: {over} samples over the histogram are counted at its max")
        present = column_counts > 0
        if present.any():
            h = Histogram.merged([Histogram(column_values[present], column_counts[present])])
            groups.append((cpu, context.lower(), h))
    if not groups:
        raise InputError(f"{path}: the histogram holds no samples")
    return Imported(histogram=histogram_table(groups), meta={"probe": "rtla-timerlat"}, warnings=warnings)


SPEC = ImporterSpec("rtla-timerlat-hist", "rtla timerlat hist output (per-CPU IRQ/thread histograms)", parse)
