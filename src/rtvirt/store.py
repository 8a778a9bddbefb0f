"""The results store: one directory per run with its manifest, raw stream and Parquet samples.

Layout (docs/results-store.md)::

    RESULTS/runs/<run_id>/manifest.json     what ran, where, with which parameters; complete or partial
    RESULTS/runs/<run_id>/samples.rtvs      the agent's raw stream, kept as taken
    RESULTS/runs/<run_id>/samples.parquet   the samples as columns
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .errors import InputError
from .stats import summarize_stream
from .stream import SampleStream

__all__ = ["RunDir", "new_run", "write_measured_run", "MANIFEST_VERSION"]

MANIFEST_VERSION = 1


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
    def manifest_path(self) -> Path:
        return self.path / "manifest.json"


def new_run(results: Path, label: str) -> RunDir:
    """Create a fresh, uniquely named run directory under ``results/runs``."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_label = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:64]
    run_id = f"{stamp}-{safe_label}-{secrets.token_hex(2)}"
    path = Path(results) / "runs" / run_id
    try:
        path.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"results directory {results}: cannot create a run there ({exc.strerror})") from None
    return RunDir(run_id, path)


def write_measured_run(run: RunDir, stream: SampleStream, *, name: str, params: dict[str, Any],
                       group_by: tuple[str, ...] = ("thread",), extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the Parquet samples and the manifest of a finished (or interrupted) probe run."""
    pq.write_table(stream.to_table(), run.parquet_path, compression="zstd")
    summaries = summarize_stream(stream, group_by)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run.run_id,
        "name": name,
        "source": "measured",
        "probe": stream.probe,
        "value_field": stream.value_field,
        "status": "complete" if stream.end_reason == "complete" else "partial",
        "end_reason": stream.end_reason or "cut-short",
        "params": params,
        "stream_header": stream.header,
        "dropped": stream.total_dropped,
        "probe_stats": {f"{name} thread {thread}": value for (thread, name), value in sorted(stream.stats.items())},
        "summary": {group: summary.as_dict() for group, summary in summaries.items()},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        **(extra or {}),
    }
    run.manifest_path.write_text(json.dumps(manifest, indent=2, default=str))
    return manifest
