"""cyclictest -h/-H histogram output: ``bucket count0 count1 …`` lines in µs (ns with --nsecs: --unit ns).

Samples beyond the last bucket are only counted ("Histogram Overflows"); they are kept at the thread's
reported maximum, so counts and the maximum stay exact while high percentiles become upper bounds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..stats import Histogram
from ..store import histogram_table
from .base import Imported, ImporterSpec, ImportOptions, read_text, unit_scale

_ROW = re.compile(r"^\d+(\s+\d+)+$")
_FOOTER = re.compile(r"^#\s*(Total|Min Latencies|Avg Latencies|Max Latencies|Histogram Overflows):((?:\s+\d+)+)\s*$")


def parse(path: Path, options: ImportOptions) -> Imported:
    scale = unit_scale(path, options, "us")
    rows: list[list[int]] = []
    footer: dict[str, list[int]] = {}
    for number, raw in enumerate(read_text(path).splitlines(), 1):
        line = raw.strip()
        if _ROW.match(line):
            rows.append([int(x) for x in line.split()])
        elif match := _FOOTER.match(line):
            footer[match.group(1)] = [int(x) for x in match.group(2).split()]
        elif line and not line.startswith("#") and not line.startswith("T:"):
            raise InputError(f"{path}: line {number}: not cyclictest histogram output: {line[:80]!r}")
    if not rows:
        raise InputError(f"{path}: no histogram rows ('bucket count…') found; was cyclictest run with -h?")
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise InputError(f"{path}: histogram rows have different numbers of columns")
    data = np.array(rows, np.int64)
    buckets, counts = data[:, 0] * scale, data[:, 1:]
    overflows = footer.get("Histogram Overflows", [0] * counts.shape[1])
    maxima = footer.get("Max Latencies", [])
    warnings = []
    groups = []
    for thread in range(counts.shape[1]):
        values, per_bucket = buckets, counts[:, thread]
        over = overflows[thread] if thread < len(overflows) else 0
        if over:
            if thread >= len(maxima):
                raise InputError(f"{path}: {over} histogram overflows in thread {thread} but no 'Max Latencies'")
            values = np.append(values, maxima[thread] * scale)
            per_bucket = np.append(per_bucket, over)
            warnings.append(f"thread {thread}: {over} samples beyond the histogram range are counted at its "
                            f"maximum ({maxima[thread]} {options.unit or 'us'}); high percentiles are upper bounds")
        present = per_bucket > 0
        if present.any():
            merged = Histogram.merged([Histogram(values[present], per_bucket[present])])
            groups.append((thread, "wakeup", merged))
    if not groups:
        raise InputError(f"{path}: the histogram holds no samples")
    return Imported(histogram=histogram_table(groups), meta={"probe": "cyclictest"}, warnings=warnings)


SPEC = ImporterSpec("cyclictest-hist", "cyclictest -h histogram output (µs buckets per thread)", parse)
