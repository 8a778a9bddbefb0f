"""The Xen layer: ``xentrace`` in dom0 beside a run, read back into who held the measuring vCPU's pCPU.

xentrace (Debian's xen-utils) runs in dom0 through the xen environment's dom0 transport (a lab's dom0 over SSH
or this machine's), with the scheduler trace class only and a bounded circular memory buffer (``-M``, dumped
when it is stopped) and a time limit of its own (``-T``), so a tracer whose rtvirt died still ends and switches
Xen's tracing off. Its binary records are read by ``explain.xentrace``. For each outlier window the measuring
vCPU's runstate says whether Xen kept it from running: blocked (not yet woken), runnable while another
domain's vCPU ran on its pCPU ("runnable: domU X ran"), an RTDS budget exhausted until its replenishment,
an ARINC 653 window closed. Running time is not Xen's: other layers (or "unexplained") account for it.

Clocks: Xen stamps trace records with the pCPU's TSC; the samples are on the domU's CLOCK_MONOTONIC (Xen
system time plus an offset fixed at the domU's boot). The mapping is found from the run itself: the end of
each outlier window (the measuring thread runs again) is the moment Xen resumed the vCPU, so the windows'
ends and lengths are matched with the vCPU's resumptions and the delays before them; a straight line fitted
through the matched pairs is the mapping, and its largest residual is the stated uncertainty.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import CollectContext, Layer, LayerTrace, Occupancy

if TYPE_CHECKING:
    from ..remote.transport import HostTransport
from .recorder import KeepRule, listed, run_start_ns, window_label
from .xenalign import EDGE_NS, Alignment, align
from .xensegments import SEGMENT_S, SegmentRecorder
from .xentrace import IDLE_DOMAIN, TRC_SCHED, Trace, TraceError, read_trace

__all__ = ["TRACE_DIR", "XenDom0", "XenDomains", "XenTraceSource", "reclaim_xentrace"]

XENTRACE = "xentrace"
TRACE_DIR = "/run/rtvirt"
TRACE_PREFIX = "xentrace-"
XEN_BUFFER_PAGES = 256  # Xen's own per-pCPU buffer (set once per boot: xentrace -S); xentrace empties it
POLL_MS = 20
STOP_WAIT_S = 60.0
MIN_WAIT_NS = 100_000  # shorter waits do not take part in the alignment
STOLEN_SPANS = "stolen spans the guest read from its runstate area"  # sample_windows' basis when the guest read them
CONTRADICTED_SHARE = 0.1  # sample ends placed where the vCPU did not run that make an alignment wrong
CONTEXT_NS = 5_000_000  # occupancies kept this far around a window (the report's timelines)
MAX_OCCUPANCIES = 20_000
LIMIT_S = 7200.0  # xentrace ends by itself after this (-T), should nothing stop it
# `echo $$` then exec: the pid file names the xentrace process itself, for stop() and a later reclaim
PIDFILE_SCRIPT = 'echo $$ > "$1"; shift; exec "$@"'
# what the outer-hypervisor note reads of the machine Xen runs on (explain.outer.inside_vm)
SYSTEM_FILES = ("/sys/hypervisor/type", "/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name",
                "/proc/cpuinfo")
# xentrace to standard output: it insists on an output file, which it opens (a dom0 from an initramfs has no
# /dev/stdout, so that path became a file), hence a FIFO whose reader, cat, is this command's output; the pid
# file names xentrace (what SIGINT stops), and the FIFO goes once both ended. $1: the stem; then xentrace's argv.
STREAM_SCRIPT = r"""stem=$1; shift
mkfifo "$stem.fifo" || exit 1
cat "$stem.fifo" &
reader=$!
"$@" "$stem.fifo" &
echo $! > "$stem.pid"
wait $!
status=$?
wait $reader
rm -f "$stem.fifo"
exit $status
"""


@dataclass(frozen=True)
class XenDom0:
    """The dom0 to trace in: its transport (run/spawn/get argument vectors), Xen's TSC rate, the pCPUs traced."""

    transport: HostTransport
    cpu_khz: int | None
    pcpus: int


@dataclass(frozen=True)
class XenDomains:
    """What the environment knows of the traced run: the measuring domU, the names of the others, its pool."""

    measuring: int | None  # domid of the measuring domU (None: it was never created)
    names: dict[int, str] = field(default_factory=dict)  # domid -> name, as rtvirt created them
    scheduler: str = "unknown"  # of the measuring domU's cpupool
    rtds: dict[str, int] = field(default_factory=dict)  # period_ns, budget_ns as applied
    stream: Path | None = None  # the run's stream file (its samples align the clocks)


def _label(domid: int, domains: XenDomains) -> str:
    if domid == IDLE_DOMAIN:
        return "pCPU idle"
    if domid == 0:
        return "dom0"
    name = domains.names.get(domid)
    return f"domU {name}" if name else f"domain {domid}"


class XenTraceSource:
    """xentrace beside one run in one dom0 (``transport``: run/spawn/get as the xen environment's Dom0 has).

    With ``keep`` (the flight recorder) and the run's sample file (``follow``), xentrace runs in segments and
    the ones holding the largest samples are kept (explain.xensegments); else one xentrace whose circular
    memory buffer keeps the run's end."""

    layer: Layer = "xen"

    def __init__(self, open_dom0: Callable[[], XenDom0], domains: Callable[[], XenDomains], workdir: Path,
                 buffer_mb: int = 64, limit_s: float = LIMIT_S, keep: KeepRule | None = None) -> None:
        self.open_dom0 = open_dom0
        self.domains = domains
        self.workdir = workdir
        self.buffer_mb = max(1, buffer_mb)
        self.limit_s = limit_s
        self.keep = keep
        self.segment_s = SEGMENT_S  # the flight recorder's segment length
        self.bound_kb: int | None = None  # the flight recorder's bound if not buffer_mb per pCPU (tests: smaller)
        self.samples: Path | None = None
        self.transport: Any = None
        self.cpu_khz: int | None = None
        self.memory_bytes = self.buffer_mb << 20
        self.remote_stem = f"{TRACE_DIR}/{TRACE_PREFIX}{os.getpid()}-{time.monotonic_ns()}"
        self.local_trace = workdir / "xentrace.bin"
        self.recorder: SegmentRecorder | None = None
        self._process: Any = None
        self._streams = 0  # the recorder's xentrace streams started
        self._failure: str | None = None
        self._stopped = False
        self._system: dict[str, str] = {}

    def _read_dom0(self, paths: Sequence[str]) -> dict[str, str]:
        """Files dom0 can read, as it reads them (a file it cannot read is left out)."""
        found = {}
        for path in paths:
            done = self.transport.run(["cat", "--", path])
            if done.returncode == 0:
                found[path] = str(done.stdout)
        return found

    def read_system(self, path: str) -> str:
        """A system file of the machine Xen runs on as dom0 read it at the start (``SYSTEM_FILES``): whether Xen
        itself runs in a VM is the firmware's to say (dom0's CPU flags show Xen, the traced hypervisor)."""
        if path not in self._system:
            raise OSError(f"{path} was not read in dom0")
        return self._system[path]

    def follow(self, samples: Path) -> None:
        """The run's sample file, written while it goes: the flight recorder scores its segments by it."""
        self.samples = samples

    def argv(self, stem: str, limit_s: float, memory_bytes: int | None, to_file: bool = True) -> list[str]:
        """xentrace writing ``stem.bin`` (``to_file``; else to its standard output, through a FIFO: STREAM_SCRIPT),
        its pid in ``stem.pid``; ``memory_bytes``: through a circular buffer of that size, written out when it ends
        (else as it goes)."""
        memory = ["-M", str(memory_bytes)] if memory_bytes is not None else []
        xentrace = [XENTRACE, "-D", "-e", f"{TRC_SCHED:#010x}", "-S", str(XEN_BUFFER_PAGES), "-s", str(POLL_MS),
                    *memory, "-T", str(int(limit_s))]
        if to_file:
            return ["sh", "-c", PIDFILE_SCRIPT, "rtvirt-xentrace", f"{stem}.pid", *xentrace, f"{stem}.bin"]
        return ["sh", "-c", STREAM_SCRIPT, "rtvirt-xentrace", stem, *xentrace]

    def _start_tracer(self, stem: str, limit_s: float, memory_bytes: int | None,
                      stream_to: Path | None = None) -> Any:
        """Start one xentrace (its output into the local ``stream_to``, else its file in dom0) and wait until its
        pid file names it (what stops it)."""
        process = self.transport.spawn(self.argv(stem, limit_s, memory_bytes, to_file=stream_to is None),
                                       stream_to=stream_to)
        deadline = time.monotonic() + 30
        while self.transport.run(["test", "-s", f"{stem}.pid"]).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                process.stop(grace=2.0)
                raise RuntimeError(f"xentrace did not start in dom0 (status {process.poll()})")
            time.sleep(0.2)
        return process

    def _start_stream(self, local: Path) -> Any:
        """The flight recorder's xentrace: the whole run (up to ``limit_s``), its records coming into ``local``."""
        self._streams += 1
        return self._start_tracer(f"{self.remote_stem}.{self._streams}", self.limit_s, None, stream_to=local)

    def _end_stream(self, process: Any) -> None:
        """End the recorder's xentrace and wait until all it wrote is here (its channel closed)."""
        self._end_tracer(f"{self.remote_stem}.{self._streams}", process)
        deadline = time.monotonic() + STOP_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)

    def _end_tracer(self, stem: str, process: Any) -> None:
        """SIGINT: xentrace writes out what it holds and switches Xen's tracing off; killed if it does not end."""
        self.transport.run(["sh", "-c", 'kill -INT "$(cat "$1")"', "rtvirt-xentrace-stop", f"{stem}.pid"])
        deadline = time.monotonic() + STOP_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None:
            process.stop(grace=2.0)

    def _fetch(self, stem: str, local: Path) -> None:
        try:
            self.transport.get(f"{stem}.bin", local)
        finally:
            self.transport.run(["rm", "-f", f"{stem}.bin", f"{stem}.pid"])

    def start(self) -> None:
        try:
            dom0 = self.open_dom0()
            self.transport, self.cpu_khz = dom0.transport, dom0.cpu_khz
            self.memory_bytes = (self.buffer_mb << 20) * max(1, dom0.pcpus)
            self.transport.run(["mkdir", "-p", TRACE_DIR]).check("xen trace: dom0 mkdir")
            self._system = self._read_dom0(SYSTEM_FILES)
            if self.keep is not None and self.samples is not None:
                self.recorder = SegmentRecorder(
                    self._start_stream, self._end_stream, self.workdir / "segments",
                    self.bound_kb << 10 if self.bound_kb is not None else self.memory_bytes, self.samples, self.keep,
                    self.segment_s, 1e6 / self.cpu_khz if self.cpu_khz else None)
                self.recorder.start()
            else:
                self._process = self._start_tracer(self.remote_stem, self.limit_s, self.memory_bytes)
        except Exception as exc:  # the measurement runs unchanged; the explanation says why
            self._failure = f"xentrace could not run in dom0: {str(exc)[:300]}"
            self.stop()

    def stop(self) -> None:
        """End the tracing (the recorder's last segment, or the one xentrace), fetch its output and remove
        everything from dom0. Idempotent; never raises (a dead lab has nothing left to stop)."""
        if self._stopped:
            return
        self._stopped = True
        if self.transport is None:
            return
        try:
            if self.recorder is not None:
                self.recorder.stop()
            elif self._process is not None:
                self._end_tracer(self.remote_stem, self._process)
                if self._failure is None:
                    self.workdir.mkdir(parents=True, exist_ok=True)
                    self._fetch(self.remote_stem, self.local_trace)
        except Exception as exc:
            self._failure = self._failure or f"xentrace's output could not be read back from dom0: {str(exc)[:300]}"
        finally:
            try:  # whatever a failure left (the stem's files, any segment's)
                self.transport.run(["sh", "-c", 'rm -f -- "$1".pid "$1".bin "$1".*.pid "$1".*.bin "$1".*.fifo',
                                    "rtvirt-xentrace-rm", self.remote_stem])
            except Exception as exc:
                self._failure = self._failure or f"dom0 did not answer after the run: {str(exc)[:300]}"

    def collect(self, context: CollectContext) -> LayerTrace:
        self.stop()
        if self._failure is not None:
            return LayerTrace("xen", seen=False, why_not=self._failure)
        domains = self.domains()
        if domains.measuring is None:
            return LayerTrace("xen", seen=False, why_not="the measuring domU was never created: nothing to trace")
        try:
            blobs = self.recorder.traces() if self.recorder is not None else [self.local_trace.read_bytes()]
            traces = [read_trace(blob) for blob in blobs]
        except (OSError, TraceError) as exc:
            return LayerTrace("xen", seen=False, why_not=f"xentrace's output is unreadable: {str(exc)[:300]}")
        if not traces:
            problems = "; ".join(self.recorder.problems) if self.recorder is not None else ""
            return LayerTrace("xen", seen=False, why_not=f"the flight recorder kept no xentrace segment {problems}"
                              .strip())
        layer = explain_trace(traces, domains, context.windows, self.cpu_khz,
                              wrapped=self.recorder is None and self.local_trace.stat().st_size >= self.memory_bytes
                              - 4096, samples=sample_windows(domains.stream),
                              run_start=run_start_ns(context.header))
        if self.recorder is not None:
            layer.notes += [*self.recorder.problems,
                            _segments_note(self.recorder, self.segment_s, self.recorder.bound_bytes)]
            layer.dropped_events += sum(records for _, records in self.recorder.dropped)
        return layer


def _segments_note(recorder: SegmentRecorder, segment_s: float, bound_bytes: int) -> str:
    kept = recorder.kept
    note = (f"the flight recorder kept {len(kept)} xentrace segments of {segment_s:g} s "
            f"({sum(segment.size for segment in kept) / 2**10:.0f} KiB, bound {bound_bytes / 2**10:.0f} KiB)")
    if recorder.dropped:
        dropped = [str(index) for index in sorted(segment.index for segment, _ in recorder.dropped)]
        note += (f"; it dropped {len(dropped)} that held smaller samples (segments {listed(dropped)}, "
                 f"{sum(records for _, records in recorder.dropped)} records)")
    return note


@dataclass(frozen=True)
class SampleWindows:
    """What Xen's clock is aligned with, from the run's stream: every sample's window of at least MIN_WAIT_NS (the
    outliers alone may be too few), or, where the guest read its stolen time from its runstate area (the
    bare-metal guest), each sample's stolen span (explain.guest's stolen_spans: the very waits xentrace records,
    on the guest's clock), which a wait then matches at both edges."""

    windows: np.ndarray
    stolen: bool

    @property
    def basis(self) -> str:
        """What the windows are, as the notes say."""
        return STOLEN_SPANS if self.stolen else "sample windows"


def sample_windows(path: Path | None) -> SampleWindows | None:
    """The run's SampleWindows, read from its stream file; None when there is none or it cannot be read."""
    from ..stream import read_stream

    if path is None:
        return None
    try:
        stream = read_stream(path)
    except Exception:  # noqa: BLE001 - a damaged stream leaves the outlier windows to align with
        return None
    records = stream.records
    starts, ends = records["t_ns"].astype(np.int64), records["t_ns"].astype(np.int64) + records["value"]
    if stream.measures_stolen:
        from .guest import stolen_spans

        runnable, offline = stream.stolen_per_sample()
        irq = records["aux"].astype(np.int64) if stream.header.get("aux_field") == "irq_latency_ns" else None
        starts, ends = stolen_spans(starts, records["value"], runnable, offline, irq)
    kept = ends - starts >= MIN_WAIT_NS
    windows = np.zeros(int(kept.sum()), dtype=[("start_ns", "<i8"), ("end_ns", "<i8"), ("cpu", "<i2")])
    windows["start_ns"], windows["end_ns"], windows["cpu"] = starts[kept], ends[kept], records["cpu"][kept]
    return SampleWindows(windows, stream.measures_stolen)


@dataclass(frozen=True, slots=True)
class Stretch:
    """The measuring vCPU not running, [start, end) in TSC ticks, with its states' sub-intervals."""

    start: int
    end: int
    ready: int  # the start of the runnable time just before the resumption (woken, or preempted)
    states: tuple[tuple[int, int, str], ...]
    pcpu: int  # where it resumed


def stretches(trace: Trace, vcpu: tuple[int, int]) -> list[Stretch]:
    """The measuring vCPU's not-running stretches that ended with it running again."""
    found: list[Stretch] = []
    start: int | None = None
    states: list[tuple[int, int, str]] = []
    changes = trace.runstates.get(vcpu, [])  # none in a recorder's segment where the vCPU never stopped running
    for (tsc, state, pcpu), following in zip(changes, [*changes[1:], None][:len(changes)], strict=True):
        if state == "running":
            if start is not None and states:
                ready = states[-1][0]
                for begin, _end, name in reversed(states):
                    if name == "blocked":
                        break
                    ready = begin
                found.append(Stretch(start, tsc, ready, tuple(states), pcpu))
            start, states = None, []
            continue
        start = tsc if start is None else start
        states.append((tsc, following[0] if following is not None else tsc, state))
    return found


def explain_trace(traces: Sequence[Trace], domains: XenDomains, windows: np.ndarray, cpu_khz: int | None,
                  wrapped: bool = False, samples: SampleWindows | None = None, run_start: int = 0) -> LayerTrace:
    """Occupancies of the Xen layer around the outlier ``windows``, on the sample clock, from the read traces
    (one xentrace file, or the flight recorder's segments, oldest first: nothing is inferred across the holes
    between them); the clocks are aligned with ``samples`` when it holds any window, else with the outliers."""
    assert domains.measuring is not None
    records, lost = sum(trace.records for trace in traces), sum(trace.lost_records for trace in traces)
    notes = [f"xentrace: {records} scheduler records"]
    if wrapped:
        notes.append("xentrace's memory buffer filled: the oldest records were dropped (only the run's end is seen)")
    vcpus = sorted({key for trace in traces for key in trace.runstates if key[0] == domains.measuring})
    if not vcpus:
        return LayerTrace("xen", seen=False, why_not=f"the trace holds no runstate of the measuring domU "
                                                     f"(domain {domains.measuring})", dropped_events=lost,
                          notes=notes)
    if not cpu_khz:
        return LayerTrace("xen", seen=False, why_not="xl info gives no cpu_mhz: Xen's TSC timestamps cannot be "
                                                     "mapped to the sample clock", notes=notes)
    # (trace, vCPU) -> its stretches in that trace alone
    by_vcpu = {(at, vcpu): stretches(trace, (domains.measuring, vcpu))
               for at, trace in enumerate(traces) for _dom, vcpu in vcpus}
    every = [stretch for found in by_vcpu.values() for stretch in found]
    ns_per_tick = 1e6 / cpu_khz
    if every:
        longest = max(every, key=lambda s: s.end - s.ready)
        notes.append(f"the measuring vCPU's longest wait to run in the whole trace: "
                     f"{(longest.end - longest.ready) * ns_per_tick / 1e3:.0f} us")
    waits = [s for s in every if (s.end - s.ready) * ns_per_tick >= MIN_WAIT_NS]
    # every sample's window (or stolen span) when the stream gave them, else the outliers alone
    given = samples if samples is not None and len(samples.windows) else None
    aligned_with = given.windows if given is not None else windows
    alignment = align(np.array([s.ready for s in waits], dtype=np.int64),
                      np.array([s.end for s in waits], dtype=np.int64), aligned_with, ns_per_tick,
                      whole=given is not None and given.stolen)
    if alignment is None:
        return LayerTrace("xen", seen=False, dropped_events=lost, notes=notes,
                          why_not="Xen's clock could not be aligned with the domU's: fewer than three outlier windows "
                                  "hold a wait of the measuring vCPU that starts or ends with them (Xen did not hold "
                                  "the vCPU back in these windows, or the trace missed them)")
    if alignment.rival is not None and alignment.alike:
        distance, for_best, for_rival = alignment.rival
        notes.append(f"Xen's clock is not certain to whole periods: an offset {abs(distance) / 1e6:.1f} ms apart (a "
                     f"periodic schedule makes each wait look like the next) explains no window this one does not "
                     f"({for_best} only this one does) and puts alike waits (lengths within what the matching "
                     "tells apart) in the others: the windows are given what they would be under either, but which "
                     "period of the trace each lies in is not certain")
    elif alignment.rival is not None:
        distance, for_best, for_rival = alignment.rival
        return LayerTrace("xen", seen=False, dropped_events=lost, notes=notes,
                          why_not=f"Xen's clock could not be aligned with the domU's unambiguously: of two offsets "
                                  f"{abs(distance) / 1e6:.1f} ms apart, {for_best} windows hold a wait of the "
                                  f"measuring vCPU under one alone and {for_rival} under the other alone (a periodic "
                                  "schedule makes each wait look like the next; the windows that differ decide)")
    checked, contradicted = _contradicted(alignment, every, aligned_with)
    if contradicted > max(2, CONTRADICTED_SHARE * checked):
        return LayerTrace("xen", seen=False, dropped_events=lost, notes=notes,
                          why_not=f"Xen's clock could not be aligned with the domU's: the alignment found puts "
                                  f"{contradicted} of {checked} sample ends where the measuring vCPU was not "
                                  "running (its thread stamps each sample while it runs)")
    used = given.basis if given is not None else "outlier windows"
    notes.append(f"aligned by {alignment.matched} {used} holding a "
                 f"wait of the measuring vCPU "
                 f"(TSC at {1e6 / alignment.slope / 1e3:.3f} MHz; largest residual "
                 f"{alignment.uncertainty_ns / 1e3:.1f} us)")
    if outside := _outside(traces, windows, alignment, run_start):
        notes.append(f"{len(outside)} outlier windows lie outside the kept trace (their Xen part is not seen): "
                     f"{listed(outside)}")
    occupancies = _occupancies(traces, domains, by_vcpu, windows, alignment)
    return LayerTrace("xen", seen=True, occupancies=occupancies, alignment_ns=alignment.uncertainty_ns,
                      dropped_events=lost, notes=notes)


def _contradicted(alignment: Alignment, stretches_: Sequence[Stretch], windows: np.ndarray) -> tuple[int, int]:
    """(windows checked, windows whose end the alignment puts inside a stretch where the measuring vCPU did not
    run, by more than its uncertainty): a sample ends when its thread runs, so none should be."""
    if not stretches_ or windows.size == 0:
        return 0, 0
    margin = alignment.uncertainty_ns + EDGE_NS
    begins = np.array([alignment.to_ns(s.start) for s in stretches_], dtype=np.int64)
    finishes = np.array([alignment.to_ns(s.end) for s in stretches_], dtype=np.int64)
    order = np.argsort(begins)
    begins, finishes = begins[order], finishes[order]
    ends = windows["end_ns"].astype(np.int64)
    covered = (ends >= begins[0]) & (ends <= finishes.max())
    at = np.searchsorted(begins, ends, side="right") - 1
    inside = (at >= 0) & (ends > begins[np.clip(at, 0, None)] + margin) & \
        (ends < finishes[np.clip(at, 0, None)] - margin)
    return int(covered.sum()), int((inside & covered).sum())


def _outside(traces: Sequence[Trace], windows: np.ndarray, alignment: Alignment, run_start: int) -> list[str]:
    """The outlier windows (largest first, as ranked) that no trace covers whole, named as notes name them."""
    spans = [(alignment.to_ns(trace.first_tsc), alignment.to_ns(trace.last_tsc)) for trace in traces
             if trace.first_tsc is not None and trace.last_tsc is not None]
    return [window_label(rank, begin, cpu, latency, run_start, "vCPU")
            for rank, (begin, end, cpu, latency) in enumerate(
                windows[["start_ns", "end_ns", "cpu", "latency_ns"]].tolist(), 1)
            if not any(first <= begin and end <= last for first, last in spans)]


def _near_windows(windows: np.ndarray) -> Callable[[int, int], bool]:
    starts = np.sort(windows["start_ns"].astype(np.int64) - CONTEXT_NS)
    ends = np.sort(windows["end_ns"].astype(np.int64) + CONTEXT_NS)

    def near(start: int, end: int) -> bool:
        # some window [s, e) overlaps [start, end): a window starting before end that has not ended by start
        return int(np.searchsorted(starts, end)) > int(np.searchsorted(ends, start, side="right"))
    return near


def _occupancies(traces: Sequence[Trace], domains: XenDomains, by_vcpu: dict[tuple[int, int], list[Stretch]],
                 windows: np.ndarray, alignment: Alignment) -> list[Occupancy]:
    near = _near_windows(windows)
    found: list[Occupancy] = []
    for (at, vcpu), stretches_of_vcpu in by_vcpu.items():
        trace = traces[at]
        exhausted = _exhaustions(trace, (domains.measuring or 0, vcpu))
        for stretch in stretches_of_vcpu:
            if not near(alignment.to_ns(stretch.start), alignment.to_ns(stretch.end)):
                continue
            for begin, end, state in stretch.states:
                found += _parts(trace, domains, vcpu, stretch.pcpu, begin, end, state, exhausted, alignment)
            if len(found) > MAX_OCCUPANCIES:
                return found
    return found


def _exhaustions(trace: Trace, unit: tuple[int, int]) -> list[tuple[int, int | None, dict[str, int]]]:
    """RTDS: (TSC the budget ran out, TSC of the next replenishment or None, its deadline/budget and the ns
    charged by the slice that emptied it)."""
    replenished = trace.replenishments.get(unit, [])
    times = [tsc for tsc, _, _ in replenished]
    out: list[tuple[int, int | None, dict[str, int]]] = []
    for tsc, left, charged in trace.burns.get(unit, []):
        if left <= 0 and (not out or (out[-1][1] is not None and tsc >= out[-1][1])):
            # the slice that emptied it: longer than the whole budget means Xen ran it past its budget timer
            at = bisect.bisect_right(times, tsc)
            if at < len(replenished):
                _, deadline, budget = replenished[at]
                out.append((tsc, replenished[at][0], {"deadline_ns": deadline, "budget_ns": budget,
                                                      "charged_ns": charged}))
            else:
                out.append((tsc, None, {"charged_ns": charged}))
    return out


def _parts(trace: Trace, domains: XenDomains, vcpu: int, pcpu: int, begin: int, end: int, state: str,
           exhausted: list[tuple[int, int | None, dict[str, int]]], alignment: Alignment) -> list[Occupancy]:
    """One state of a not-running stretch as occupancies: who ran on the pCPU meanwhile, budget or window."""
    base: dict[str, str | int] = {"domain": domains.measuring or 0, "vcpu": vcpu, "pcpu": pcpu, "runstate": state}
    if state == "blocked":  # Xen did not run it, and nothing it ran instead took its place: held back
        cause = "vCPU blocked (waiting for Xen to wake it)"
        return [Occupancy("xen", alignment.to_ns(begin), alignment.to_ns(end), cause, "xen-held", vcpu, base,
                          culprit=cause)]
    if state == "offline":
        cause = "vCPU offline (paused or down)"
        return [Occupancy("xen", alignment.to_ns(begin), alignment.to_ns(end), cause, "xen-held", vcpu, base,
                          culprit=cause)]
    cuts = sorted({begin, end, *(t for ex in exhausted for t in (ex[0], ex[1] or end) if begin < t < end),
                   *(tsc for tsc, _, _ in _runs_on(trace, pcpu, begin, end))})
    out: list[Occupancy] = []
    for left, right in zip(cuts, cuts[1:], strict=False):
        ran = _occupant(trace, pcpu, left, (domains.measuring or 0, vcpu))
        detail = {**base, "ran": _label(ran, domains), "ran_domid": ran}
        budget = next((ex for ex in exhausted if ex[0] <= left and (ex[1] is None or left < ex[1])), None)
        if budget is not None:
            replenished = alignment.to_ns(budget[1]) if budget[1] is not None else None
            detail.update(domains.rtds, exhausted_ns=alignment.to_ns(budget[0]), **budget[2])
            if replenished is not None:
                detail["replenished_ns"] = replenished
            cause, kind = "RTDS budget exhausted (until its replenishment)", "budget"
            culprit, variant = cause, ""
        elif domains.scheduler == "arinc653":
            cause, kind = "ARINC 653 window closed" + (f": {_label(ran, domains)} ran" if ran != IDLE_DOMAIN else ""), \
                "window"
            culprit, variant = "ARINC 653 window closed", _label(ran, domains) if ran != IDLE_DOMAIN else ""
        elif ran == IDLE_DOMAIN:
            cause, kind = "runnable: its pCPU idled (Xen had not scheduled it yet)", "xen-held"
            culprit, variant = cause, ""
        else:
            cause, kind = f"runnable: {_label(ran, domains)} ran", "runstate"
            culprit, variant = _label(ran, domains), "the measuring vCPU runnable"
        out.append(Occupancy("xen", alignment.to_ns(left), alignment.to_ns(right), cause, kind, vcpu, detail,
                             culprit=culprit, variant=variant))
    return _merged(out)


def _runs_on(trace: Trace, pcpu: int, begin: int, end: int) -> list[tuple[int, int, int]]:
    runs = trace.running.get(pcpu, [])
    return runs[bisect.bisect_right(runs, (begin, 1 << 30, 0)):bisect.bisect_left(runs, (end, -1, -1))]


def _occupant(trace: Trace, pcpu: int, tsc: int, waiting: tuple[int, int]) -> int:
    """The domain whose vCPU ran on ``pcpu`` at ``tsc`` (the idle domain when nothing did or nothing is known).
    At a switch Xen may trace the waiting vCPU's change before its successor's: that successor ran."""
    runs = trace.running.get(pcpu, [])
    at = bisect.bisect_right(runs, (tsc, 1 << 30, 1 << 30)) - 1
    if at >= 0 and runs[at][1:] == waiting:
        at += 1
    return runs[at][1] if 0 <= at < len(runs) else IDLE_DOMAIN


def _merged(parts: list[Occupancy]) -> list[Occupancy]:
    """Adjacent parts with the same cause (and the same budget exhaustion) as one."""
    out: list[Occupancy] = []
    for part in parts:
        if out and out[-1].cause == part.cause and out[-1].end_ns == part.start_ns and \
                out[-1].detail.get("exhausted_ns") == part.detail.get("exhausted_ns"):
            previous = out[-1]
            out[-1] = dataclasses.replace(previous, end_ns=part.end_ns)
        elif part.end_ns > part.start_ns:
            out.append(part)
    return out


def reclaim_xentrace(transport: HostTransport) -> list[str]:
    """After a killed campaign: stop the xentrace processes rtvirt's pid files name in dom0 (a tracer stopped by
    SIGINT switches Xen's tracing off) and remove their files."""
    listed = transport.run(["sh", "-c", 'for f in "$1"/' + TRACE_PREFIX + '*.pid; do [ -e "$f" ] && echo "$f"; '
                            'done; exit 0', "rtvirt-reclaim", TRACE_DIR])
    removed = []
    for pidfile in listed.stdout.split():
        pid = transport.run(["cat", pidfile]).stdout.strip()
        if pid.isdigit():
            command = transport.run(["cat", f"/proc/{pid}/cmdline"]).stdout
            if XENTRACE in command and pidfile.removesuffix(".pid") in command:
                transport.run(["kill", "-INT", pid])
                deadline = time.monotonic() + STOP_WAIT_S
                while transport.run(["test", "-e", f"/proc/{pid}"]).returncode == 0 and time.monotonic() < deadline:
                    time.sleep(0.5)
                removed.append(f"xentrace in dom0 (pid {pid})")
        stem = pidfile.removesuffix(".pid")
        transport.run(["rm", "-f", pidfile, f"{stem}.bin", f"{stem}.fifo"])
    return removed

