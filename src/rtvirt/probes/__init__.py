"""The probe registry: one module per probe, one line per probe here."""

from __future__ import annotations

from ..errors import InputError
from . import gap, kops, selftest, threadmetric, timer, wakeup, workload
from .base import ProbeSpec

__all__ = ["PROBES", "ProbeSpec", "get_probe"]

PROBES: dict[str, ProbeSpec] = {spec.name: spec for spec in (
    timer.PROBE,
    gap.PROBE,
    kops.PROBE,
    workload.PROBE,
    threadmetric.PROBE,
    wakeup.PROBE,
    selftest.PROBE,
)}


def get_probe(name: str) -> ProbeSpec:
    try:
        return PROBES[name]
    except KeyError:
        raise InputError(f"unknown probe {name!r} (known: {', '.join(PROBES)})") from None
