"""Run a flat task set in SimSo 0.8.5 (inside its own virtual environment: SimPy 2.3.1) and write every job.

Usage: simso-venv/bin/python simso_runner.py IN.json OUT.json
IN:  {"scheduler": "EDF" | "RM", "duration_ms": float, "tasks": [[period_ms, wcet_ms, offset_ms], ...]}
OUT: {"seconds": wall time of the run, "jobs": [[task_index, activation_ns, end_ns], ...]} (finished jobs only)
Times must be exact binary fractions of a millisecond (e.g. multiples of 1/64 ms) so both tools see the same
integer nanoseconds (SimSo counts 1,000,000 cycles per ms here).
"""

import contextlib
import json
import os
import sys
import time

from simso.configuration import Configuration
from simso.core import Model


def main() -> None:
    with open(sys.argv[1]) as source:
        spec = json.load(source)
    config = Configuration()
    config.duration = int(spec["duration_ms"] * config.cycles_per_ms)
    for index, (period, wcet, offset) in enumerate(spec["tasks"]):
        config.add_task(name=f"T{index}", identifier=index + 1, period=period, activation_date=offset, wcet=wcet,
                        deadline=period)
    config.add_processor(name="CPU 1", identifier=1)
    config.scheduler_info.clas = f"simso.schedulers.{spec['scheduler']}"
    config.check_all()
    model = Model(config)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # SimSo's schedulers print each decision
        started = time.perf_counter()
        model.run_model()
        seconds = time.perf_counter() - started
    jobs = []
    for task in model.results.tasks:
        index = task.identifier - 1
        for job in task.jobs:
            if job.end_date is not None:
                jobs.append([index, round(job.activation_date * 1_000_000), int(job.end_date)])
    with open(sys.argv[2], "w") as target:
        json.dump({"seconds": seconds, "jobs": jobs}, target)


if __name__ == "__main__":
    main()
