"""Following a running run: its sample stream (samples.rtvs, written by the recorder as the probe runs) read as
it grows, folded into a few bounded aggregates, without writing anything or talking to the campaign.

How it is read: a :class:`~rtvirt.stream.StreamReader` that keeps nothing (``keep=False``) is polled once a
second by the server; each poll reads only the bytes appended since the last one, ``STEP_RECORDS`` records at a
time and at most ``STEPS_PER_POLL`` steps (a page opened 8 hours into a run catches up 16 MiB a second rather than
reading 900 MB at once beside the measurement), from the page cache the recorder just wrote into. What is kept
does not grow with the run: counts per histogram bucket, the maximum, counters, and one entry per time window
(``MAX_WINDOWS`` at most: past that, neighbouring windows merge in pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..stream import StreamReader

__all__ = ["RunFollower", "PROMETHEUS_BUCKETS_NS", "PAGE_EDGES_NS", "MAX_WINDOWS"]

# Prometheus' buckets (upper bounds): 1 us to 100 ms in 1-2-5 steps, as RT latencies span
PROMETHEUS_BUCKETS_NS = tuple(int(m * 10**e) for e in range(3, 8) for m in (1, 2, 5)) + (100_000_000,)
# the page's histogram: 20 bins a decade from 100 ns to 1 s (the last bin holds everything above)
PAGE_EDGES_NS = np.unique(np.round(np.logspace(2, 9, 7 * 20 + 1)).astype(np.int64))
MAX_WINDOWS = 3600  # time windows kept (1 s each until a run passes an hour, then 2 s, 4 s, ...)
STEP_RECORDS = 1 << 15  # records read per step (1 MiB)
STEPS_PER_POLL = 16  # a follower joining a long run late catches up 16 MiB a poll, not the whole stream at once
OPEN_WINDOWS = 2  # the newest windows still taking samples (several threads' records interleave)


@dataclass
class _Windows:
    """Per-window sample count, maximum and p99, for the run's timeline (bounded by MAX_WINDOWS)."""

    width_ns: int = 1_000_000_000
    count: list[int] = field(default_factory=list)
    top: list[int] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    pending: dict[int, list[np.ndarray]] = field(default_factory=dict)  # open windows' values

    def add(self, offsets: np.ndarray, values: np.ndarray) -> None:
        index = offsets // self.width_ns
        while int(index.max()) >= MAX_WINDOWS:
            self._coarsen()
            index = offsets // self.width_ns
        order = np.argsort(index, kind="stable")
        index, values = index[order], values[order]
        starts = np.flatnonzero(np.diff(index, prepend=-1))
        for start, end in zip(starts, [*starts[1:], index.size], strict=True):
            window, chunk = int(index[start]), values[start:end]
            self._grow(window)
            self.count[window] += int(chunk.size)
            self.top[window] = max(self.top[window], int(chunk.max()))
            if window in self.pending or window >= len(self.count) - OPEN_WINDOWS:
                self.pending.setdefault(window, []).append(chunk)
            else:  # a straggler for a closed window: its p99 stays, its count and maximum take it
                self.p99[window] = max(self.p99[window], float(np.percentile(chunk, 99)))
        for window in [w for w in self.pending if w < len(self.count) - OPEN_WINDOWS]:
            self._close(window)

    def _grow(self, window: int) -> None:
        missing = window + 1 - len(self.count)
        if missing > 0:
            self.count += [0] * missing
            self.top += [0] * missing
            self.p99 += [float("nan")] * missing

    def _close(self, window: int) -> None:
        values = np.concatenate(self.pending.pop(window))
        self.p99[window] = float(np.percentile(values, 99))

    def close_all(self) -> None:
        for window in list(self.pending):
            self._close(window)

    def _coarsen(self) -> None:
        """Merge neighbouring windows in pairs: counts add, the larger maximum and the larger p99 stay (so
        a merged window's p99 is an upper bound of the pair's)."""
        self.close_all()
        self._grow(len(self.count) + len(self.count) % 2 - 1)
        pairs = len(self.count) // 2
        self.count = [self.count[2 * i] + self.count[2 * i + 1] for i in range(pairs)]
        self.top = [max(self.top[2 * i], self.top[2 * i + 1]) for i in range(pairs)]
        self.p99 = [float(np.fmax(self.p99[2 * i], self.p99[2 * i + 1])) for i in range(pairs)]
        self.width_ns *= 2

    def p99_now(self) -> list[float | None]:
        """Each window's p99; the open windows' from what they hold so far."""
        shown: list[float | None] = [None if np.isnan(v) else v for v in self.p99]
        for window, chunks in self.pending.items():
            shown[window] = float(np.percentile(np.concatenate(chunks), 99))
        return shown


class RunFollower:
    """The live aggregates of one run's growing stream (see the module's docstring for how it is read)."""

    def __init__(self, stream_path: Path, threshold_ns: int) -> None:
        self.path = Path(stream_path)
        self.threshold_ns = threshold_ns
        self._reader = StreamReader(self.path, keep=False)
        self.samples = 0
        self.sum_ns = 0
        self.max_ns: int | None = None
        self.outliers = 0  # samples above threshold_ns
        self.overruns = 0  # periods without a sample: seen in the samples' times, then the agent's own count
        self.prometheus_counts = np.zeros(len(PROMETHEUS_BUCKETS_NS) + 1, np.int64)  # last: above the last bound
        self.page_counts = np.zeros(PAGE_EDGES_NS.size + 1, np.int64)
        self.windows = _Windows()
        self.ended = False
        self.end_reason: str | None = None
        self.error: str | None = None
        self.last_t_ns: int | None = None
        self._origin: int | None = None
        self._previous: dict[int, int] = {}  # thread -> time of its last sample

    @property
    def header(self) -> dict[str, Any] | None:
        return self._reader.header

    @property
    def value_field(self) -> str | None:
        return None if self.header is None else str(self.header.get("value_field"))

    @property
    def timed(self) -> bool:
        """The values are durations in ns (latencies, gaps): the histogram and the time metrics apply."""
        return bool(self.value_field and self.value_field.endswith("_ns"))

    def poll(self) -> int:
        """Read what the recorder appended since the last poll; the number of new samples."""
        if self.ended or self.error:
            return 0
        new = 0
        try:
            for _ in range(STEPS_PER_POLL):
                records = self._reader.poll(limit=STEP_RECORDS)
                if records.size:
                    self._fold(records)
                    new += int(records.size)
                if self._reader.ended:
                    self._finish()
                    break
                if records.size < STEP_RECORDS:
                    break
        except InputError as exc:  # not a stream (yet another format, a damaged file): said, not fatal
            self.error = str(exc)[:300]
            self._reader.close()
        return new

    def close(self) -> None:
        self._reader.close()

    def _fold(self, records: np.ndarray) -> None:
        values = records["value"].astype(np.int64)
        times = records["t_ns"].astype(np.int64)
        self.samples += int(values.size)
        self.sum_ns += int(values.sum())
        top = int(values.max())
        self.max_ns = top if self.max_ns is None else max(self.max_ns, top)
        self.outliers += int(np.count_nonzero(values > self.threshold_ns))
        self.prometheus_counts += np.bincount(np.searchsorted(PROMETHEUS_BUCKETS_NS, values, side="left"),
                                              minlength=self.prometheus_counts.size)
        self.page_counts += np.bincount(np.searchsorted(PAGE_EDGES_NS, values, side="right"),
                                        minlength=self.page_counts.size)
        if self._origin is None:
            start = (self.header or {}).get("start_monotonic_ns")
            self._origin = int(start) if isinstance(start, int) and start <= int(times.min()) else int(times.min())
        self.windows.add(np.maximum(times - self._origin, 0), values)
        self.last_t_ns = max(self.last_t_ns or 0, int(times.max()))
        self._count_overruns(times, records["thread"].astype(np.int64))

    def _count_overruns(self, times: np.ndarray, threads: np.ndarray) -> None:
        """Periods that passed without a sample (a periodic probe's gaps of k periods hold k-1 of them): what
        the timer agent counts as overruns and reports at its end."""
        params = (self.header or {}).get("params") or {}
        interval = params.get("interval")
        if not isinstance(interval, int) or interval <= 0 or (self.header or {}).get("probe") != "timer":
            return
        distance = int(params["distance"]) if isinstance(params.get("distance"), int) else 0
        for thread in np.unique(threads):
            mine = np.sort(times[threads == thread])
            period = interval + int(thread) * distance
            before = self._previous.get(int(thread))
            steps = np.diff(mine if before is None else np.concatenate(([before], mine)))
            self.overruns += int(np.clip(np.rint(steps / period) - 1, 0, None).sum())
            self._previous[int(thread)] = int(mine[-1])

    def _finish(self) -> None:
        """END read: the agent's own counts replace what was inferred."""
        stream = self._reader.finish()
        self.ended, self.end_reason = True, stream.end_reason
        if stream.missed_periods is not None:
            self.overruns = stream.missed_periods
        self.windows.close_all()

    def elapsed_s(self) -> float:
        """Measured time so far: from the stream's start to its newest sample."""
        if self.last_t_ns is None or self._origin is None:
            return 0.0
        return (self.last_t_ns - self._origin) / 1e9

    def quantile_ns(self, q: float) -> float | None:
        """An upper bound of the q-quantile so far: the upper edge of the page histogram's bin holding it
        (bins are 12 % wide; the exact value is in the run's statistics once it ends)."""
        if not self.samples:
            return None
        rank = int(np.searchsorted(np.cumsum(self.page_counts), max(1, int(np.ceil(q * self.samples)))))
        return float(PAGE_EDGES_NS[rank]) if rank < PAGE_EDGES_NS.size else float(self.max_ns or 0)

    def page_view(self, points: int = 600) -> dict[str, Any]:
        """What the page draws of the run so far: the histogram's non-empty bins and the windows' maxima and
        p99 (at most ``points`` of them: neighbours merged for the drawing)."""
        present = np.flatnonzero(self.page_counts)
        edges = np.concatenate(([0], PAGE_EDGES_NS, [max(self.max_ns or 0, int(PAGE_EDGES_NS[-1]))]))
        merge = max(1, -(-len(self.windows.count) // points))
        tops, p99s = self.windows.top, self.windows.p99_now()
        shown_top = [max(tops[i:i + merge]) for i in range(0, len(tops), merge)]
        shown_p99 = [max((v for v in p99s[i:i + merge] if v is not None), default=None)
                     for i in range(0, len(p99s), merge)]
        return {"samples": self.samples, "max_ns": self.max_ns, "p99_ns": self.quantile_ns(0.99),
                "mean_ns": self.sum_ns / self.samples if self.samples else None, "outliers": self.outliers,
                "threshold_ns": self.threshold_ns, "overruns": self.overruns, "elapsed_s": self.elapsed_s(),
                "ended": self.ended, "end_reason": self.end_reason, "error": self.error,
                "value_field": self.value_field,
                "histogram": [[int(edges[i]), int(edges[i + 1]), int(self.page_counts[i])] for i in present],
                "window_s": self.windows.width_ns * merge / 1e9, "window_max_ns": shown_top,
                "window_p99_ns": shown_p99}
