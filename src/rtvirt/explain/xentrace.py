"""Our reader of ``xentrace``'s binary output: Xen's trace records, the scheduler's events among them, and the
timelines they make (each vCPU's runstate, who ran on each pCPU, RTDS budgets).

Facts from Xen's public ``trace.h`` and from the records xentrace 4.17 writes (no code of xenalyze or
xentrace_format): a record is a 32-bit header (event in bits 0-27, the number of 32-bit data words in bits
28-30, bit 31 set when a 64-bit TSC follows), the TSC as two 32-bit words, then the data words. xentrace
writes a record of its own, ``TRC_TRACE_CPU_CHANGE``, before the records of each pCPU's buffer; its first data
word is that pCPU. Timestamps are the pCPU's TSC (Xen's tracing calls get_cycles()), not Xen system time.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["IDLE_DOMAIN", "RUNSTATES", "Record", "Trace", "TraceError", "parse_records", "read_trace"]

TRC_LOST_RECORDS = 0x0001F001
TRC_TRACE_WRAP_BUFFER = 0x0001F002
TRC_TRACE_CPU_CHANGE = 0x0001F003
TRC_SCHED_RUNSTATE_CHANGE = 0x00021001  # | old state << 8 | new state << 4
TRC_SCHED_CLASS = 0x00022000
TRC_SCHED_ID_SHIFT = 9
TRC_SCHED_RTDS = 4
TRC_RTDS_BUDGET_BURN = TRC_SCHED_CLASS | (TRC_SCHED_RTDS << TRC_SCHED_ID_SHIFT) | 3
TRC_RTDS_BUDGET_REPLENISH = TRC_SCHED_CLASS | (TRC_SCHED_RTDS << TRC_SCHED_ID_SHIFT) | 4
TRC_SCHED = 0x0002F000  # the scheduler trace class: the event mask xentrace is given

# RUNSTATE_running, _runnable, _blocked, _offline in Xen's public vcpu.h
RUNSTATES = ("running", "runnable", "blocked", "offline")
IDLE_DOMAIN = 0x7FFF  # DOMID_IDLE: the pCPU had nothing to run
MAX_RECORDS = 20_000_000  # a -M buffer of 64 MB per pCPU holds fewer; a longer file is not xentrace's


class TraceError(ValueError):
    """The file is not a trace xentrace wrote (or it is cut where a record should be)."""


@dataclass(frozen=True, slots=True)
class Record:
    cpu: int
    tsc: int
    event: int
    data: tuple[int, ...]


def parse_records(blob: bytes) -> Iterator[Record]:
    """Every record of a xentrace file, in file order, on the pCPU the preceding CPU_CHANGE named; records
    without a TSC carry their pCPU's last one. A trailing partial record (xentrace killed mid-write) ends the
    iteration; anything else that does not parse is a :class:`TraceError`."""
    view = memoryview(blob)
    offset, cpu, count = 0, -1, 0
    last_tsc: dict[int, int] = {}
    while offset + 4 <= len(view):
        (header,) = struct.unpack_from("<I", view, offset)
        event, words, has_tsc = header & 0x0FFFFFFF, (header >> 28) & 7, header >> 31
        size = 4 + 8 * has_tsc + 4 * words
        if offset + size > len(view):
            return
        tsc = last_tsc.get(cpu, 0)
        if has_tsc:
            low, high = struct.unpack_from("<II", view, offset + 4)
            tsc = high << 32 | low
        data = struct.unpack_from(f"<{words}I", view, offset + 4 + 8 * has_tsc)
        offset += size
        count += 1
        if count > MAX_RECORDS:
            raise TraceError(f"more than {MAX_RECORDS} records")
        if event == TRC_TRACE_CPU_CHANGE:
            if not data or data[0] > 4095:
                raise TraceError(f"a CPU change record at byte {offset - size} names no pCPU")
            cpu = data[0]
            continue
        if cpu < 0:
            raise TraceError("records before any CPU change record: not a xentrace file")
        if has_tsc:
            last_tsc[cpu] = tsc
        yield Record(cpu, tsc, event, data)


@dataclass(slots=True)
class Trace:
    """What the scheduler trace says, by (domain, vCPU) and by pCPU; times are TSC ticks."""

    # (dom, vcpu) -> [(tsc, new state, pCPU the change was traced on)]
    runstates: dict[tuple[int, int], list[tuple[int, str, int]]] = field(default_factory=dict)
    # pCPU -> [(tsc, dom, vcpu)]: from then on that vCPU ran on it (the idle domain: nothing did)
    running: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    # (dom, vcpu) -> [(tsc, budget left ns, ns charged)] of RTDS budget burns, and [(tsc, deadline ns, budget ns)]
    # replenishments
    burns: dict[tuple[int, int], list[tuple[int, int, int]]] = field(default_factory=dict)
    replenishments: dict[tuple[int, int], list[tuple[int, int, int]]] = field(default_factory=dict)
    lost_records: int = 0
    records: int = 0
    first_tsc: int | None = None
    last_tsc: int | None = None


def _unit(word: int) -> tuple[int, int]:
    """A packed ``unit:16, dom:16`` (RTDS) word as (dom, vcpu)."""
    return word >> 16, word & 0xFFFF


def read_trace(blob: bytes) -> Trace:
    """The scheduler's story from a xentrace file."""
    trace = Trace()
    for record in parse_records(blob):
        trace.records += 1
        if record.tsc:
            trace.first_tsc = record.tsc if trace.first_tsc is None else min(trace.first_tsc, record.tsc)
            trace.last_tsc = record.tsc if trace.last_tsc is None else max(trace.last_tsc, record.tsc)
        event = record.event
        if event == TRC_LOST_RECORDS:
            trace.lost_records += record.data[0] if record.data else 1
        elif event & ~0x330 == TRC_SCHED_RUNSTATE_CHANGE and record.data:
            new = RUNSTATES[(event >> 4) & 3]
            vcpu = (record.data[0] >> 16, record.data[0] & 0xFFFF)
            trace.runstates.setdefault(vcpu, []).append((record.tsc, new, record.cpu))
            if new == "running":
                trace.running.setdefault(record.cpu, []).append((record.tsc, *vcpu))
        elif event == TRC_RTDS_BUDGET_BURN and len(record.data) >= 4:
            budget = struct.unpack("<q", struct.pack("<II", record.data[1], record.data[2]))[0]
            charged = struct.unpack("<i", struct.pack("<I", record.data[3]))[0]
            trace.burns.setdefault(_unit(record.data[0]), []).append((record.tsc, budget, charged))
        elif event == TRC_RTDS_BUDGET_REPLENISH and len(record.data) >= 6:
            deadline = record.data[3] << 32 | record.data[2]
            budget = record.data[5] << 32 | record.data[4]
            trace.replenishments.setdefault(_unit(record.data[0]), []).append((record.tsc, deadline, budget))
    for changes in trace.runstates.values():
        changes.sort()
    for runs in trace.running.values():
        runs.sort()
    return trace
