"""What every checklist family shares: the item it reports, the host it looks at, the setting it would change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ...params import cpu_list, parse_cpulist
from ...sysaudit import SystemView

__all__ = ["Item", "HostContext", "Step", "cpu_list", "hex_mask", "parse_hex_mask", "parse_list", "chosen", "running",
           "Status", "US", "MS",
           "AFFINITY_PREFIX", "affinity_setting"]

Status = Literal["ok", "not-ready", "unknown"]
Kind = Literal["boot", "runtime", "hypervisor"]

AFFINITY_PREFIX = "affinity:"  # a setting that is not a file: affinity:<pid>:<start time>, a thread's CPUs

US = 1_000
MS = 1_000_000


@dataclass
class Item:
    """One checklist item as found: why it matters, and the exact fix.

    ``matters_below_ns``: a requirement class whose allowed jitter (tight end) is below this needs the item met.
    ``owner``: another tool that owns the setting (tuned, irqbalance): a change of ours would not last.
    """

    id: str
    family: str
    title: str
    status: Status
    found: str
    expected: str
    why: str
    fix: str
    kind: Kind
    matters_below_ns: int
    owner: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Step:
    """A runtime change a profile makes: write ``value`` to ``path`` (the item it serves, for the account)."""

    item: str
    path: str
    value: str
    restore_as: Callable[[str], str] | None = None  # the ledger's: how what the file reads is written back


@dataclass
class HostContext:
    """The host (or target) checked, with the CPUs that carry real-time work on it."""

    view: SystemView
    audit: dict[str, Any]
    rt_cpus: tuple[int, ...]
    all_cpus: tuple[int, ...]
    cache: dict[str, str | None] = field(default_factory=dict)

    @property
    def housekeeping(self) -> tuple[int, ...]:
        return tuple(c for c in self.all_cpus if c not in self.rt_cpus)

    def read(self, *paths: str, limit: int = 4096) -> dict[str, str | None]:
        missing = [p for p in paths if p not in self.cache]
        if missing:
            self.cache.update(self.view.read_many(missing, limit))
        return {p: self.cache[p] for p in paths}

    def one(self, path: str) -> str | None:
        return self.read(path)[path]


def affinity_setting(pid: int, start_time: str) -> str:
    """The setting path of thread ``pid``'s CPU affinity (its start time tells a reused pid apart)."""
    return f"{AFFINITY_PREFIX}{pid}:{start_time}"


def hex_mask(cpus: tuple[int, ...]) -> str:
    return format(sum(1 << c for c in cpus), "x")


def parse_hex_mask(text: str) -> tuple[int, ...]:
    value = int(text.replace(",", "").strip() or "0", 16)
    return tuple(c for c in range(value.bit_length()) if value >> c & 1)


def parse_list(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return parse_cpulist(text.strip()) if text.strip() else ()
    except ValueError:
        return None


def chosen(text: str) -> str:
    """The active choice of a sysfs choice file: 'always [madvise] never' -> 'madvise'."""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text.strip()


def running(ctx: HostContext, *names: str) -> list[str]:
    """Which of the programs ``names`` run on the host (by process name)."""
    if "processes" not in ctx.cache:
        comms = ctx.view.read_many([f"{p}/comm" for p in ctx.view.glob("/proc", "[0-9]*", 8192)], 64)
        ctx.cache["processes"] = "\n".join(sorted({v for v in comms.values() if v}))
    seen = set((ctx.cache["processes"] or "").splitlines())
    return [n for n in names if n in seen]
