"""The driver of an experiment: plans chunks per design point, keeps a bounded number of them in flight on the
pool, writes each chunk's records as it comes back and decides, point by point, when it has enough systems.

With a fixed count every chunk of every point is planned at once. With ``ci_width`` a point's chunks go one
after the other and the point stops at the first chunk boundary where every acceptance ratio's interval is
narrow enough: the decision reads only chunks 0..k of that point, so it is the same with any number of
workers and after a resume."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from ..store import RunDir
from .executors import Pool
from .questions import run_chunk
from .records import finished_chunks, write_chunk
from .spec import Experiment
from .summary import ci_narrow_enough

__all__ = ["Progress", "run_experiment"]

_DECIDING = ["system", "scheduler", "question", "accepted"]  # the record columns a point's stopping rule reads


@dataclass
class Progress:
    points: int
    points_done: int = 0
    systems_done: int = 0
    chunks_written: int = 0


@dataclass
class _Point:
    index: int
    chunk: int
    limit: int
    width: float | None  # None: a fixed count
    accepted: dict[str, list[bool]] = field(default_factory=dict)
    planned: int = 0  # systems already sent out (or found written)
    written: int = 0
    finished: bool = False

    def add(self, columns: dict[str, list[Any]], systems: int) -> None:
        for scheduler, question, accepted in zip(columns["scheduler"], columns["question"], columns["accepted"],
                                                 strict=True):
            self.accepted.setdefault(f"{question} {scheduler}", []).append(bool(accepted))
        self.written += systems
        self.finished = self.written >= self.limit or (
            self.width is not None and self.written == self.planned and ci_narrow_enough(self.accepted, self.width))

    def plan(self) -> list[tuple[int, int]]:
        """The chunks (start, count) to submit now: all of them, or (adaptive) the next one once the
        previous is back."""
        if self.finished or (self.width is not None and self.planned > self.written):
            return []
        planned = []
        while self.planned < self.limit:
            count = min(self.chunk, self.limit - self.planned)
            planned.append((self.planned, count))
            self.planned += count
            if self.width is not None:
                break
        return planned


def run_experiment(experiment: Experiment, run: RunDir, pool: Pool,
                   on_progress: Callable[[Progress], None] | None = None) -> Progress:
    """Every design point's systems, answered on ``pool`` and written into ``run``. On KeyboardInterrupt the pool
    is closed and every chunk that finished (before or while closing) is written before it is raised again."""
    samples = experiment.samples
    points = [_Point(p.index, samples.chunk, samples.count, samples.ci_width) for p in experiment.points()]
    progress = Progress(len(points))
    document = json.dumps(experiment.model_dump(mode="json"))
    done = finished_chunks(run.path)
    for point in points:  # what an interrupted run finished is read back, not recomputed
        while not point.finished and (point.index, point.written) in done:
            table = pq.read_table(done[(point.index, point.written)], columns=_DECIDING)
            systems = len(set(table.column("system").to_pylist()))
            point.planned += systems
            point.add(table.to_pydict(), systems)
    # with a fixed count, chunks after a missing one may be written already: plan only the missing ones
    queue = deque((point, start, count) for point in points for start, count in point.plan()
                  if (point.index, start) not in done)
    for (index, start), path in done.items():
        point = points[index]
        if point.width is None and start >= point.written:
            table = pq.read_table(path, columns=_DECIDING)
            point.add(table.to_pydict(), len(set(table.column("system").to_pylist())))
    progress.points_done = sum(p.finished for p in points)
    progress.systems_done = sum(p.written for p in points)
    inflight: dict[Any, tuple[_Point, int, int]] = {}
    try:
        while queue or inflight:
            while queue and len(inflight) < 2 * pool.workers:
                point, start, count = queue.popleft()
                inflight[pool.submit(run_chunk, document, point.index, start, count)] = (point, start, count)
            for future in pool.first_done(inflight):
                point, start, count = inflight.pop(future)
                columns = future.result()
                write_chunk(run.path, point.index, start, columns)
                point.add(columns, count)
                queue.extend((point, s, c) for s, c in point.plan())
                progress.systems_done += count
                progress.chunks_written += 1
                progress.points_done = sum(p.finished for p in points)
                if on_progress is not None:
                    on_progress(progress)
    except KeyboardInterrupt:
        _keep_finished(run, inflight)  # chunks still running are lost and computed again by --resume
        pool.close()
        raise
    return progress


def _keep_finished(run: RunDir, inflight: dict[Any, tuple[_Point, int, int]]) -> None:
    for future, (point, start, _) in list(inflight.items()):
        if future.done() and not future.cancelled() and future.exception() is None:
            write_chunk(run.path, point.index, start, future.result())
            del inflight[future]
