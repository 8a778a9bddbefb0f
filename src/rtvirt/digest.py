"""What the report and ``rtvirt stats`` need from a run, computed once when the run is stored and kept
beside its samples (docs/results-store.md), so that reading a run never needs a pass over its samples:

- ``digest.json``: the exact statistics ``rtvirt stats`` prints (per CPU, or per task of simulated runs,
  and ``all``); the time profile (per-window count, maximum, mean and level in the default window, the
  cumulative statistics at 1/8, 2/8, 4/8 and all of the run); the largest samples; the exact statistics
  between the run's timeline events;
- ``series.parquet``: every k-th sample (about 20,000), for the time-series plot.

Runs stored before digests existed (or read with another ``--window``) get the same content from one pass
over samples.parquet (results.windows.run_pass). This module imports only json at load time: the writer's
numeric imports are inside it, and `rtvirt stats` reads a digest without numpy or pyarrow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .quantity import run_quantity
from .summary import Statistics, Summary

if TYPE_CHECKING:
    import pyarrow as pa

    from .timeprofile.levels import Segment
    from .timeprofile.windows import RunPass, TimeProfile

__all__ = ["DIGEST_VERSION", "DIGEST_FILE", "SERIES_FILE", "Digest", "write_digest", "read_digest",
           "stored_summaries", "stats_grouping"]

DIGEST_VERSION = 1
DIGEST_FILE = "digest.json"
SERIES_FILE = "series.parquet"
_MAX_DIGEST = 256 << 20  # a digest is small (windows dominate: ~100 bytes each); more is not ours


def stats_grouping(manifest: dict[str, Any]) -> str:
    """What `rtvirt stats` groups a run's histogram by: per task (``kind``) for simulated runs, whose CPU says
    little and whose tasks are what the model is about; per CPU otherwise."""
    return "kind" if manifest.get("source") == "simulated" else "cpu"


class Digest:
    """A run's digest.json, read back (a plain class: a dataclass costs `rtvirt stats` milliseconds to build)."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path = path  # the run directory
        self.document = document
        self.cache: dict[str, Any] = {}

    def groups(self) -> dict[str, Summary]:
        return {str(k): Summary.from_json(v) for k, v in self.document["groups"].items()}

    @property
    def has_profile(self) -> bool:
        return self.document.get("profile") is not None

    @property
    def window_ns(self) -> int | None:
        return int(self.document["profile"]["window_ns"]) if self.has_profile else None

    @property
    def top_kept(self) -> int:
        return len(self.document["profile"]["top"]["value_ns"]) if self.has_profile else 0

    def over_time(self) -> tuple[TimeProfile, list[tuple[int, int, int]], list[Segment]]:
        """The time profile, the largest samples and the segments between timeline events (parsed once)."""
        if "_over_time" not in self.cache:
            self.cache["_over_time"] = (self.profile(), self.top(), self.segments())
        return self.cache["_over_time"]  # type: ignore[no-any-return]

    def profile(self) -> TimeProfile:
        from .timeprofile.windows import TimeProfile, Window

        p = self.document["profile"]
        w = p["windows"]
        windows = [Window(int(s), int(c), int(m), float(mean), float(level)) for s, c, m, mean, level
                   in zip(w["start_ns"], w["count"], w["max_ns"], w["mean_ns"], w["level_ns"], strict=True)]
        marks = [(int(m["end_ns"]), Summary.from_json(m["summary"])) for m in p["marks"]]
        return TimeProfile(int(p["window_ns"]), int(p["first_ns"]), int(p["duration_ns"]), windows, marks)

    def top(self) -> list[tuple[int, int, int]]:
        """(t from the first sample, value, CPU) of the largest samples, largest first."""
        top = self.document["profile"]["top"]
        return [(int(t), int(v), int(c)) for t, v, c in zip(top["t_ns"], top["value_ns"], top["cpu"], strict=True)]

    def segments(self) -> list[Segment]:
        from .timeprofile.levels import Segment

        return [Segment(int(s["start_ns"]), int(s["end_ns"]), str(s["after_event"]), int(s["count"]),
                        float(s["median_ns"]), float(s["mean_ns"]), float(s["max_ns"]))
                for s in self.document["profile"].get("segments") or []]

    def series(self) -> tuple[Any, Any]:
        """(t_ns from the first sample, value) of the thinned series, in time order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .errors import InputError

        path = self.path / SERIES_FILE
        try:
            table = pq.ParquetFile(path).read(columns=["t_ns", "value"])
        except (OSError, pa.ArrowException, KeyError) as exc:
            raise InputError(f"{path}: unreadable ({exc}); delete it and digest.json to report from the samples") \
                from None
        return table["t_ns"].to_numpy(), table["value"].to_numpy()


def read_digest(run_dir: Path, run_id: str, over_time: bool = True) -> Digest | None:
    """The run's digest, or None when it has none (stored by an older version), it is not this run's (a
    copied file) or it is unreadable: callers then compute the same content from the samples. Without
    ``over_time`` only the statistics are checked (what `rtvirt stats` prints)."""
    path = Path(run_dir) / DIGEST_FILE
    try:
        if path.stat().st_size > _MAX_DIGEST:
            return None
        document = json.loads(path.read_bytes())
        if (not isinstance(document, dict) or document.get("digest_version") != DIGEST_VERSION
                or document.get("run_id") != run_id or not isinstance(document.get("groups"), dict)):
            return None
        digest = Digest(Path(run_dir), document)
        digest.groups()  # every summary well-formed
        if over_time and digest.has_profile:
            digest.over_time()
            if not (Path(run_dir) / SERIES_FILE).is_file():
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest


def _profile_json(result: RunPass, segments: list[Segment]) -> dict[str, Any]:
    p = result.profile
    return {
        "window_ns": p.window_ns, "first_ns": p.first_ns, "duration_ns": p.duration_ns,
        "windows": {"start_ns": [w.start_ns for w in p.windows], "count": [w.count for w in p.windows],
                    "max_ns": [w.max_ns for w in p.windows], "mean_ns": [w.mean_ns for w in p.windows],
                    "level_ns": [w.level_ns for w in p.windows]},
        "marks": [{"end_ns": end, "summary": s.as_json()} for end, s in p.marks],
        "top": {"t_ns": result.top_t.tolist(), "value_ns": result.top_values.tolist(), "cpu": result.top_cpu.tolist()},
        "segments": [{"start_ns": s.start_ns, "end_ns": s.end_ns, "after_event": s.after_event, "count": s.count,
                      "median_ns": s.median_ns, "mean_ns": s.mean_ns, "max_ns": s.max_ns} for s in segments],
    }


def write_digest(run_dir: Path, document: dict[str, Any], table: pa.Table | None, histogram: pa.Table | None,
                 groups: dict[str, Summary] | None = None) -> None:
    """Compute and write the digest of a run being stored: ``document`` is its manifest, ``table`` its samples
    (value column as stored), ``histogram`` its exact histogram table (cpu, kind, value, count); ``groups`` its
    statistics per stats_grouping() group and "all", computed from that histogram (None: no histogram)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .errors import InputError
    from .fileio import write_atomically
    from .stats import Histogram, summarize_histogram
    from .timeprofile.levels import event_offsets, segments_of
    from .timeprofile.windows import profile_pass

    dropped = int(document.get("dropped") or 0)
    if groups is None:  # the store gives the statistics of every histogram (store.write_digest): no samples
        groups = {"all": summarize_histogram(None, dropped)}
    digest: dict[str, Any] = {"digest_version": DIGEST_VERSION, "run_id": document["run_id"],
                              **run_quantity(document).as_dict(),
                              "groups": {k: s.as_json() for k, s in groups.items()}, "profile": None}
    value_field = document.get("value_field")
    if table is not None and table.num_rows and histogram is not None and "t_ns" in table.column_names:
        columns = ["t_ns", str(value_field)] + (["cpu"] if "cpu" in table.column_names else [])
        import pyarrow.compute as pc  # ~0.1 s to import: only with samples (not for a simulated run's digest)

        first, last = (int(x.as_py()) for x in pc.min_max(table["t_ns"]).values())
        timeline = document.get("timeline") or []
        events = event_offsets(first, timeline)

        def chunks() -> Any:
            for batch in table.select(columns).to_batches(max_chunksize=1 << 20):
                yield (batch.column(0).to_numpy(zero_copy_only=False), batch.column(1).to_numpy(zero_copy_only=False),
                       batch.column(2).to_numpy(zero_copy_only=False) if len(columns) == 3 else None)

        overall = Histogram.merged([Histogram(histogram["value"].to_numpy(), histogram["count"].to_numpy())])
        try:
            result = profile_pass(chunks(), first_ns=first, last_ns=last, rows=table.num_rows, overall=overall,
                                  cuts=[t for t, _ in events])
        except InputError:
            # time stamps no window fits (e.g. one sample dated 0 among wall-clock ones): the run is stored all the
            # same, without a profile; a report says why when it takes the pass over the samples
            result = None
        if result is not None:
            segments = segments_of(events, result.profile.duration_ns, result.between_cuts) if events else []
            digest["profile"] = _profile_json(result, segments)
            pq.write_table(pa.table({"t_ns": pa.array(result.series_t, pa.int64()),
                                     "value": pa.array(result.series_values.astype(np.int64), pa.int64())}),
                           Path(run_dir) / SERIES_FILE, compression="zstd",
                           column_encoding={"t_ns": "DELTA_BINARY_PACKED"}, use_dictionary=False)
    write_atomically(Path(run_dir) / DIGEST_FILE, json.dumps(digest, allow_nan=False, separators=(",", ":")))


def _run_summaries(run_dir: Path) -> tuple[str, str, Statistics] | None:
    """(created, run id, statistics) of one run directory from its digest, or None."""
    try:
        manifest = json.loads((run_dir / "manifest.json").read_bytes())
    except (OSError, ValueError):
        return None
    run_id = manifest.get("run_id") if isinstance(manifest, dict) else None
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 200:
        return None
    digest = read_digest(run_dir, run_id, over_time=False)
    if digest is None:
        return None
    return str(manifest.get("created", "")), run_id, Statistics(run_quantity(manifest), digest.groups())


def stored_summaries(spec: str) -> dict[str, Statistics] | None:
    """{run id: statistics} of a run directory, its manifest.json or samples.parquet, or every run of a
    results directory, read from the runs' digests alone (no numpy, pyarrow or pydantic); None when a run has
    no usable digest or ``spec`` is something else (the caller then takes the general path, which also
    validates and reports bad input)."""
    path = Path(spec)
    if path.name in ("manifest.json", "samples.parquet") and path.is_file():
        path = path.parent
    if (path / "manifest.json").is_file():
        runs = [_run_summaries(path)]
    elif (path / "runs").is_dir():
        runs = [_run_summaries(d) for d in sorted((path / "runs").iterdir()) if (d / "manifest.json").is_file()]
    else:
        return None
    if not runs or any(run is None for run in runs):
        return None
    # in creation order, as rtvirt.store.list_runs gives them
    return {run_id: statistics for _, run_id, statistics in sorted((r for r in runs if r is not None),
                                                                    key=lambda r: r[0])}
