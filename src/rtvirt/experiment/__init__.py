"""Experiments: grids of design points × questions over thousands of random systems (docs/experiments.md).

``load(spec)`` reads an experiment file or a built-in's name; ``run_experiment`` answers it on a pool
(``open_pool``: local processes, or a Dask cluster) into a run of the results store; ``summarize`` and
``write_figures`` turn its records into acceptance curves, bandwidths and the dominance table."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import InputError
from .builtin import builtin_names, builtin_text
from .executors import open_pool
from .records import finish_run, iter_records, open_experiment_run, read_records
from .runner import Progress, run_experiment
from .spec import Experiment, load_experiment, parse_experiment
from .summary import summarize

__all__ = ["Experiment", "Progress", "load", "builtin_names", "open_pool", "run_experiment", "open_experiment_run",
           "finish_run", "iter_records", "read_records", "summarize"]


def load(spec: str) -> Experiment:
    """An experiment file, or the name of a built-in experiment."""
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        return load_experiment(path)
    text = builtin_text(spec)
    if text is None:
        raise InputError(f"experiment {spec!r}: no such file, and not a built-in "
                         f"({', '.join(builtin_names())})")
    return parse_experiment(tomllib.loads(text), f"built-in experiment {spec}")
