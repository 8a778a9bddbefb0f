"""The guest layer: what ran inside a Linux guest on its measuring vCPU, and the timerlat IRQ/thread split.

The guest traces itself: its ``/init`` (environments/guest_image.py) makes a tracefs instance of its own
on the measuring vCPU before its jobs start (the host's set of events: tasks, IRQs, softirqs, IRQ vectors,
timers; ``trace_clock`` mono, i.e. the guest's CLOCK_MONOTONIC, the clock the guest's agent stamps its
samples with: no alignment beyond the text trace's microsecond resolution), and once the main job ended
writes the trace text, each CPU's ring buffer statistics and an end mark to a virtio-serial port whose host
side is a file of the run (a Xen domU: to a listener in dom0, over its vif, whose output is that file). The
host parses it with the host layer's own parser (explain.host) and names each interval as the guest's
("guest task stress-cpu/85 SCHED_OTHER nice 0").

Where the probe is the timer probe's timerlat engine, each sample's IRQ latency (its ``aux``) splits the
window into the timer IRQ's latency and the thread's: the parts of an outlier's window the guest's trace
does not cover are named by that phase ("guest timer IRQ latency", "guest IRQ-to-thread latency") rather
than left unexplained, because the guest's own tracer measured them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..fileio import write_atomically
from .cpuevents import occupancies_from_events, unexplained
from .guest_channel import BEGIN_MARK, END_MARK, GUEST_TRACE_FILE, STATS_MARK
from .guest_stream import GuestChannel, GuestChannelAccess
from .host import HOST_EVENTS, MARGIN_NS, _spans, near_windows
from .model import CollectContext, Layer, LayerTrace, Occupancy
from .recorder import FlightRecorder, KeepRule, bound_notes, keep_rule, listed, run_start_ns, window_label
from .timerpath import agent_bound, timer_path
from .tracefs import TEXT_RESOLUTION_NS, cpu_mask, events_around, line_stamp, mark_losses, parse_trace

__all__ = ["GuestTraceSource", "BaremetalGuestSource", "guest_trace_files", "timerlat_split", "read_guest_trace",
           "guest_buffer_kb", "TIMERLAT_PHASES", "BAREMETAL_PHASES", "STOLEN_CAUSES", "stolen_causes",
           "stolen_occupancies", "stolen_spans", "guest_layer"]

TRACE_LIMIT = 256 << 20  # bytes of a guest's trace the host reads (untrusted text)
# a guest idle in an outlier's window had nothing else to run: its wake-up (the timer IRQ) reached it late
GUEST_LATE_IRQ = "guest timer interrupt late to an idle vCPU"
GUEST_BUFFER_SHARE = 8  # at most 1/8 of the guest's memory for its trace buffers
# a guest ships its trace as text after the run, through an emulated port: a bound on what it holds keeps that
# short (about 3 bytes of text per byte of buffer; the newest events are kept)
GUEST_BUFFER_MAX_KB = 8192


def guest_buffer_kb(buffer_mb: int, memory_mb: int, vcpus: int) -> int:
    """The guest's trace buffer per CPU: the explanation's bound, at most 8 MiB, within a share of the guest's
    memory (the instance has a buffer on every vCPU, traced or not)."""
    return max(64, min(buffer_mb * 1024, GUEST_BUFFER_MAX_KB,
                       memory_mb * 1024 // (GUEST_BUFFER_SHARE * max(vcpus, 1))))


def guest_trace_files(cpus: Iterable[int], buffer_kb: int, flight_recorder: bool = True,
                      events: Iterable[str] = HOST_EVENTS) -> dict[str, bytes]:
    """The files of a run's job archive that make the guest trace itself (read by ``guest_trace``);
    ``flight_recorder``: the guest relays its trace while the run goes (``trace.stream``), its ring keeping the
    newest events when the relay falls behind; else the buffer is sent after the run and keeps the first."""
    cpus = sorted(set(cpus))
    return {"trace.overwrite": b"1\n" if flight_recorder else b"0\n",
            "trace.events": "".join(f"{event}\n" for event in events).encode(),
            "trace.cpumask": f"{cpu_mask(cpus)}\n".encode(), "trace.cpus": " ".join(map(str, cpus)).encode() + b"\n",
            "trace.buffer_kb": f"{int(buffer_kb)}\n".encode(), **({"trace.stream": b"1\n"} if flight_recorder else {})}


@dataclasses.dataclass
class GuestTrace:
    """What a guest sent: its trace lines, drop counts, whether the end mark came (else it was cut short)."""

    lines: list[str]
    dropped: int
    complete: bool
    began: bool

    def by_cpu(self) -> dict[int, list[str]]:
        """Each vCPU's event lines, in time order (comments and lines that are not events left out)."""
        found: dict[int, list[str]] = {}
        for line in mark_losses(self.lines):  # (a loss becomes a gap line on its CPU, read where it happened)
            event = next(parse_trace([line]), None)
            if event is not None:
                found.setdefault(event.cpu, []).append(line)
        return found


def read_guest_trace(path: Path) -> GuestTrace:
    """The guest's trace as the host received it (bounded; untrusted)."""
    with path.open("rb") as f:
        data = f.read(TRACE_LIMIT)
    lines, dropped, complete, began = [], 0, False, False
    for line in data.decode(errors="replace").splitlines():
        if line.startswith(STATS_MARK):
            key, _, value = line.removeprefix(STATS_MARK).split(" ", 2)[-1].partition(":")
            if key.strip() in ("overrun", "dropped events") and value.strip().isdigit():
                dropped += int(value)
        elif line == BEGIN_MARK:
            began = True
        elif line == END_MARK:
            complete = True
        else:
            lines.append(line)
    return GuestTrace(lines, dropped, complete, began)


def guest_occupancies(lines_by_cpu: dict[int, list[str]], context: CollectContext) -> list[Occupancy]:
    """What held each window's vCPU in the guest's trace, read around each window only (from the last switch
    before it, explain.tracefs.events_around): what the flight recorder kept has holes between windows, and
    nothing is carried across them. The trace is read as the host's (its agent known by name: timerlat's kernel
    threads, the probe's real-time threads), along a timer probe's wake-up path, named as the guest's."""
    traced: list[Occupancy] = []
    for cpu, start, end in _spans(context.windows, MARGIN_NS):
        traced += occupancies_from_events(events_around(lines_by_cpu.get(cpu, []), start, end), (),
                                          agents_by_comm=True)
    probe = str(context.header.get("probe") or "")
    traced = agent_bound(traced, context.windows, probe)
    if probe == "timer":
        traced += timer_path(traced, context.windows)
    return [_as_guest(o) for o in near_windows(traced, context.windows)]


GUEST_INSTANCE = Path("/sys/kernel/tracing/instances/rtvirt-guest")  # the guest's own instance (guest_channel)
END_WAIT_S = 30.0  # at most this long for the relayed trace's end mark once the run ended ...
QUIET_S = 3.0  # ... while the file still grows: once it stopped growing this long, the end is not coming


def _wait_for_end(channel: GuestChannel) -> None:
    """Until the guest's end mark has come (its ring statistics with it), the trace stopped arriving, or
    END_WAIT_S passed (the hypervisor may still be writing what the guest sent before it powered off)."""
    deadline, quiet_until = time.monotonic() + END_WAIT_S, time.monotonic() + QUIET_S
    size = -1
    while not channel.complete and time.monotonic() < min(deadline, quiet_until):
        channel.read()
        with contextlib.suppress(OSError):
            if (grown := channel.path.stat().st_size) != size:
                size, quiet_until = grown, time.monotonic() + QUIET_S
        time.sleep(0.1)


def _as_guest(occupancy: Occupancy) -> Occupancy:
    """A guest's own occupancy named as the guest's ("guest task ...", kind "guest-task"); its culprit too."""
    if occupancy.layer == "unexplained":
        return occupancy
    if occupancy.kind == "irq-late":  # its own interrupt came late: a layer below the guest held it back
        return dataclasses.replace(occupancy, layer="guest", cause=f"{GUEST_LATE_IRQ} (held back by a layer not "
                                   "traced from inside the guest: the VM's, an outer hypervisor)",
                                   kind="guest-irq-late", culprit=GUEST_LATE_IRQ)
    culprit = occupancy.culprit or occupancy.cause
    return dataclasses.replace(occupancy, layer="guest", cause=f"guest {occupancy.cause}",
                               kind=f"guest-{occupancy.kind}", culprit=f"guest {culprit}")


# the two phases of a timer sample's window, as the guest measured them: (cause, kind) of each
TIMERLAT_PHASES = (("guest timer IRQ latency (timerlat: expiry to its IRQ handler)", "guest-irq"),
                   ("guest IRQ-to-thread latency (timerlat: IRQ handler to its thread running)", "guest-thread"))
BAREMETAL_PHASES = (("bare-metal guest: timer IRQ not yet entered (expiry to the interrupt's first instruction)",
                     "guest-irq"),
                    ("bare-metal guest: its own kernel from the timer IRQ's entry to the measuring thread",
                     "guest-thread"))


def _window_samples(windows: np.ndarray, t_ns: np.ndarray, cpus: np.ndarray) -> Iterator[tuple[int, int, int, int]]:
    """(sample index, start, end, cpu) of each outlier window whose sample (``t_ns`` = its start, on ``cpus``: two
    threads may plan the same time) is in the run."""
    where = {(int(t), int(c)): index for index, (t, c) in enumerate(zip(t_ns.tolist(), cpus.tolist(), strict=True))}
    for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(),
                               strict=True):
        index = where.get((int(start), int(cpu)))
        if index is not None:
            yield index, int(start), int(end), int(cpu)


def timerlat_split(windows: np.ndarray, t_ns: np.ndarray, irq_ns: np.ndarray, cpus: np.ndarray,
                   phases: tuple[tuple[str, str], ...] = TIMERLAT_PHASES) -> list[Occupancy]:
    """Each outlier window's two phases as the guest measured them: [start, start + IRQ latency) the timer
    IRQ had not been handled (entered, in the bare-metal guest), then until the thread ran. ``t_ns``, ``irq_ns``
    and ``cpus``: the run's samples (``aux``, ``cpu``)."""
    split = []
    for index, start, end, cpu in _window_samples(windows, t_ns, cpus):
        irq_end = min(start + int(irq_ns[index]), end)
        (irq_cause, irq_kind), (thread_cause, thread_kind) = phases
        if irq_end > start:
            split.append(Occupancy("guest", int(start), irq_end, irq_cause, irq_kind, int(cpu),
                                   {"phase": "irq", "sample_t_ns": int(start)}))
        if end > irq_end:
            split.append(Occupancy("guest", irq_end, int(end), thread_cause, thread_kind, int(cpu),
                                   {"phase": "thread", "sample_t_ns": int(start)}))
    return split


def _uncovered(phase: Occupancy, covering: list[Occupancy]) -> list[Occupancy]:
    """The parts of ``phase`` no traced occupancy of its CPU covers (the trace names the rest)."""
    pieces, cursor = [], phase.start_ns
    for occupied in sorted((o for o in covering if o.end_ns > phase.start_ns and o.start_ns < phase.end_ns
                            and o.cpu in (phase.cpu, -1)), key=lambda o: o.start_ns):
        if occupied.start_ns > cursor:
            pieces.append(dataclasses.replace(phase, start_ns=cursor, end_ns=occupied.start_ns))
        cursor = max(cursor, occupied.end_ns)
        if cursor >= phase.end_ns:
            break
    if cursor < phase.end_ns:
        pieces.append(dataclasses.replace(phase, start_ns=cursor))
    return pieces


class GuestTraceSource:
    """The guest layer of one run in a Linux guest: the guest traces itself (``guest_trace_files`` go into the
    run's job archive, its port's host side is ``trace_path``); ``samples`` gives the run's stream path, for
    the timerlat split. The guest arms and stops its tracer itself. ``received``: where the trace comes over a
    connection the environment ends (a Xen domU's), waits (bounded) until the environment holds all of it.

    ``keep`` (the flight recorder) and the run's sample file (``follow``): the guest relays its trace while the
    run goes and a flight recorder keeps what can explain an outlier, at most ``keep_kb`` per traced vCPU
    (``cpus``: the guest's, those ``guest_trace_files`` traces); else the trace the guest sent is read whole."""

    layer: Layer = "guest"

    def __init__(self, trace_path: Path, samples: Callable[[], Path | None],
                 received: Callable[[], None] | None = None, *, keep: KeepRule | None = None, keep_kb: int = 0,
                 cpus: tuple[int, ...] = (0,)) -> None:
        self.trace_path = trace_path
        self.samples = samples
        self.received = received
        self.keep, self.keep_kb, self.cpus = keep, keep_kb, cpus
        self.followed: Path | None = None
        self.channel: GuestChannel | None = None
        self.recorder: FlightRecorder | None = None
        self._kept: GuestTrace | None = None  # what the recorder kept, once it finished

    def follow(self, samples: Path) -> None:
        """The file the run's samples reach while it goes (before ``start``)."""
        self.followed = samples

    def start(self) -> None:
        """The guest arms its tracer itself, before its jobs; with the flight recorder, its relay is followed."""
        if self.keep is None or self.followed is None:
            return
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        self.channel = GuestChannel(self.trace_path)
        recorder = FlightRecorder(GUEST_INSTANCE, self.cpus, self.followed, self.keep,
                                  bound_bytes=self.keep_kb << 10, margin_ns=MARGIN_NS,
                                  access=GuestChannelAccess(self.channel))
        recorder.start()
        self.recorder = recorder

    def stop(self) -> None:
        """The guest stops its tracer itself, after its main job; the environment's receiver may still hold
        the end of what it sent. The flight recorder takes the rest of the relayed trace (once its end mark came,
        or it stopped coming) and keeps what it needs."""
        if self.received is not None:
            self.received()
        if self.recorder is None or self.channel is None or self._kept is not None:
            return
        _wait_for_end(self.channel)
        texts = self.recorder.finish()
        self.channel.close()
        self._kept = kept = GuestTrace([line for cpu in sorted(texts) for line in texts[cpu].splitlines()],
                                       self.channel.dropped, self.channel.complete, self.channel.began)
        # the run keeps what was kept, as the guest would have sent it (the file read meanwhile is all holes)
        write_atomically(self.trace_path, "".join(
            [f"{BEGIN_MARK}\n" if kept.began else "", *(f"{line}\n" for line in kept.lines),
             f"{STATS_MARK} all overrun: {kept.dropped}\n", f"{END_MARK}\n" if kept.complete else ""]))

    def _split(self, context: CollectContext) -> list[Occupancy]:
        if context.header.get("aux_field") != "irq_latency_ns" or (path := self.samples()) is None:
            return []
        from ..stream import read_stream

        records = read_stream(path).records
        return timerlat_split(context.windows, records["t_ns"].astype(np.int64), records["aux"].astype(np.int64),
                              records["cpu"].astype(np.int64))

    def collect(self, context: CollectContext) -> LayerTrace:
        split = self._split(context)
        trace: GuestTrace | None = self._kept
        why: str | None = None
        if trace is None:
            try:
                trace = read_guest_trace(self.trace_path)
            except OSError as exc:
                why = f"the guest's trace did not reach the host ({exc.strerror or exc})"
        if trace is not None and not trace.began:
            why = "the guest sent no trace (its tracefs could not be used)"
        occupancies: list[Occupancy] = []
        notes = []
        outside: set[tuple[int, int]] = set()
        dropped = trace.dropped if trace is not None else 0
        if trace is not None and why is None:
            by_cpu = trace.by_cpu()
            occupancies = guest_occupancies(by_cpu, context)
            outside, said = _outside_trace(by_cpu, context)
            occupancies += [unexplained(start, end, "guest: no trace kept for it", cpu) for start, end, cpu in
                            context.windows[["start_ns", "end_ns", "cpu"]].tolist() if (start, cpu) in outside]
            notes += said
            if not trace.complete:
                notes.append("the guest's trace was cut short (no end mark reached the host)")
            if self.recorder is not None:
                bound, dropped = bound_notes(self.recorder, trace.dropped, context, self.keep_kb, "vCPU")
                notes += [*(self.channel.problems if self.channel is not None else []), *bound]
            elif trace.dropped:
                notes.append(f"the guest's trace buffer bound dropped {trace.dropped} events")
        if split:
            # a window the guest's trace does not hold still has its phases (timerlat measured them), said so
            split = [dataclasses.replace(o, variant="no guest trace kept for it", cause=f"{o.cause} (no guest trace "
                                         "kept for it)") if (o.detail.get("sample_t_ns"), o.cpu) in outside else o
                     for o in split]
            traced = [o for o in occupancies if o.layer != "unexplained"]  # (the phases name what they leave)
            occupancies += [piece for phase in split for piece in _uncovered(phase, traced)]
            notes.append(f"timerlat {_split_note('IRQ handler', split)}")
        if why is not None and not split:
            return LayerTrace("guest", seen=False, why_not=why)
        if why is not None:
            notes.append(why)
        occupancies.sort(key=lambda o: (o.cpu, o.start_ns))
        return LayerTrace("guest", seen=True, occupancies=occupancies, alignment_ns=TEXT_RESOLUTION_NS,
                          dropped_events=dropped, notes=notes)


def _outside_trace(lines_by_cpu: dict[int, list[str]], context: CollectContext
                   ) -> tuple[set[tuple[int, int]], list[str]]:
    """The windows (start, vCPU) the guest's kept trace does not hold whole (a buffer read at the end keeps the
    newest events: a long run's early windows have none), and the note naming them."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for cpu, lines in lines_by_cpu.items():
        stamps = [stamp for stamp in (line_stamp(lines[0]), line_stamp(lines[-1])) if stamp is not None] \
            if lines else []
        if stamps:
            first[cpu], last[cpu] = stamps[0], stamps[-1]
    outside, labels = set(), []
    run_start = run_start_ns(context.header)
    for rank, (start, end, cpu, latency) in enumerate(
            context.windows[["start_ns", "end_ns", "cpu", "latency_ns"]].tolist(), 1):
        if cpu not in first or not first[cpu] <= start <= end <= last[cpu]:
            outside.add((int(start), int(cpu)))
            labels.append(window_label(rank, start, cpu, latency, run_start, "vCPU"))
    said = [f"{len(labels)} outlier windows lie outside the guest's kept trace (its buffer keeps the newest events; "
            f"their guest part is not seen): {listed(labels)}"] if labels else []
    return outside, said


class BaremetalGuestSource:
    """The guest layer of rtvirt's bare-metal guest (docs/baremetal.md). Its timer probe stamps each sample
    with the TSC at the timer interrupt's entry (``aux``), so each outlier's window splits into the time
    before the interrupt was entered (the vCPU not running, or the interrupt delivered late: the outer
    layers say which) and its own kernel's time from that entry to the measuring thread. Under Xen and KVM its
    timer and gap probes also read the hypervisor's stolen-time totals around each sample (Xen's runstate area,
    KVM's steal time): the time stolen inside the window (runnable, offline) follows the sample in the stream
    (``SampleStream.stolen``). Nothing else runs in that guest, so no trace is needed."""

    layer: Layer = "guest"

    def __init__(self, samples: Callable[[], Path | None]) -> None:
        self.samples = samples

    def start(self) -> None:
        """Nothing to arm: the guest's probe measures both phases itself."""

    def stop(self) -> None:
        """Nothing to stop."""

    def collect(self, context: CollectContext) -> LayerTrace:
        path = self.samples()
        timed = context.header.get("aux_field") == "irq_latency_ns"
        stolen_measured = bool(context.header.get("stolen"))
        untimed = (f"the bare-metal guest's {context.header.get('probe')} probe does not time its interrupts (only "
                   "the timer probe does)")
        if path is None or not (timed or stolen_measured):
            return LayerTrace("guest", seen=False, why_not=untimed if path is not None else
                              "the bare-metal guest's samples did not reach the host")
        from ..stream import read_stream

        stream = read_stream(path)
        records = stream.records
        t_ns, aux = records["t_ns"].astype(np.int64), records["aux"].astype(np.int64)
        cpus = records["cpu"].astype(np.int64)
        split = timerlat_split(context.windows, t_ns, aux, cpus, BAREMETAL_PHASES) if timed else []
        notes = [_split_note("IRQ entry", split)] if split else [] if timed else [untimed]
        stolen: list[Occupancy] = []
        if stolen_measured:
            runnable, offline = stream.stolen_per_sample()
            source = str(context.header.get("stolen"))
            stolen = stolen_occupancies(context.windows, t_ns, records["value"].astype(np.int64), runnable, offline,
                                        aux if timed else None, cpus, stolen_causes(source))
            notes.append(_stolen_note(stolen, len(context.windows), source))
        tsc = context.header.get("cycles_hz")
        resolution = int(1e9 / float(tsc)) + 1 if isinstance(tsc, (int, float)) and tsc > 0 else 1
        return LayerTrace("guest", seen=True, occupancies=split + stolen, alignment_ns=resolution, notes=notes)


# By the stream header's "stolen" source (docs/sample-stream.md): who stole the time, where the guest read it (for
# the cause), the same for the layer's note, and the parts' detail.source
_STOLEN_BY = {"xen-runstate": ("Xen", "the guest's runstate area", "its runstate area", "runstate area"),
              "kvm-steal-time": ("the host", "KVM's steal time, read by the guest", "KVM's steal-time area",
                                 "KVM steal time"),
              "kvm-pv-time": ("the host", "KVM's stolen time on Arm, read by the guest",
                              "KVM's stolen-time structure (Arm PV time)", "KVM PV time")}


def _stolen_by(source: str) -> tuple[str, str, str, str]:
    name = source[:40]
    return _STOLEN_BY.get(source, ("the hypervisor", f"{name!r}, read by the guest", repr(name), name))


def stolen_causes(source: str) -> dict[str, str]:
    """The causes of a sample's stolen parts (runnable, offline, and ``source``: the parts' detail), naming who
    stole it and from what the guest read it; the numbers stay in the parts' durations, so that the summary adds
    them up across outliers."""
    who, where, _, detail = _stolen_by(source)
    return {"runnable": f"stolen by {who}: vCPU runnable, not running ({where})",
            "offline": f"stolen by {who}: vCPU offline ({where})", "source": detail}


STOLEN_CAUSES = stolen_causes("xen-runstate")


def stolen_spans(t_ns: np.ndarray, latency_ns: np.ndarray, runnable_ns: np.ndarray, offline_ns: np.ndarray,
                 irq_ns: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Where each sample's stolen time lies (begin, resumed: ns on the sample clock, equal when none): as the
    guest placed it, ending where the vCPU resumed, which is the timer interrupt's entry (``irq_ns``: Xen injects
    the pending interrupt as it resumes the vCPU) or, for the gap probe, the gap's end (the spin resumes at once);
    within the window."""
    start = t_ns.astype(np.int64)
    end = start + latency_ns.astype(np.int64)
    resumed = end if irq_ns is None else np.where(irq_ns > 0, np.minimum(start + irq_ns.astype(np.int64), end), end)
    begin = np.maximum(start, resumed - runnable_ns.astype(np.int64) - offline_ns.astype(np.int64))
    return begin, np.maximum(resumed, begin)


def stolen_occupancies(windows: np.ndarray, t_ns: np.ndarray, latency_ns: np.ndarray, runnable_ns: np.ndarray,
                       offline_ns: np.ndarray, irq_ns: np.ndarray | None, cpus: np.ndarray,
                       causes: dict[str, str] = STOLEN_CAUSES) -> list[Occupancy]:
    """The time the hypervisor stole inside each outlier window, as the guest read it (Xen's runstate area, KVM's
    steal time; per sample, aligned with ``t_ns``, on ``cpus``), where the guest placed it (``stolen_spans``):
    offline time first, then runnable (the vCPU is runnable last, until it runs); what does not fit before the
    resumption runs on to the window's end."""
    begins, _ = stolen_spans(t_ns, latency_ns, runnable_ns, offline_ns, irq_ns)
    found = []
    for index, start, end, cpu in _window_samples(windows, t_ns, cpus):
        runnable, offline = int(runnable_ns[index]), int(offline_ns[index])
        if runnable + offline <= 0:
            continue
        begin = int(begins[index])
        detail: dict[str, str | int] = {"sample_t_ns": int(start), "runnable_ns": runnable, "offline_ns": offline,
                                        "source": causes["source"]}
        for state, amount in (("offline", offline), ("runnable", runnable)):
            stop = min(begin + amount, end)
            if stop > begin:
                found.append(Occupancy("guest", begin, stop, causes[state], "stolen", int(cpu),
                                       {**detail, "runstate": state}))
            begin = stop
    return found


def _stolen_note(stolen: list[Occupancy], windows: int, source: str) -> str:
    outliers = len({o.detail["sample_t_ns"] for o in stolen})
    runnable = sum(o.duration_ns for o in stolen if o.detail["runstate"] == "runnable")
    offline = sum(o.duration_ns for o in stolen if o.detail["runstate"] == "offline")
    who, _, where, _ = _stolen_by(source)
    return (f"stolen time read by the guest from {where}: {outliers} of {windows} outliers lost time to "
            f"{who}, runnable {runnable / 1e3:.0f} us, offline {offline / 1e3:.0f} us in their windows")


def _split_note(first: str, split: list[Occupancy]) -> str:
    irq = sum(o.duration_ns for o in split if o.kind == "guest-irq")
    total = sum(o.duration_ns for o in split) or 1
    outliers = len({o.detail["sample_t_ns"] for o in split})
    return (f"split over {outliers} outliers: expiry to {first} {100 * irq / total:.0f} %, "
            f"{first} to the thread {100 - 100 * irq / total:.0f} % of their latency")


def guest_layer(guest: str, config: Any, workdir: Path, memory_mb: int, vcpus: int,
                samples: Callable[[], Path | None],
                received: Callable[[], None] | None = None) -> tuple[list[Any], dict[str, bytes] | None]:
    """The guest layer of a VM environment's run (qemu, libvirt, xen): its sources, and the files that make a
    Linux guest trace itself (for the run's job archive; None: no guest trace, so no ``rtvirt.trace`` port).
    ``config``: the run's ExplainConfig; the measuring vCPU is vCPU 0 (where the workload runs);
    ``received``: see GuestTraceSource."""
    if "guest" not in config.layers:
        return [], None
    if guest == "baremetal":
        return [BaremetalGuestSource(samples)], None
    files = guest_trace_files((0,), guest_buffer_kb(config.buffer_mb, memory_mb, vcpus), config.flight_recorder)
    return [GuestTraceSource(workdir / GUEST_TRACE_FILE, samples, received, keep=keep_rule(config),
                             keep_kb=config.buffer_mb * 1024)], files
