"""Where a run came from, as columns: one flat row per run from its manifest, the same for every store.

The manifest already records the machine (the system audit), the environment's description and the
campaign; this module only picks the fields history questions group and filter by (docs/results-store.md).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["COLUMNS", "run_row", "content_sha256", "CHANGE_COLUMNS", "configuration"]

# name -> SQL type (PostgreSQL; DuckDB reads the same names)
COLUMNS: dict[str, str] = {
    "run_id": "text", "created": "text", "name": "text", "source": "text", "probe": "text",
    "value_field": "text", "status": "text", "scenario": "text", "scenario_sha256": "text", "environment": "text",
    "config": "text", "repetition": "bigint", "machine": "text", "board": "text", "kernel": "text",
    "kernel_version": "text", "preemption": "text", "kernel_cmdline": "text", "hypervisor": "text",
    "hypervisor_version": "text", "guest_kernel": "text", "rtvirt_version": "text", "samples": "bigint",
    "dropped": "bigint", "min_ns": "double precision", "median_ns": "double precision",
    "mean_ns": "double precision", "p99_ns": "double precision", "p999_ns": "double precision",
    "p9999_ns": "double precision", "max_ns": "double precision",
}
# A change of one of these between two runs of a configuration on a machine is marked in its history.
CHANGE_COLUMNS = ("kernel", "preemption", "kernel_cmdline", "hypervisor", "hypervisor_version", "guest_kernel",
                  "scenario_sha256", "rtvirt_version")
_STATISTICS = ("min_ns", "median_ns", "mean_ns", "p99_ns", "p999_ns", "p9999_ns", "max_ns")
_MAX_TEXT = 512


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value)[:_MAX_TEXT]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _hypervisor(detail: dict[str, Any]) -> tuple[str | None, str | None]:
    """The environment kind and the version its description reports (QEMU, libvirt's hypervisor, Xen)."""
    kind = _text(detail.get("kind"))
    versions, lab = _mapping(detail.get("versions")), _mapping(detail.get("lab"))
    for version in (detail.get("hypervisor_version"), versions.get("hypervisor"), detail.get("xen_version"),
                    lab.get("hypervisor"), detail.get("qemu")):
        if version:
            return kind, _text(version)
    return kind, None


def run_row(manifest: dict[str, Any]) -> dict[str, Any]:
    """The catalog row of one run (COLUMNS), from its manifest alone."""
    system = _mapping(manifest.get("system"))
    detail = _mapping(manifest.get("environment_detail"))
    virtualization = _mapping(system.get("virtualization"))
    overall = (manifest.get("summary") or {}).get("all") or {}
    hypervisor, hypervisor_version = _hypervisor(detail)
    row: dict[str, Any] = {
        "run_id": str(manifest["run_id"]), "created": _text(manifest.get("created")),
        "name": _text(manifest.get("name")), "source": _text(manifest.get("source")),
        "probe": _text(manifest.get("probe")), "value_field": _text(manifest.get("value_field")),
        "status": _text(manifest.get("status")), "scenario": _text(manifest.get("scenario")),
        "scenario_sha256": _text(manifest.get("scenario_sha256")),
        "environment": _text(manifest.get("environment")),
        "config": _text(manifest.get("config")),
        "repetition": manifest.get("repetition") if isinstance(manifest.get("repetition"), int) else None,
        "machine": _text(manifest.get("machine") or system.get("hostname")),
        "board": _text(manifest.get("board") or virtualization.get("dmi")),
        "kernel": _text(system.get("kernel")), "kernel_version": _text(system.get("kernel_version")),
        "preemption": _text(system.get("preemption")), "kernel_cmdline": _text(system.get("cmdline")),
        "hypervisor": hypervisor, "hypervisor_version": hypervisor_version,
        "guest_kernel": _text(detail.get("guest_kernel") or detail.get("guest_uname")),
        "rtvirt_version": _text(manifest.get("rtvirt_version")),
        "samples": overall.get("samples") if isinstance(overall.get("samples"), int) else None,
        "dropped": manifest.get("dropped") if isinstance(manifest.get("dropped"), int) else None,
    }
    for name in _STATISTICS:
        value = overall.get(name)
        row[name] = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    return row


def content_sha256(document: dict[str, Any]) -> str:
    """The hash of a JSON document's content (key order aside): a scenario's, or a manifest's (two different
    runs that drew the same id are told apart)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def configuration(row: dict[str, Any]) -> str:
    """The label runs of one configuration share (a campaign's config, else the run's name)."""
    return str(row.get("config") or row.get("name") or row.get("run_id"))
