"""What tracing cost a run: the events and bytes recorded, and what one event costs the traced CPU.

Every traced event runs the kernel's tracepoint on the CPU it describes: on the wake-up path of the thread being
measured, that time adds to the latency it measures (benchmarks/bench_explain_cost.py measures how much, with
tracing off and on in alternating runs). A run states its own share: how many events it recorded per second, and,
measured on this machine as the host layer starts (before the agent), what one event costs the traced CPU: a
thread on that CPU times a system call with ``raw_syscalls:sys_enter`` traced by an instance of its own and
without (the quickest of several batches each way: interrupts only lengthen a batch). That is a warm loop's
cost, a lower bound: on a wake-up's path, out of idle, the same events cost several times as much (the
benchmark measures it). On a timer wake-up's path the default events record a known number of events
(``WAKE_UP_PATH``), which gives the lower bound per wake-up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection

from .tracefs import TracefsInstance, TracingUnavailable

__all__ = ["measure_event_cost", "wake_up_path", "cost_note", "WAKE_UP_PATH"]

CALIBRATION_EVENT = "raw_syscalls:sys_enter"
BATCHES = 12  # per state (traced, not traced), alternating
CALLS = 2000  # system calls per batch
# the events a timer wake-up records between the timer's expiry and the thread's switch-in (when traced)
WAKE_UP_PATH = ("irq_vectors:local_timer_entry", "timer:hrtimer_expire_entry", "sched:sched_wakeup",
                "timer:hrtimer_expire_exit", "irq_vectors:local_timer_exit", "sched:sched_switch")


def _batch() -> int:
    getppid = os.getppid
    begin = time.perf_counter_ns()
    for _ in range(CALLS):
        getppid()
    return time.perf_counter_ns() - begin


def _calibrate(cpu: int, found: list[int]) -> None:
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only
    except OSError:
        return
    instance = TracefsInstance([cpu], [CALIBRATION_EVENT], buffer_kb=1024, overwrite=True)
    quiet, traced = [], []
    try:
        for _ in range(BATCHES):
            quiet.append(_batch())
            instance.start()
            try:
                traced.append(_batch())
            finally:
                instance.stop()
    except (TracingUnavailable, OSError):
        return
    found.append(max(0, (min(traced) - min(quiet)) // CALLS))


def measure_event_cost(cpu: int) -> int | None:
    """What recording one event costs ``cpu`` (ns), measured now by a short-lived thread of its own there (about
    30 ms; before a run's agent starts); None when it cannot be measured (no tracefs, the CPU not usable)."""
    found: list[int] = []
    thread = threading.Thread(target=_calibrate, args=(cpu, found), name="rtvirt-event-cost", daemon=True)
    thread.start()
    thread.join(timeout=30)
    return found[0] if found else None


def wake_up_path(events: Collection[str]) -> list[str]:
    """The events of ``events`` a timer wake-up records on its way to the thread (expiry to switch-in)."""
    return [event.partition(":")[2] for event in WAKE_UP_PATH if event in events]


def cost_note(events: int, seconds: float, text_bytes: int, cpus: int, event_ns: int | None,
              on_path: list[str], timer_probe: bool) -> tuple[str, dict[str, float]]:
    """The layer's note on what tracing cost the run, and the same as numbers (the layer's ``cost``)."""
    rate = events / seconds / max(cpus, 1) if seconds > 0 else 0.0
    numbers: dict[str, float] = {"events": events, "seconds": round(seconds, 3), "events_per_s_per_cpu": round(rate),
                                 "text_bytes": text_bytes}
    note = (f"tracing cost: {events:,} events in {seconds:.1f} s ({rate:,.0f}/s per traced CPU, "
            f"{text_bytes / 1e6:.1f} MB of trace text)")
    if event_ns is not None:
        numbers["event_ns"] = event_ns
        note += (f"; one event costs the traced CPU at least {event_ns} ns here (measured before the run, in a "
                 "warm loop: on a wake-up's path, its caches cold, more)")
        if timer_probe and on_path:
            numbers.update(wake_up_events=len(on_path), wake_up_ns=len(on_path) * event_ns)
            note += (f"; a timer wake-up's path records {len(on_path)} ({', '.join(on_path)}): at least "
                     f"{len(on_path) * event_ns / 1e3:.1f} us added to each wake-up")
    else:
        note += "; the cost of one event was not measured (a target's, or tracefs refused the measurement)"
    return note, numbers
