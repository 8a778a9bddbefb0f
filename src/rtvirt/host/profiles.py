"""Tuning profiles: which runtime checklist items ``rtvirt host tune`` meets, and the tuned profile that does the
same where tuned is installed (then tuned applies it, and rtvirt says which items it covered)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

__all__ = ["Profile", "PROFILES", "ProfileName"]


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    items: tuple[str, ...]
    tuned: str  # the tuned profile of the same purpose


_HOST = ("irq-affinity", "default-irq-affinity", "workqueue-cpumask", "kthread-affinity", "watchdog-cpumask",
         "timer-migration", "vm-stat-interval",
         "governor", "cstates", "pm-qos", "thp", "thp-defrag", "ksm", "numa-balancing")

PROFILES = {p.name: p for p in (
    Profile("realtime-host", "route IRQs and housekeeping work off the real-time CPUs, fix their frequency, keep "
            "them out of deep idle states, stop THP/KSM/NUMA balancing", _HOST, "realtime"),
    Profile("realtime-virtual-host", "realtime-host, and RT throttling off (a vCPU thread may use its whole CPU)",
            (*_HOST, "rt-throttling"), "realtime-virtual-host"),
    Profile("realtime-virtual-guest", "the same inside a guest: realtime-host and RT throttling off",
            (*_HOST, "rt-throttling"), "realtime-virtual-guest"),
)}


def _known_profile(value: str) -> str:
    if value not in PROFILES:
        raise ValueError(f"unknown tuning profile {value!r} (known: {', '.join(PROFILES)})")
    return value


ProfileName = Annotated[str, AfterValidator(_known_profile)]  # a scenario field naming a profile
