"""Test data for the results tests: real probe runs (briefly) and synthetic runs where exactness matters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rtvirt.probes import PROBES
from rtvirt.probes.runner import run_probe
from rtvirt.store import new_run, write_measured_run, write_run

SEC = 1_000_000_000


def real_timer_run(results: Path, duration: str = "1s", **extra: Any) -> dict[str, Any]:
    """A real timer-probe run through the library, as `rtvirt probe timer` writes it."""
    spec = PROBES["timer"]
    params = spec.params.model_validate({"duration": duration, "interval": "1ms", "threads": 2, "affinity": "0-1"})
    run = new_run(results, "timer")
    stream = run_probe(spec, params, run.stream_path)
    return write_measured_run(run, stream, name="timer", params=params.model_dump(mode="json"),
                              group_by=spec.group_by, extra=extra)


def samples_table(t_ns: np.ndarray, values: np.ndarray, cpu: np.ndarray | None = None,
                  kinds: list[str] | None = None, value_field: str = "latency_ns") -> pa.Table:
    n = values.size
    return pa.table({
        "t_ns": pa.array(t_ns.astype(np.int64)),
        value_field: pa.array(values.astype(np.int64)),
        "cpu": pa.array((cpu if cpu is not None else np.zeros(n)).astype(np.int16)),
        "thread": pa.array(np.zeros(n, np.int16)),
        "kind": pa.array(kinds or ["wakeup"] * n, pa.string()).dictionary_encode(),
    })


def synthetic_run(results: Path, name: str, values: np.ndarray, *, period_ns: int = 1_000_000,
                  cpu: np.ndarray | None = None, **manifest: Any) -> dict[str, Any]:
    run = new_run(results, name)
    t = np.arange(values.size, dtype=np.int64) * period_ns + 10 * SEC
    document = {"name": name, "source": "measured", "probe": "timer", "value_field": "latency_ns", **manifest}
    return write_run(run, samples_table(t, values, cpu, value_field=document["value_field"]), document,
                     group_by="cpu")
