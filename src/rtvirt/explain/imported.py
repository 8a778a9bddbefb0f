"""A trace file a user already has, joined with a run into its explanation (``rtvirt explain RUN --trace FILE``).

Read: a trace-cmd ``.dat`` (through ``trace-cmd report -N``: every event as the kernel formats it), or a text
trace in the tracefs format: the ``trace`` file of an instance, ``trace-cmd report -N`` output saved, or the
trace rtla timerlat saves (``rtla timerlat top -a``/``-t FILE``), whose osnoise events (irq_noise,
softirq_noise, thread_noise, nmi_noise) already say when and how long each interference ran.

The file must be on the run's sample clock (recorded where the samples were taken, with ``-C mono`` for a host
run): the join checks it instead of trusting it. The measuring thread (``rtvirt-probe``, or timerlat's
``timerlat/N``) is switched in at the end of each outlier window; the distance between the two that 95 % of the
windows the trace covers stay within is the alignment uncertainty stated (a note counts the windows beyond it,
where the thread lost its CPU unseen before it read the clock). A trace that covers no outlier, or whose
measuring thread ran nowhere near the windows' ends, is refused (exit 2) naming the file and what to do.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .attribute import attribute, choose_threshold, outlier_windows
from .config import ExplainConfig
from .cpuevents import AGENT_COMMS, occupancies_from_events, unexplained
from .host import near_windows
from .model import Explanation, Layer, LayerTrace, Occupancy
from .stored import read_explanation
from .timerpath import agent_bound, timer_path
from .tracefs import TEXT_RESOLUTION_NS, TraceEvent, bounded, mark_losses, parse_trace

__all__ = ["read_trace_file", "explain_with_trace", "noise_occupancies", "run_layer", "TRACE_CMD_TIMEOUT_S"]

DAT_MAGIC = b"\x17\x08\x44tracing"
# environments whose samples are taken on the traced machine itself (its host layer); the others measure in a
# guest, whose own trace is the guest layer
HOST_KINDS = ("host", "partition", "ssh")
TRACE_CMD_TIMEOUT_S = 600
ALIGNED_SHARE = 0.95  # the stated alignment holds for this share of the covered windows
MAX_FILE_BYTES = 4 << 30  # a text trace larger than this is not read
_INSTANCE_PREFIX = re.compile(r"^[\w.-]{1,64}: (?=\s*\S.{0,15}?-\d+\s+(?:\(\s*[-\d]+\)\s+)?\[\d+\])")
# osnoise's noise events: "<name>:<id> start <s>.<ns> duration <ns> ns" (nmi_noise: no name)
_NOISE = re.compile(r"^\s*(?:(?P<name>.*?):(?P<id>-?\d+)\s+)?start\s+(?P<sec>\d+)\.(?P<nsec>\d{9})\s+"
                    r"duration\s+(?P<duration>\d+)\s+ns")
_NOISE_KINDS = {"irq_noise": "irq", "softirq_noise": "softirq", "thread_noise": "task", "nmi_noise": "irq"}


def _is_agent_comm(comm: str) -> bool:
    return comm in AGENT_COMMS or comm.startswith("timerlat/")


def _trace_cmd(*args: str, path: Path) -> str:
    if shutil.which("trace-cmd") is None:
        raise InputError(f"--trace {path}: reading a .dat file needs trace-cmd (scripts/setup.sh tools installs it)")
    try:
        done = subprocess.run(["trace-cmd", *args, "-i", str(path)], capture_output=True, text=True,
                              errors="replace", timeout=TRACE_CMD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"--trace {path}: trace-cmd {args[0]} took over {TRACE_CMD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split())[-300:]
        raise InputError(f"--trace {path}: trace-cmd cannot read it ({reason or f'exit {done.returncode}'})")
    return done.stdout


def _dat_clock(path: Path) -> str | None:
    """The trace clock a .dat names ([mono] among the clocks listed). trace-cmd extract writes the top
    level's, not its instance's: the join's own check is what counts."""
    found = re.search(r"\[(\w[\w-]*)\]", _trace_cmd("dump", "--options", path=path).partition("TRACECLOCK")[2])
    return found.group(1) if found else None


def read_trace_file(path: Path) -> tuple[list[TraceEvent], str]:
    """The events of a trace file, and what it is ("trace-cmd .dat, clock mono", "text trace")."""
    try:
        with path.open("rb") as file:
            head = file.read(len(DAT_MAGIC))
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"--trace {path}: cannot read it ({exc.strerror})") from None
    if head == DAT_MAGIC:
        clock = _dat_clock(path)
        text = _trace_cmd("report", "-N", path=path)  # no plugins: each event as the kernel formats it
        what = f"trace-cmd .dat (trace clock {clock or 'not recorded'})"
    else:
        if size > MAX_FILE_BYTES:
            raise InputError(f"--trace {path}: {size} bytes, more than a text trace read here "
                             f"({MAX_FILE_BYTES >> 30} GiB): cut it to the run's time")
        text = path.read_text(errors="replace")
        what = "text trace"
    # trace-cmd pads each event's name with spaces: its body starts where the kernel's format does
    events = [event._replace(body=event.body.lstrip())
              for event in parse_trace(mark_losses([_INSTANCE_PREFIX.sub("", line) for line in text.splitlines()]))]
    if not events:
        raise InputError(f"--trace {path}: no trace events in it (a trace-cmd .dat, or a text trace in the tracefs "
                         "format: an instance's trace file, `trace-cmd report -N` output, rtla's saved trace)")
    events.sort(key=lambda event: (event.cpu, event.ts_ns))
    return events, what


def noise_occupancies(events: Iterable[TraceEvent], layer: Layer) -> list[Occupancy]:
    """rtla/osnoise noise events as intervals (their start and duration are in the event itself)."""
    found = []
    for event in events:
        kind = _NOISE_KINDS.get(event.event)
        match = _NOISE.match(event.body) if kind else None
        if kind is None or match is None:
            continue
        start = int(match["sec"]) * 1_000_000_000 + int(match["nsec"])
        name = bounded((match["name"] or "nmi").strip(), 32)
        if event.event == "thread_noise" and _is_agent_comm(name):
            continue
        cause = {"irq": f"irq {match['id']} {name}", "softirq": f"softirq {name}",
                 "task": f"task {name}/{match['id']}"}[kind] if event.event != "nmi_noise" else "nmi"
        found.append(Occupancy(layer, start, start + int(match["duration"]), cause, kind, event.cpu,
                               {"source": event.event, "name": name}))
    return found


def _agent_switch_ins(occupancies: list[Occupancy]) -> dict[int, np.ndarray]:
    """Per CPU, when the measuring thread was switched in (its "agent" intervals start there)."""
    switch_ins: dict[int, list[int]] = {}
    for occupancy in occupancies:
        if occupancy.kind == "agent":
            switch_ins.setdefault(occupancy.cpu, []).append(occupancy.start_ns)
    return {cpu: np.array(sorted(times), np.int64) for cpu, times in switch_ins.items()}


def _alignment(path: Path, events: list[TraceEvent], switch_ins: dict[int, np.ndarray], windows: np.ndarray,
               what: str) -> tuple[int, int, str | None]:
    """(uncertainty, windows covered, a note on the windows beyond it): how far the measuring thread's
    switch-in is from the covered windows' ends (ALIGNED_SHARE of them lie within). Refuses a trace that
    covers no window or does not line up with them."""
    first = {cpu: min(e.ts_ns for e in events if e.cpu == cpu) for cpu in {e.cpu for e in events}}
    last = {cpu: max(e.ts_ns for e in events if e.cpu == cpu) for cpu in first}
    covered = [(start, end, cpu) for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(),
                                                            windows["cpu"].tolist(), strict=True)
               if cpu in first and first[cpu] <= start and end <= last[cpu]]
    span = f"{min(first.values()) / 1e9:.6f} s to {max(last.values()) / 1e9:.6f} s"
    if not covered:
        raise InputError(f"--trace {path}: its events ({span}, {what}) cover none of the run's outliers "
                         f"({windows['start_ns'].min() / 1e9:.6f} s to {windows['end_ns'].max() / 1e9:.6f} s on the "
                         "sample clock): record it while the run runs, where its samples are taken, on the mono "
                         "clock (trace-cmd record -C mono)")
    distances, after = [], 0
    for start, end, cpu in covered:
        times = switch_ins.get(cpu, np.empty(0, np.int64))
        inside = times[(times >= start) & (times <= end + TEXT_RESOLUTION_NS)]
        # on a clock running late, each window's own switch-in lies just after its end (and one of the period
        # before may fall inside a long window): the switch-in nearest to the end says which
        near = times[(times >= end - (end - start)) & (times <= end + (end - start))]
        if near.size and int(near[np.argmin(np.abs(near - end))]) > end + TEXT_RESOLUTION_NS:
            after += 1
        elif inside.size:
            distances.append(max(end - int(inside.max()), 0))
    if len(distances) * 2 < len(covered) or after * 2 > len(covered):
        raise InputError(f"--trace {path}: the measuring thread ({', '.join(AGENT_COMMS)} or timerlat/N) is switched "
                         f"in at the end of {len(distances)} of the {len(covered)} outliers the trace covers: it is "
                         f"not on the run's sample clock ({what}) or does not trace sched:sched_switch on the "
                         "measured CPUs; record with trace-cmd record -C mono -e sched -e irq where the run measures")
    # a clock offset shifts every switch-in; a thread that was switched in and then lost its CPU unseen (an outer
    # hypervisor's steal, an SMI) before it read the clock widens one window: a quantile, not the largest
    ordered = np.sort(np.array(distances, np.int64))
    alignment = max(TEXT_RESOLUTION_NS, int(ordered[math.ceil(ALIGNED_SHARE * ordered.size) - 1]))
    beyond = int(np.count_nonzero(ordered > alignment))
    note = (f"in {beyond} of the {ordered.size} windows the measuring thread was switched in up to "
            f"{ordered[-1] / 1000:.0f} us before it read the clock (time the trace shows no event for: the CPU "
            "was taken from under the kernel, or an event was lost)") if beyond else None
    return alignment, len(covered), note


def _run_windows(run: Any, config: ExplainConfig) -> tuple[np.ndarray, int, str, int]:
    """The run's outlier windows from its samples: (windows, outliers, threshold rule, threshold)."""
    if run.value_field not in ("latency_ns", "duration_ns") or not run.has_samples:
        raise InputError(f"RUN {run.path}: its samples ({run.value_field or 'none'}) are not time windows a trace "
                         "could explain")
    batches = list(run.iter_batches(["t_ns", run.value_field, "cpu"]))
    t_ns, values, cpus = (np.concatenate([batch.column(i).to_numpy() for batch in batches]).astype(np.int64)
                          for i in range(3))
    threshold, rule = choose_threshold(values, threshold_ns=config.threshold, floor_ns=config.floor,
                                       quantile=config.quantile)
    windows, outliers = outlier_windows(t_ns, values, cpus, threshold, config.top)
    if windows.size == 0:
        raise InputError(f"RUN {run.path}: no sample above the threshold ({rule}): nothing to explain")
    return windows, outliers, rule, threshold


def run_layer(manifest: dict[str, Any]) -> Layer:
    """The layer a trace of the machine the run's samples were taken on is: the host's for a run on a host, a
    partition, an SSH target or a one-off probe; the guest's for a run in a VM (the environment's kind, not
    its label, which a scenario names freely)."""
    detail = manifest.get("environment_detail")
    kind = detail.get("kind") if isinstance(detail, dict) else None
    return "host" if kind is None or kind in HOST_KINDS else "guest"


def _stale(stored: Explanation | None, windows: np.ndarray, layer: Layer) -> tuple[list[LayerTrace], list[Occupancy],
                                                                                   list[str]]:
    """The run's stored layers other than ``layer``, and, for the windows they kept no trace around (outliers
    new below the stored threshold), what says so: their unexplained time names it, and a note counts them."""
    if stored is None:
        return [], [], []
    others = [trace for trace in stored.layers if trace.layer != layer]
    kept = {(part.sample_t_ns, part.cpu) for part in stored.parts}
    seen = [trace.layer for trace in others if trace.seen]
    new = [(int(start), int(end), int(cpu)) for start, end, cpu in
           zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(), strict=True)
           if (int(start), int(cpu)) not in kept]
    if not seen or not new:
        return others, [], []
    said = f"{', '.join(seen)}: not kept for this outlier"
    marks = [unexplained(start, end, said, cpu) for start, end, cpu in new]
    note = (f"{len(new)} of the {len(windows)} outliers were not among those the run explained when it was traced: "
            f"the stored {', '.join(seen)} layer kept nothing around them (their parts name only this trace)")
    return others, marks, [note]


def explain_with_trace(run: Any, path: Path, config: ExplainConfig) -> Explanation:
    """The run's explanation with ``path``'s events as its measuring layer (the host for a run on the host,
    else the guest): other layers the run already has keep their occupancies and are attributed again."""
    events, what = read_trace_file(path)
    windows, outliers, rule, threshold = _run_windows(run, config)
    occupancies = near_windows(occupancies_from_events(events, (), agents_by_comm=True), windows)
    alignment, covered, beyond = _alignment(path, events, _agent_switch_ins(occupancies), windows, what)
    layer = run_layer(run.manifest)
    occupancies = agent_bound(occupancies, windows, str(run.manifest.get("probe") or ""))
    if run.manifest.get("probe") == "timer":
        occupancies += timer_path(occupancies, windows)
    occupancies += near_windows(noise_occupancies(events, layer), windows)
    if layer != "host":
        occupancies = [dataclasses.replace(o, layer=layer) if o.layer != "unexplained" else o for o in occupancies]
    others, marks, stale = _stale(read_explanation(run.path), windows, layer)
    notes = [f"imported from {bounded(path.name, 120)} ({what}): it covers {covered} of the {len(windows)} "
             "explained outliers", *([beyond] if beyond else []), *stale]
    imported = LayerTrace(layer, seen=True, occupancies=occupancies + marks,
                          alignment_ns=alignment, notes=notes)
    return attribute(windows, [imported, *others], threshold_ns=threshold, threshold_rule=rule, outliers=outliers)
