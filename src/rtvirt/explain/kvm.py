"""The KVM layer: what KVM did on the measuring VM's vCPU threads, from the KVM host's own tracepoints.

Beside the VM layer (explain.vm: was the vCPU thread on its pCPU, and if not, who ran), this source traces
``kvm:kvm_exit`` (with its reason), ``kvm_entry``, interrupt injection (``kvm_inj_virq``, ``kvm_apic_accept_irq``),
the LAPIC timer (``kvm_wait_lapic_expire``, ``kvm_hv_timer_state``, and the host hrtimer ``apic_timer_fn`` that
is a guest's LAPIC timer where there is no VMX preemption timer, as on AMD's SVM), ``kvm_vcpu_wakeup`` and
``sched_switch`` on the vCPUs' pCPUs, in a tracefs instance of its own on the KVM host (this machine's, or one's
over SSH: explain.remote). Each VM exit becomes an occupancy of layer ``kvm`` from ``kvm_exit`` to the vCPU's next
``kvm_entry``: "vCPU exited for EXTERNAL_INTERRUPT (intr)"; a halt is cut where its LAPIC timer fired: "vCPU
halted (hlt): its timer had not fired" until then, "vCPU halted (hlt): back in the guest after its timer
fired" from then to the entry. The layer ranks inside the VM layer (model.LAYERS): while the vCPU's thread was
off its pCPU, the VM layer's "vCPU not running: <task> ran" is the cause, and the exit around it the rest.

Exit reasons are printed by the kernel as VMX names on Intel (``EXTERNAL_INTERRUPT``) and SVM names on AMD
(``intr``, lowercase); :data:`EXIT_REASONS` maps both onto one name and what it means, for every layer that
names exits (explain.vm too). Per run, ``perf kvm stat``-style statistics (count and time per reason) go into
the layer's ``tables["kvm_exits"]``: counts from the kernel's own histogram of every exit where the KVM host
has hist triggers, times from the exits the kept trace holds whole.

The trace is on the KVM host's CLOCK_MONOTONIC (``mono``); the guest's samples reach it through the clock
exchange (explain.clocksync), as the VM layer's do. Where the layer cannot be seen (TCG, no tracefs on the KVM
host, a guest without a clock exchange, a KVM that emits no exits) the explanation says why.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .clocksync import ClockMap
from .model import CollectContext, Layer, LayerTrace, Occupancy
from .recorder import RING_KB, FlightRecorder, KeepRule, bound_notes
from .tracefs import TEXT_RESOLUTION_NS, TraceEvent, TracefsAccess, TracefsInstance, TracingUnavailable, body_fields
from .vm import _near_windows, drift_allowance, exit_reason, start_guest_tracing

__all__ = ["EXIT_REASONS", "KVM_EVENTS", "KvmSource", "KvmTrace", "exit_name", "exit_statistics",
           "kvm_occupancies", "read_kvm_events"]

KVM_EVENTS = ("kvm:kvm_exit", "kvm:kvm_entry", "kvm:kvm_inj_virq", "kvm:kvm_apic_accept_irq",
              "kvm:kvm_wait_lapic_expire", "kvm:kvm_hv_timer_state", "kvm:kvm_vcpu_wakeup",
              "timer:hrtimer_expire_entry", "sched:sched_switch")
LAPIC_TIMER_FUNCTION = "apic_timer_fn"  # the hrtimer of a guest's LAPIC timer (KVM's lapic.c)
EXIT_HIST = "hist:keys=common_pid,isa,exit_reason:vals=hitcount"  # the kernel counts every exit by reason
HIST_LIMIT = 1 << 18

# a raw exit reason as the kernel prints it -> (one name for both vendors, what it means)
EXIT_REASONS: dict[str, tuple[str, str]] = {
    # SVM's "intr" was "interrupt" before Linux 6.x
    **{raw: ("EXTERNAL_INTERRUPT", "a host interrupt arrived") for raw in ("EXTERNAL_INTERRUPT", "intr", "interrupt")},
    **{raw: ("HLT", "the guest halted (idle)") for raw in ("HLT", "hlt", "idle-halt")},
    **{raw: ("EPT_VIOLATION", "nested page fault: guest memory not mapped yet, or MMIO")
       for raw in ("EPT_VIOLATION", "npf")},
    "EPT_MISCONFIG": ("EPT_MISCONFIG", "MMIO to an emulated device"),
    **{raw: ("MSR", "an MSR read or write") for raw in ("MSR_READ", "MSR_WRITE", "msr")},
    **{raw: ("IO_INSTRUCTION", "port I/O to an emulated device") for raw in ("IO_INSTRUCTION", "io")},
    **{raw: ("INTERRUPT_WINDOW", "waiting for the guest to accept an interrupt")
       for raw in ("INTERRUPT_WINDOW", "vintr")},
    **{raw: ("PAUSE_INSTRUCTION", "a spinning vCPU (pause-loop exiting)") for raw in ("PAUSE_INSTRUCTION", "pause")},
    **{raw: ("EXCEPTION_NMI", "an exception or NMI in the guest") for raw in ("EXCEPTION_NMI", "nmi")},
    **{raw: ("CPUID", "CPUID") for raw in ("CPUID", "cpuid")},
    **{raw: ("RDTSC", "a TSC read the host intercepts") for raw in ("RDTSC", "RDTSCP", "rdtsc", "rdtscp")},
    **{raw: ("VMCALL", "a hypercall") for raw in ("VMCALL", "hypercall", "vmmcall")},
    **{raw: ("TRIPLE_FAULT", "the guest shut down") for raw in ("TRIPLE_FAULT", "shutdown")},
    "PREEMPTION_TIMER": ("PREEMPTION_TIMER", "the VMX preemption timer (the guest's LAPIC timer) expired"),
    "APIC_WRITE": ("APIC_WRITE", "a LAPIC register write"),
    "APIC_ACCESS": ("APIC_ACCESS", "a LAPIC page access"),
    "EOI_INDUCED": ("EOI_INDUCED", "an end of interrupt KVM must see"),
    "TPR_BELOW_THRESHOLD": ("TPR_BELOW_THRESHOLD", "the guest lowered its task priority"),
    **{raw: ("CR_ACCESS", "a control register access") for raw in (
        "CR_ACCESS", "read_cr0", "read_cr3", "read_cr4", "read_cr8", "write_cr0", "write_cr3", "write_cr4",
        "write_cr8", "cr0_sel_write", "write_cr0_trap", "write_cr4_trap", "write_cr8_trap")},
    **{raw: ("XSETBV", "XSETBV") for raw in ("XSETBV", "xsetbv")},
    **{raw: ("WBINVD", "a cache flush") for raw in ("WBINVD", "wbinvd")},
    **{raw: ("MWAIT_INSTRUCTION", "MONITOR/MWAIT") for raw in ("MWAIT_INSTRUCTION", "MONITOR_INSTRUCTION",
                                                             "mwait", "monitor")},
    **{raw: ("INVLPG", "a TLB invalidation") for raw in ("INVLPG", "invlpg", "invlpga", "INVPCID", "invpcid")},
    "avic_incomplete_ipi": ("APIC_ACCESS", "an IPI AVIC could not deliver"),
    "avic_unaccelerated_access": ("APIC_ACCESS", "a LAPIC access AVIC does not accelerate"),
    # arm64: the exception type, or a trap's exception class (arch/arm64/include/asm/esr.h)
    "IRQ": ("IRQ", "a host interrupt arrived"),
    "SERROR": ("SERROR", "an asynchronous external abort (SError)"),
    "WFx": ("WFx", "the guest waited for an interrupt or event (WFI/WFE: idle)"),
    "DABT_LOW": ("DABT_LOW", "a guest data abort: MMIO to an emulated device, or memory not mapped yet"),
    "IABT_LOW": ("IABT_LOW", "a guest instruction abort: memory not mapped yet"),
    "HVC64": ("HVC64", "a hypercall (PSCI, PV time, ...)"),
    "SMC64": ("SMC64", "a secure monitor call KVM handles (PSCI)"),
    "SYS64": ("SYS64", "a trapped system register access"),
    "FP_ASIMD": ("FP_ASIMD", "the guest's first FP/SIMD use since its state was switched out"),
}
_INJECTED = re.compile(r"(?:irq (?P<dec>\d+)|(?P<kind>IRQ|Soft/INTn) 0x(?P<hex>[0-9a-f]+))")
_ACCEPTED = re.compile(r"apicid (?P<apic>[0-9a-f]+) vec (?P<vector>\d+)")
_LAPIC_DELTA = re.compile(r"delta (?P<delta>-?\d+)")
_WAKEUP = re.compile(r"(?P<how>wait|poll) time (?P<ns>-?\d+) ns")
_HIST_ROW = re.compile(r"\{ common_pid:\s*(\d+), isa:\s*(\d+), exit_reason:\s*(\d+) \} hitcount:\s*(\d+)")
_SYMBOLS = re.compile(r"\{\s*(0x[0-9a-fA-F]+|\d+)(?:\s*\+\s*(\d+))?,\s*\"([^\"]{1,40})\"\s*\}")


def exit_name(raw: str) -> tuple[str, str]:
    """One name for a raw exit reason (VMX's or SVM's), and what it means; unknown ones keep their own."""
    known = EXIT_REASONS.get(raw)
    if known is not None:
        return known
    if raw.endswith(" excp"):  # SVM's exception intercepts: "PF excp", "GP excp"
        return "EXCEPTION_NMI", f"a #{raw.split()[0]} exception in the guest"
    return raw.upper().replace("-", "_")[:40] or "UNKNOWN", "an exit KVM names so"


# ---- the trace -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KvmEvent:
    """One event of a vCPU thread (``pid``) or of a traced pCPU (``cpu``): ``kind`` exit, entry, inject, accept,
    lapic-expire, hv-timer, wakeup, switch-out; ``value`` its reason, vector, delta or waited ns."""

    ts_ns: int
    cpu: int
    pid: int
    kind: str
    value: str = ""


@dataclass(slots=True)
class KvmTrace:
    events: list[KvmEvent] = field(default_factory=list)  # of every task on the traced pCPUs, in time order
    timers: dict[int, list[int]] = field(default_factory=dict)  # pCPU -> when a LAPIC timer fired there
    resumes: dict[int, list[int]] = field(default_factory=dict)  # pCPU -> where its kept trace resumes


def read_kvm_events(events: Iterable[TraceEvent]) -> KvmTrace:
    """The KVM events of a trace (explain.tracefs) in time order, the LAPIC timers' expiries by pCPU."""
    trace = KvmTrace()
    for event in sorted(events, key=lambda e: e.ts_ns):
        name, body = event.event, event.body
        found: KvmEvent | None = None
        if name == "kvm_exit":
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "exit", exit_reason(body))
        elif name == "kvm_entry":
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "entry")
        elif name == "kvm_inj_virq" and (match := _INJECTED.search(body)) is not None:
            vector = int(match["dec"]) if match["dec"] else int(match["hex"], 16)
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "inject",
                             f"{vector}{' soft' if match['kind'] == 'Soft/INTn' else ''}")
        elif name == "kvm_apic_accept_irq" and (match := _ACCEPTED.search(body)) is not None:
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "accept", match["vector"])
        elif name == "kvm_wait_lapic_expire" and (match := _LAPIC_DELTA.search(body)) is not None:
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "lapic-expire", match["delta"])
        elif name == "kvm_hv_timer_state":
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "hv-timer", body_fields(body).get("hv_timer", ""))
        elif name == "kvm_vcpu_wakeup" and (match := _WAKEUP.search(body)) is not None:
            found = KvmEvent(event.ts_ns, event.cpu, event.pid, "wakeup", f"{match['how']} {match['ns']}")
        elif name == "hrtimer_expire_entry" and f"function={LAPIC_TIMER_FUNCTION}" in body:
            trace.timers.setdefault(event.cpu, []).append(event.ts_ns)
        elif name == "sched_switch":
            prev = body_fields(body).get("prev_pid", "")
            if prev.isdigit():
                found = KvmEvent(event.ts_ns, event.cpu, int(prev), "switch-out")
        if found is not None:
            trace.events.append(found)
    return trace


# ---- exits as occupancies ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Exit:
    """One VM exit of a vCPU, from kvm_exit to its next kvm_entry, with what happened between."""

    vcpu: int
    pid: int
    cpu: int
    start_ns: int
    end_ns: int
    raw: str
    injected: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)
    lapic_delta: str | None = None
    wakeup: str | None = None
    hv_timer: str | None = None


def _exits(trace: KvmTrace, vcpus: Mapping[int, int]) -> list[Exit]:
    """Every exit of the vCPU threads ``vcpus`` (index -> tid) closed by an entry, not across a stretch of a
    pCPU's trace that was not kept."""
    by_tid = {tid: index for index, tid in vcpus.items()}
    open_: dict[int, Exit] = {}
    closed: dict[int, Exit] = {}  # tid -> its last exit, for what KVM traces right after the entry
    found = []

    def unbroken(cpu_a: int, start: int, cpu_b: int, end: int) -> bool:
        return all(bisect.bisect_right(times, start) == bisect.bisect_right(times, end)
                   for times in (trace.resumes.get(cpu_a, []), trace.resumes.get(cpu_b, [])))

    for event in trace.events:
        if event.pid not in by_tid:
            continue
        if event.kind == "exit":
            open_[event.pid] = Exit(by_tid[event.pid], event.pid, event.cpu, event.ts_ns, event.ts_ns,
                                    event.value or "unknown")
            continue
        current = open_.get(event.pid)
        if event.kind == "lapic-expire":  # traced as the vCPU enters the guest (after kvm_entry on 6.1)
            target = current or closed.get(event.pid)
            if target is not None:
                target.lapic_delta = event.value
        elif current is None:
            continue
        elif event.kind == "entry":
            del open_[event.pid]
            if current.start_ns < event.ts_ns and unbroken(current.cpu, current.start_ns, event.cpu, event.ts_ns):
                current.end_ns = event.ts_ns
                found.append(current)
                closed[event.pid] = current
        elif event.kind == "inject":
            current.injected.append(event.value)
        elif event.kind == "accept":
            current.accepted.append(event.value)
        elif event.kind == "wakeup":
            current.wakeup = event.value
        elif event.kind == "hv-timer":
            current.hv_timer = event.value
    return found


def _detail(exit_: Exit, name: str) -> dict[str, str | int]:
    detail: dict[str, str | int] = {"reason": name, "raw_reason": exit_.raw, "vcpu": exit_.vcpu,
                                    "host_cpu": exit_.cpu, "exit_ns": exit_.end_ns - exit_.start_ns}
    if exit_.injected:
        detail["injected"] = ",".join(exit_.injected)[:80]
    if exit_.accepted:
        detail["accepted_vectors"] = ",".join(exit_.accepted)[:80]
    if exit_.lapic_delta is not None:
        detail["lapic_expire_delta_tsc"] = exit_.lapic_delta
    if exit_.wakeup is not None:
        detail["halt"] = exit_.wakeup
    if exit_.hv_timer is not None:
        detail["hv_timer"] = exit_.hv_timer
    return detail


def kvm_occupancies(trace: KvmTrace, vcpus: Mapping[int, int]) -> list[Occupancy]:
    """Each exit as an occupancy on the KVM host's clock (``cpu`` = the vCPU's index); a halt cut where its LAPIC
    timer fired on its pCPU."""
    found = []
    for exit_ in _exits(trace, vcpus):
        name, _ = exit_name(exit_.raw)
        detail = _detail(exit_, name)
        if name != "HLT":
            found.append(Occupancy("kvm", exit_.start_ns, exit_.end_ns, f"vCPU exited for {name} ({exit_.raw})",
                                   "vm-exit", exit_.vcpu, detail))
            continue
        timers = trace.timers.get(exit_.cpu, [])
        at = bisect.bisect_right(timers, exit_.start_ns)
        fired = timers[at] if at < len(timers) and timers[at] < exit_.end_ns else None
        if fired is None:
            woken = f" (woken by vector {exit_.accepted[0]})" if exit_.accepted else ""
            found.append(Occupancy("kvm", exit_.start_ns, exit_.end_ns, f"vCPU halted ({exit_.raw}){woken}",
                                   "vcpu-halted", exit_.vcpu, detail))
            continue
        found.append(Occupancy("kvm", exit_.start_ns, fired, f"vCPU halted ({exit_.raw}): its timer had not fired",
                               "vcpu-halted", exit_.vcpu, detail))
        found.append(Occupancy("kvm", fired, exit_.end_ns,
                               f"vCPU halted ({exit_.raw}): back in the guest after its timer fired", "timer-wake",
                               exit_.vcpu, {**detail, "after_timer_ns": exit_.end_ns - fired}))
    return found


def exit_statistics(trace: KvmTrace, vcpus: Mapping[int, int], counted: Mapping[tuple[int, str], int] | None
                    ) -> list[dict[str, Any]]:
    """``perf kvm stat``-style rows: per vCPU and reason, the exits' count and their time (from the exits the
    trace holds whole: ``timed`` of them). ``counted``: (tid, raw reason) -> every exit the kernel counted."""
    by_tid = {tid: index for index, tid in vcpus.items()}
    rows: dict[tuple[int, str], dict[str, Any]] = {}

    def row(vcpu: int, raw: str) -> dict[str, Any]:
        name, meaning = exit_name(raw)
        return rows.setdefault((vcpu, raw), {"vcpu": vcpu, "reason": name, "raw_reason": raw, "meaning": meaning,
                                             "count": 0, "timed": 0, "total_ns": 0, "min_ns": None, "max_ns": None})

    for exit_ in _exits(trace, vcpus):
        entry = row(exit_.vcpu, exit_.raw)
        took = exit_.end_ns - exit_.start_ns
        entry["timed"] += 1
        entry["total_ns"] += took
        entry["min_ns"] = took if entry["min_ns"] is None else min(entry["min_ns"], took)
        entry["max_ns"] = took if entry["max_ns"] is None else max(entry["max_ns"], took)
    for entry in rows.values():
        entry["count"] = entry["timed"]
    if counted is not None:
        for (tid, raw), count in counted.items():
            if tid in by_tid:
                row(by_tid[tid], raw)["count"] = count
    for entry in rows.values():
        entry["mean_ns"] = entry["total_ns"] // entry["timed"] if entry["timed"] else None
    return sorted(rows.values(), key=lambda r: (r["vcpu"], -r["count"], r["raw_reason"]))


def exit_symbols(format_text: str) -> dict[int, dict[int, str]]:
    """isa (1 VMX, 2 SVM) -> exit_reason number -> the name kvm_exit prints, from the event's own ``format``."""
    at = format_text.find("print fmt:")
    text = format_text[at:] if at >= 0 else format_text
    split = text.find(": __print_symbolic(REC->exit_reason,")
    if split < 0:
        return {}
    tables = {}
    for isa, part in ((1, text[:split]), (2, text[split:])):
        tables[isa] = {int(number, 0) + int(offset or 0): name for number, offset, name in _SYMBOLS.findall(part)}
    return tables


def hist_counts(hist_text: str, symbols: Mapping[int, Mapping[int, str]]) -> dict[tuple[int, str], int]:
    """(tid, raw reason) -> count, from a ``hist`` of EXIT_HIST."""
    counts: dict[tuple[int, str], int] = {}
    for pid, isa, reason, hits in _HIST_ROW.findall(hist_text):
        table = symbols.get(int(isa), {})
        number = int(reason) & 0xFFFF if int(isa) == 1 else int(reason)
        raw = table.get(number, f"exit {reason}")
        counts[(int(pid), raw)] = counts.get((int(pid), raw), 0) + int(hits)
    return counts


# ---- the source ----------------------------------------------------------------------------------------------


class KvmSource:
    """The KVM layer of one QEMU guest: armed before launch on the vCPUs' pCPUs of its KVM host (``access``:
    None for this machine), told its vCPU threads and clock exchange once QEMU placed them (``attach``).
    ``accel``: tcg leaves nothing to trace; ``no_clock`` says why a guest cannot take part in the clock exchange;
    ``keep`` the flight recorder's rule (None: one buffer of ``buffer_mb`` per pCPU read at the end)."""

    layer: Layer = "kvm"

    def __init__(self, vm: str, host_cpus: tuple[int, ...], accel: str, buffer_mb: int = 64,
                 no_clock: str | None = None, keep: KeepRule | None = None,
                 access: TracefsAccess | None = None) -> None:
        self.vm = vm
        self.host_cpus = host_cpus
        self.accel = accel
        self.buffer_mb = buffer_mb
        self.no_clock = no_clock
        self.keep = keep
        self.access = access
        self.samples: Path | None = None
        self.recorder: FlightRecorder | None = None
        self._instance: TracefsInstance | None = None
        self._why_not: str | None = None if accel == "kvm" else \
            "the guest ran under TCG (software emulation): no KVM, no VM exits"
        self._trace = KvmTrace()
        self._counted: dict[tuple[int, str], int] | None = None
        self._dropped = 0
        self._problems: list[str] = []
        self._vcpus: dict[int, int] = {}
        self._exchange: Any = None
        self._tsc_note: str | None = None

    def follow(self, samples: Path) -> None:
        """The file the guest's samples reach on this host while the run goes (before ``start``)."""
        self.samples = samples

    def start(self) -> None:
        if self._instance is not None or self._why_not is not None:
            return
        try:
            instance, self.recorder = start_guest_tracing(
                self.host_cpus, KVM_EVENTS, buffer_mb=self.buffer_mb, recording_ring_kb=RING_KB,
                samples=self.samples, keep=self.keep, clock_map=self.clock_map, access=self.access)
        except TracingUnavailable as exc:
            self._why_not = str(exc)
            return
        self._instance = instance
        missing = [event for event in instance.missing_events if event.startswith("kvm:kvm_e")]
        if missing:
            self._problems.append(f"the KVM host's kernel has no {', '.join(missing)}: exits are not seen")
        self._count_exits(instance)

    def _count_exits(self, instance: TracefsInstance) -> None:
        """The kernel's own count of every exit by reason (a hist trigger on the instance's kvm_exit), where the
        KVM host's kernel has hist triggers."""
        assert instance.path is not None
        try:
            instance.access.write(str(instance.path / "events/kvm/kvm_exit/trigger"), EXIT_HIST)
            self._counted = {}
        except OSError:
            self._problems.append("the KVM host's kernel has no hist triggers: exits are counted from the kept "
                                  "trace only")

    def attach(self, qemu_pid: int, vcpus: Mapping[int, int], exchange: Any) -> None:
        """The VM is placed (its vCPU threads exist, it has not run yet): remember who is who."""
        self._vcpus, self._exchange = dict(vcpus), exchange

    def note_tsc(self, offsets: Mapping[str, Any]) -> None:
        """KVM's TSC offset (and scaling) of each vCPU, for the notes: with it, a guest TSC reading maps onto the
        host's TSC exactly, as trace-cmd aligns host and guest traces; our guests' samples are on their
        CLOCK_MONOTONIC, which the clock exchange maps instead."""
        said = [f"{vcpu}: {value['offset']:+d}" + (f" x{value['scaling_ratio']}" if value.get("scaling_ratio") else "")
                for vcpu, value in offsets.items() if isinstance(value, dict)]
        self._tsc_note = ("KVM's tsc-offset (guest TSC = host TSC + offset): " + ", ".join(said) if said else
                          f"KVM's tsc-offset not read: {offsets.get('unavailable', 'unknown')}")

    def stop(self) -> None:
        if self._instance is None:
            return
        instance, self._instance = self._instance, None
        if self._counted is not None:
            assert instance.path is not None
            try:
                symbols = exit_symbols(instance.access.read(str(instance.path / "events/kvm/kvm_exit/format")))
                hist = instance.access.read(str(instance.path / "events/kvm/kvm_exit/hist"))[:HIST_LIMIT]
                self._counted = hist_counts(hist, symbols)
            except OSError as exc:
                self._counted = None
                self._problems.append(f"the kernel's count of exits could not be read: {exc.strerror or exc}")
        instance.stop()
        self._trace = read_kvm_events(instance.events())
        if self.recorder is not None:
            self._trace.resumes = self.recorder.resumes
        self._dropped = instance.dropped_events
        self._problems += instance.problems

    def clock_map(self) -> ClockMap | None:
        return self._exchange.clock_map() if self._exchange is not None else None

    def collect(self, context: CollectContext) -> LayerTrace:
        if self._why_not is not None:
            return LayerTrace("kvm", False, self._why_not)
        if not self._vcpus:
            return LayerTrace("kvm", False, "the VM's vCPU threads were never known (it did not start)")
        statistics = exit_statistics(self._trace, self._vcpus, self._counted)
        tables = {"kvm_exits": statistics}
        if not any(row["count"] for row in statistics):
            return LayerTrace("kvm", False, "no VM exit of the guest's vCPUs was recorded although it ran: this KVM "
                              "does not trace its exits (a paravirtual KVM such as PVM) or the trace lost them",
                              notes=list(self._problems), tables=tables)
        clock = self.clock_map()
        if clock is None:
            problem = self.no_clock or (getattr(self._exchange, "problem", None) if self._exchange else None)
            return LayerTrace("kvm", False, "the guest's clock could not be aligned with the KVM host's: "
                              + (problem or "no clock exchange took place"), notes=list(self._problems),
                              tables=tables)
        keep = _near_windows(context.windows)
        occupancies = []
        for occupancy in kvm_occupancies(self._trace, self._vcpus):
            start, end = clock.to_guest(occupancy.start_ns), clock.to_guest(occupancy.end_ns)
            if keep(start, end, occupancy.cpu):
                occupancies.append(Occupancy("kvm", start, end, occupancy.cause, occupancy.kind, occupancy.cpu,
                                             occupancy.detail))
        notes = list(clock.notes) + self._problems + ([self._tsc_note] if self._tsc_note else [])
        bound, dropped = bound_notes(self.recorder, self._dropped, context, self.buffer_mb * 1024, "vCPU")
        notes += bound
        timed = sum(row["timed"] for row in statistics)
        counted = sum(row["count"] for row in statistics)
        notes.append(f"{counted} VM exits of the guest's vCPUs" + (
            f" counted by the KVM host's kernel, {timed} of them timed from the kept trace" if self._counted
            is not None else ", counted and timed from the kept trace"))
        drift, said = drift_allowance(clock, context.windows)  # (as the VM layer's: the same exchange)
        return LayerTrace("kvm", True, None, occupancies, clock.uncertainty_ns + drift + TEXT_RESOLUTION_NS, dropped,
                          notes + said, tables=tables)
