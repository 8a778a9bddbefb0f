"""One probe run on an SSH target (``rtvirt probe NAME --target``): the same parameters as locally, the
samples streamed back live over the SSH channel, the target's audit for the manifest."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agents import agent_failure
from ..errors import InputError, PrivilegeError, RunError
from ..params import CommonParams
from ..probes.base import ProbeSpec
from ..probes.runner import Progress, follow_stream
from ..stream import SampleStream, StreamReader
from ..sysaudit import audit_system
from .agents import TargetLink
from .system import RemoteSystem
from .target import SshTarget

__all__ = ["DEFAULT_REMOTE_DIR", "run_probe_on_target"]

DEFAULT_REMOTE_DIR = "/var/tmp/rtvirt"


def run_probe_on_target(spec: ProbeSpec, params: CommonParams, out: Path, target: SshTarget, *,
                        on_progress: Callable[[Progress], None] | None = None, remote_dir: str = DEFAULT_REMOTE_DIR,
                        reconnect_timeout: float = 60.0, poll_interval: float = 0.25,
                        stop: threading.Event | None = None, reclaim: bool = True,
                        on_launch: Callable[[int], None] | None = None) -> tuple[SampleStream, dict[str, Any]]:
    """Run ``spec`` on ``target``; return its samples and the manifest's ``target`` section.

    A dropped connection keeps every sample received; the agent's copy on the target is fetched after
    reconnecting (``target.connection``, ``target.recovered``) and the run is partial. Ctrl-C stops the
    agent, which flushes first, and so does setting ``stop`` (from another thread). Nothing we started is
    left on the target (``target.leftovers`` says what had to be killed).
    """
    link = TargetLink(target, remote_dir)
    section: dict[str, Any] = {"label": target.label}
    probing = contextlib.ExitStack()  # what the probe's launch set up, until it ended
    try:
        connection = link.connection()
        if reclaim:  # a lab reclaims every target first: two of its targets may be one machine
            section["leftovers_before"] = link.reclaim()
        section["audit"] = {"arch": connection.arch(), **audit_system(RemoteSystem(connection))}
        online = RemoteSystem(connection).cpus()
        _check_cpus(params, online, target)
        args = spec.command(params, "rtvirt-probe")[1:]
        if kept := probing.enter_context(link.controller_off(getattr(params, "affinity", None) or online)):
            section["controller"] = kept
        agent = link.start("rtvirt-probe", args, out, tee_name=f"{spec.name}-{time.time_ns()}.rtvs")
        if on_launch is not None and (pid := agent.pid()) is not None:
            on_launch(pid)  # its pid on the target: an explanation tells its threads from what ran instead
        def poll() -> int | None:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            return agent.poll()

        try:
            follow_stream(poll, StreamReader(out), params, on_progress, poll_interval)
        except KeyboardInterrupt:
            agent.stop()
        status = agent.poll()
        if agent.lost:
            section["connection"] = "lost"
            section["recovered"] = agent.recover(reconnect_timeout)
        else:
            section["connection"] = "kept"
        section["leftovers"] = agent.cleanup()
    finally:
        probing.close()
        link.close()
    reader = StreamReader(out)  # read afresh: the recovered copy may have replaced the file
    if status != 0 and not agent.lost:
        error = agent_failure(status or 1, agent.error_tail())
        if isinstance(error, (InputError, PrivilegeError)) or not out.exists():
            raise error
    stream = reader.finish()
    if stream.records.size == 0 and (status != 0 or agent.lost):
        raise RunError(f"ssh target {target.label}: no samples: {agent.error_tail()[-300:]}")
    if agent.lost:
        stream.end_reason = None if stream.end_reason == "complete" else stream.end_reason
    elif status != 0 and stream.end_reason != "signal":
        stream.error = str(agent_failure(status or 1, agent.error_tail()))
    return stream, section


def _check_cpus(params: CommonParams, online: list[int], target: SshTarget) -> None:
    """CPU options are checked against the target's CPUs, not this machine's."""
    wanted = getattr(params, "affinity", None) or ()
    missing = sorted(set(wanted) - set(online))
    if missing:
        raise InputError(f"option --affinity: CPU {missing[0]} is not online on {target.label} "
                         f"(online: {','.join(map(str, online))[:200]})")
