"""What an importer is: a parser from one foreign file format into the store's schema."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import InputError

__all__ = ["Imported", "ImporterSpec", "ImportOptions", "read_text", "lenient_json", "UNIT_NS"]

UNIT_NS = {"ns": 1, "us": 1000, "ms": 1_000_000}
# rt-tests and jitterdebugger print the average of a CPU without samples as a bare -nan: not JSON.
_NAN = re.compile(r"(:\s*)-?nan\b")
# Foreign text files are read whole; beyond this they are not what these formats produce.
MAX_TEXT_BYTES = 4 << 30


@dataclass
class ImportOptions:
    unit: str | None = None  # unit of the file's values when the format does not say (us/ns/ms)
    column: str | None = None  # latency column (CSV/Parquet)


@dataclass
class Imported:
    """Samples (t_ns, latency_ns, cpu, thread, kind) and/or an exact histogram (cpu, kind, value, count)."""

    table: pa.Table | None = None
    histogram: pa.Table | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ImporterSpec:
    name: str
    summary: str
    parse: Callable[[Path, ImportOptions], Imported]


def read_text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_TEXT_BYTES:
            raise InputError(f"{path}: file too large for a text import")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def unit_scale(path: Path, options: ImportOptions, default: str) -> int:
    unit = options.unit or default
    if unit not in UNIT_NS:
        raise InputError(f"--unit {unit!r}: expected one of {', '.join(UNIT_NS)}")
    return UNIT_NS[unit]


def lenient_json(text: str) -> Any:
    """json.loads that also takes the bare nan/-nan values the RT tools write (raises JSONDecodeError)."""
    return json.loads(_NAN.sub(r"\1NaN", text))
