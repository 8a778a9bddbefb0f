"""What can be said about what rtvirt does not trace: an outer hypervisor under the measured machine, and the
idle states of its measured CPUs.

An outer hypervisor that takes a measured CPU away shows in no trace of the machine itself: the time simply
passes (an interrupt arrives late to an idle CPU, a task seems to run on). What the machine does show is its
steal counter, per CPU (``/proc/stat`` ``cpuN``, in ticks of USER_HZ: 10 ms here), which the layer reads at the
start and end of the run and, on this machine, every ``STEAL_SAMPLE_S`` while it goes, so that a window can say
how much steal its CPU saw around it; and the cpuidle states the measured CPUs may enter, with their exit
latencies (``/sys/devices/system/cpu/cpuN/cpuidle``), which bound what idling itself can cost a wake-up.

Whether the machine is a VM: the CPU's ``hypervisor`` flag, unless that flag is the traced hypervisor's own
(dom0 under Xen): then the DMI vendor the firmware reports says whether Xen itself runs in a VM.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .model import Layer, Occupancy

__all__ = ["read_local", "cpu_steal_ns", "StealSeries", "StealReading", "idle_exit_latency", "inside_vm",
           "outer_hypervisor_note", "stolen_stretches", "STOLEN", "STEAL_SAMPLE_S", "VM_VENDORS"]

STOLEN = "the outer hypervisor took the CPU"
# steal counts in ticks (10 ms): a stretch with no event of at least this, around which the CPU's steal rose by at
# least half of it, is read as the outer hypervisor's
STOLEN_MIN_NS = 2_000_000
STEAL_SAMPLE_S = 0.02  # how often this machine's per-CPU steal is read while a run goes (its ticks are 10 ms)
MAX_READINGS = 500_000  # readings kept (only changes are kept: hours of a run that is stolen from often)
# DMI system vendors and products of virtual machines (as their firmware reports them), lower case
VM_VENDORS = ("qemu", "kvm", "vmware", "innotek", "virtualbox", "parallels", "bochs", "microsoft corporation virtual",
              "amazon ec2", "google compute engine", "xen", "bhyve", "openstack", "firecracker")


def read_local(path: str) -> str:
    """A file of this machine (what the readers here use by default; a target or dom0 passes its own)."""
    return Path(path).read_text()


def cpu_steal_ns(stat: str, cpus: Collection[int]) -> dict[int, int]:
    """Each of ``cpus``' steal so far (ns, in ticks of USER_HZ) from /proc/stat's ``cpuN`` lines."""
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    found = {}
    for line in stat.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        fields = line.split()
        with contextlib.suppress(ValueError, IndexError):
            cpu = int(fields[0][3:])
            if cpu in cpus:
                found[cpu] = int(fields[8]) * tick_ns
    return found


@dataclass(frozen=True, slots=True)
class StealReading:
    """How far a CPU's steal counter rose between two readings around a window (ns on CLOCK_MONOTONIC)."""

    steal_ns: int
    from_ns: int
    to_ns: int

    def text(self, cpu: int) -> str:
        return (f"steal +{self.steal_ns / 1e6:.0f} ms on CPU {cpu} over the {(self.to_ns - self.from_ns) / 1e6:.0f} "
                "ms around it")


@dataclass
class StealSeries:
    """This machine's steal of ``cpus``, read every STEAL_SAMPLE_S by a thread of its own (kept off ``away``,
    the traced CPUs, where others are usable) from ``start`` to ``stop``; only changes are kept."""

    cpus: tuple[int, ...]
    away: tuple[int, ...] = ()
    read: Callable[[str], str] = read_local
    times: list[int] = field(default_factory=list)
    values: dict[int, list[int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _latest: tuple[int, tuple[int, ...]] | None = None

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="rtvirt-steal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._sample(force=True)

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            if others := os.sched_getaffinity(0) - set(self.away):
                os.sched_setaffinity(0, others)
        while not self._stop.wait(STEAL_SAMPLE_S):
            self._sample()

    def _sample(self, force: bool = False) -> None:
        """Read the counters; a reading is kept where they changed, with the last unchanged one before it (the
        value still held then), so any time between two kept readings is bracketed exactly."""
        try:
            steal = cpu_steal_ns(self.read("/proc/stat"), self.cpus)
        except OSError:
            return
        reading = (time.monotonic_ns(), tuple(steal.get(cpu, 0) for cpu in self.cpus))
        kept = self._kept()
        if kept is None or reading[1] != kept[1] or force:
            if kept is not None and self._latest is not None and self._latest[0] != kept[0]:
                self._append(self._latest)
            self._append(reading)
        self._latest = reading

    def _kept(self) -> tuple[int, tuple[int, ...]] | None:
        if not self.times:
            return None
        return self.times[-1], tuple(self.values[cpu][-1] for cpu in self.cpus)

    def _append(self, reading: tuple[int, tuple[int, ...]]) -> None:
        if len(self.times) >= MAX_READINGS:
            return
        self.times.append(reading[0])
        for cpu, value in zip(self.cpus, reading[1], strict=True):
            self.values.setdefault(cpu, []).append(value)

    def around(self, cpu: int, start_ns: int, end_ns: int) -> StealReading | None:
        """The rise of ``cpu``'s steal over [start_ns, end_ns], bracketed by the readings around each end where
        the counter changed near it (a change lies between two readings STEAL_SAMPLE_S apart), else exact
        there (None: the readings do not reach over the window)."""
        values = self.values.get(cpu)
        if not values:
            return None
        before = bisect.bisect_right(self.times, start_ns) - 1
        after = bisect.bisect_left(self.times, end_ns)
        if before < 0 or after >= len(self.times):
            return None
        # kept readings: where the counter changed, and the last reading before each change; between two kept
        # readings of one value, it held that value throughout
        steady_from = before + 1 < len(values) and values[before + 1] == values[before]
        steady_to = after > 0 and values[after - 1] == values[after]
        low = values[before]
        high = values[after - 1] if steady_to and after > before else values[after]
        return StealReading(high - low, start_ns if steady_from else self.times[before],
                            end_ns if steady_to else self.times[after])


def idle_exit_latency(cpu: int, read: Callable[[str], str] = read_local) -> tuple[str, int] | None:
    """The deepest idle state ``cpu`` may enter and its exit latency (ns), from cpuidle (None: no cpuidle)."""
    deepest: tuple[str, int] | None = None
    base = f"/sys/devices/system/cpu/cpu{cpu}/cpuidle"
    for index in range(16):
        try:
            name = read(f"{base}/state{index}/name").strip()
            latency_us = int(read(f"{base}/state{index}/latency").strip())
        except (OSError, ValueError):
            break
        with contextlib.suppress(OSError, ValueError):
            if int(read(f"{base}/state{index}/disable").strip()):
                continue
        if deepest is None or latency_us * 1000 >= deepest[1]:
            deepest = (name[:32], latency_us * 1000)
    return deepest


def inside_vm(read: Callable[[str], str] = read_local, traced_hypervisor: str | None = None) -> str | None:
    """Why rtvirt believes the measured machine runs inside a VM itself, or None. The CPU's hypervisor flag
    counts unless it is the traced hypervisor's own (``traced_hypervisor``, e.g. "xen": dom0 is Xen's guest);
    then only a DMI vendor or product of a virtual machine does."""
    vendor = ""
    with contextlib.suppress(OSError):
        vendor = " ".join(read(f"/sys/class/dmi/id/{name}").strip() for name in ("sys_vendor", "product_name"))
        vendor = "".join(c if c.isprintable() else "?" for c in vendor)[:60]
    if traced_hypervisor is not None:
        with contextlib.suppress(OSError):
            if read("/sys/hypervisor/type").strip() == traced_hypervisor:
                if any(name in vendor.lower() for name in VM_VENDORS):
                    return f"its firmware reports a virtual machine ({vendor})"
                return None
    with contextlib.suppress(OSError):
        for line in read("/proc/cpuinfo").splitlines():
            if line.startswith("flags") and " hypervisor" in line:
                return "the CPU reports a hypervisor" + (f" ({vendor})" if vendor else "")
    return None


def outer_hypervisor_note(steal_before: dict[int, int] | None, steal_after: dict[int, int] | None,
                          read: Callable[[str], str] = read_local, traced_hypervisor: str | None = None
                          ) -> tuple[str, bool] | None:
    """What could not be seen because the measured machine itself runs in a VM (None on bare metal), and
    whether its measured CPUs showed steal during the run (then time the outer hypervisor took is among what
    no trace shows; without steal the note says so, and no part is blamed on it)."""
    why = inside_vm(read, traced_hypervisor)
    if why is None:
        return None
    if traced_hypervisor is not None or steal_before is None or steal_after is None:
        return (f"the measured machine runs inside a VM itself ({why}): time its outer hypervisor takes is not "
                "traced, and its steal is not readable here", False)
    rose = {cpu: steal_after[cpu] - steal_before[cpu] for cpu in steal_after if cpu in steal_before}
    stolen = {cpu: amount for cpu, amount in rose.items() if amount > 0}
    if not stolen:
        return (f"the measured machine runs inside a VM itself ({why}); the steal counter of its measured CPUs "
                f"({', '.join(map(str, sorted(rose)))}) did not rise during the run", False)
    each = ", ".join(f"CPU {cpu} +{amount / 1e6:.0f} ms" for cpu, amount in sorted(stolen.items()))
    return (f"the measured machine runs inside a VM itself ({why}): time stolen by the outer hypervisor is "
            f"invisible; the steal counter of its measured CPUs rose during the run ({each})", True)


def stolen_stretches(times: Mapping[int, np.ndarray], windows: np.ndarray,
                     steal: Callable[[int, int, int], StealReading | None], layer: Layer = "host",
                     gaps: Mapping[int, np.ndarray] | None = None) -> list[Occupancy]:
    """Where in each window the outer hypervisor took the CPU, as far as can be said: a stretch in which the
    CPU's trace holds no event (``times``: each CPU's event times, sorted) of at least STOLEN_MIN_NS, around
    which its steal rose by at least half of it; the longest such stretches first, as far as the steal goes.
    Nothing the kernel did is seen there (not even its tick), so no traced occupancy can name it. Only a stretch
    the kept trace bounds is one: an event on either side of it and no gap of the trace in it (``gaps``: each
    CPU's gap markers, sorted: events the kernel lost, a stretch the flight recorder did not keep); before a
    CPU's trace begins, after it ends or across a gap, "no event" says nothing of the CPU."""
    found = []
    for start, end, cpu in zip(windows["start_ns"].tolist(), windows["end_ns"].tolist(), windows["cpu"].tolist(),
                               strict=True):
        reading = steal(int(cpu), int(start), int(end))
        stamps = times.get(int(cpu))
        if reading is None or stamps is None or reading.steal_ns < STOLEN_MIN_NS // 2:
            continue
        holes = gaps.get(int(cpu), np.zeros(0, np.int64)) if gaps is not None else np.zeros(0, np.int64)
        inside = stamps[(stamps > start) & (stamps < end)]
        edges = np.concatenate([np.array([start] if (stamps <= start).any() else [], np.int64), inside,
                                np.array([end] if (stamps >= end).any() else [], np.int64)])
        stretches = sorted(((int(b - a), int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)
                            if b - a >= STOLEN_MIN_NS and not ((holes > a) & (holes <= b)).any()), reverse=True)
        left = 2 * reading.steal_ns  # a tick's worth of rounding either way
        for length, begin, stop in stretches:
            if length > left:
                break
            left -= length
            found.append(Occupancy(layer, begin, stop, f"{STOLEN} (no event for {length / 1e6:.1f} ms; "
                                   f"{reading.text(int(cpu))})", "stolen", int(cpu),
                                   {"steal_ns": reading.steal_ns, "steal_span_ns": reading.to_ns - reading.from_ns},
                                   culprit=STOLEN))
    return found
