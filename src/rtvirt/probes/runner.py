"""Run one probe: preflight, start the agent under supervision, follow its stream, stop it cleanly."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..agents import agent_failure, agent_path
from ..errors import InputError, PrivilegeError
from ..params import CommonParams
from ..procs import Supervisor
from ..stream import SampleStream, StreamReader
from .base import ProbeSpec

__all__ = ["Progress", "run_probe", "check_privileges", "follow_stream"]


@dataclass
class Progress:
    """What a progress display needs, updated as samples arrive."""

    elapsed_s: float
    duration_s: float | None
    samples: int
    running_max: int | None


def check_privileges(params: CommonParams) -> None:
    """Say up front, naming the option, when SCHED_FIFO or mlockall will be refused."""
    if os.geteuid() == 0:
        return
    if params.priority > 0 and resource.getrlimit(resource.RLIMIT_RTPRIO)[0] < params.priority:
        raise PrivilegeError(
            f"option -p/--priority {params.priority}: SCHED_FIFO needs root or CAP_SYS_NICE "
            "(or an RLIMIT_RTPRIO that allows it); use --no-rt to measure without real-time priority"
        )
    if params.mlock and resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] != resource.RLIM_INFINITY:
        raise PrivilegeError("option -m/--mlock: mlockall needs root or an unlimited RLIMIT_MEMLOCK; "
                             "use --no-mlock or --no-rt")


def follow_stream(poll: Callable[[], int | None], reader: StreamReader, params: CommonParams,
                  on_progress: Callable[[Progress], None] | None, poll_interval: float) -> None:
    """Read new samples while the agent runs (``poll()`` is None), reporting progress; any agent, anywhere."""
    duration_s = params.duration / 1e9 if params.duration else None
    running_max: int | None = None
    samples = 0
    started = time.monotonic()
    while poll() is None:
        time.sleep(poll_interval)
        new = reader.poll()
        if new.size:
            samples += int(new.size)
            peak = int(np.max(new["value"]))
            running_max = peak if running_max is None else max(running_max, peak)
        if on_progress:
            on_progress(Progress(time.monotonic() - started, duration_s, samples, running_max))


def run_probe(
    spec: ProbeSpec,
    params: CommonParams,
    out: Path,
    on_progress: Callable[[Progress], None] | None = None,
    poll_interval: float = 0.25,
    on_launch: Callable[[int], None] | None = None,
) -> SampleStream:
    """Run ``spec`` with ``params``, writing the raw stream to ``out``; return every sample taken.

    KeyboardInterrupt (Ctrl-C, or SIGTERM mapped to it by the CLI) stops the agent, which flushes its
    rings and marks the stream as ended by a signal; the samples are returned all the same.
    ``on_launch(pid)`` is told the agent's pid once it started (an explanation leaves the agent out).
    """
    params.check_host()
    check_privileges(params)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = spec.command(params, str(agent_path("rtvirt-probe")))
    argv.append(f"--out={out}")
    reader = StreamReader(out)
    with Supervisor() as supervisor:
        proc = supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if on_launch is not None:
            on_launch(proc.pid)
        try:
            follow_stream(proc.poll, reader, params, on_progress, poll_interval)
        except KeyboardInterrupt:
            supervisor.stop(proc, grace=10.0)
        status = proc.wait()
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status != 0:
        error = agent_failure(status, stderr)
        if isinstance(error, (InputError, PrivilegeError)) or not out.exists():
            raise error
    stream = reader.finish()
    if status != 0 and stream.records.size == 0:
        raise agent_failure(status, stderr)
    if status != 0 and stream.end_reason != "signal":
        stream.error = str(agent_failure(status, stderr))  # samples kept; the caller reports the failure
    return stream
