"""cyclictest --json=FILE output (rt-tests ≥ 2.0): per-thread histograms in µs (--unit ns after --nsecs).

Samples outside the histogram (cycles beyond the histogram's total) are kept at the thread's maximum.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InputError, first_validation_error
from ..stats import Histogram
from ..store import histogram_table
from .base import Imported, ImporterSpec, ImportOptions, lenient_json, read_text, unit_scale


class _Thread(BaseModel):
    model_config = ConfigDict(extra="allow")
    histogram: dict[int, int] = {}
    cycles: int
    min: int
    max: int
    cpu: int | None = None


class _Report(BaseModel):
    model_config = ConfigDict(extra="allow")
    thread: dict[int, _Thread]
    sysinfo: dict[str, Any] = {}


def parse(path: Path, options: ImportOptions) -> Imported:
    scale = unit_scale(path, options, "us")
    try:
        report = _Report.model_validate(lenient_json(read_text(path)))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except ValidationError as exc:
        where, message = first_validation_error(exc)
        raise InputError(f"{path}: not cyclictest --json output: field '{where}': {message}") from None
    groups = []
    warnings = []
    for number, thread in sorted(report.thread.items()):
        values = np.array(list(thread.histogram), np.int64) * scale
        counts = np.array(list(thread.histogram.values()), np.int64)
        if (counts < 0).any():
            raise InputError(f"{path}: thread {number}: negative histogram count")
        if thread.cycles and not counts.sum():
            raise InputError(f"{path}: thread {number} has {thread.cycles} samples but no histogram: "
                             "run cyclictest with -h N (or import its -v output)")
        outside = thread.cycles - int(counts.sum())
        if outside > 0:
            values, counts = np.append(values, thread.max * scale), np.append(counts, outside)
            warnings.append(f"thread {number}: {outside} sample{'s' if outside != 1 else ''} outside the histogram "
                            f"{'are' if outside != 1 else 'is'} counted at its maximum")
        present = counts > 0
        if present.any():
            h = Histogram.merged([Histogram(values[present], counts[present])])
            groups.append((thread.cpu if thread.cpu is not None else number, "wakeup", h))
    if not groups:
        raise InputError(f"{path}: cyclictest --json output holds no samples")
    meta = {"probe": "cyclictest", "system": {"sysinfo": report.sysinfo}}
    return Imported(histogram=histogram_table(groups), meta=meta, warnings=warnings)


SPEC = ImporterSpec("cyclictest-json", "cyclictest --json=FILE output (histograms per thread)", parse)
