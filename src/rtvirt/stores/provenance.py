"""Where a run came from, as columns: one flat row per run from its manifest, the same for every store.

The manifest already records the machine (the system audit), the environment's description and the
campaign; this module only picks the fields history questions group and filter by (docs/results-store.md).
A run's statistics are in its unit (``unit``: ns, or rounds for Thread-Metric) in the ``*_value`` columns; the
``*_ns`` columns hold the same statistics only when they are times (NULL otherwise), so that a query written
for latencies never reads rounds as nanoseconds. ``identity`` keys what makes runs comparable (rtvirt.identity).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..identity import identity_key, run_identity
from ..quantity import run_quantity

__all__ = ["COLUMNS", "run_row", "content_sha256", "CHANGE_COLUMNS", "configuration", "STATISTICS"]

# the statistics of a run's summary ("all") the catalogs keep: <name>_value in the run's unit, <name>_ns when a time
STATISTICS = ("min", "median", "mean", "p99", "p999", "p9999", "max")

# name -> SQL type (PostgreSQL; DuckDB reads the same names)
COLUMNS: dict[str, str] = {
    "run_id": "text", "created": "text", "name": "text", "source": "text", "probe": "text",
    "value_field": "text", "status": "text", "scenario": "text", "scenario_sha256": "text", "environment": "text",
    "config": "text", "repetition": "bigint", "machine": "text", "board": "text", "kernel": "text",
    "kernel_version": "text", "preemption": "text", "kernel_cmdline": "text", "hypervisor": "text",
    "hypervisor_version": "text", "guest_kernel": "text", "rtvirt_version": "text", "samples": "bigint",
    "dropped": "bigint", **{f"{name}_ns": "double precision" for name in STATISTICS},
    "quantity": "text", "unit": "text", "identity": "text",
    **{f"{name}_value": "double precision" for name in STATISTICS},
}
# A change of one of these between two runs of a configuration on a machine is marked in its history.
CHANGE_COLUMNS = ("kernel", "preemption", "kernel_cmdline", "hypervisor", "hypervisor_version", "guest_kernel",
                  "scenario_sha256", "rtvirt_version")
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
    quantity = run_quantity(manifest)
    has_values = manifest.get("source") != "analysis"
    for name in STATISTICS:
        value = overall.get(f"{name}_ns")  # the summary's field names; the values are in the run's unit
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        row[f"{name}_ns"] = number if quantity.is_time else None
        row[f"{name}_value"] = number
    row |= {"quantity": quantity.name if has_values else None, "unit": quantity.unit if has_values else None,
            "identity": identity_key(run_identity(manifest))}
    return {name: row[name] for name in COLUMNS}  # in COLUMNS' order: a store inserts the values as they come


def content_sha256(document: dict[str, Any]) -> str:
    """The hash of a JSON document's content (key order aside): a scenario's, or a manifest's (two different
    runs that drew the same id are told apart)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def configuration(row: dict[str, Any]) -> str:
    """The label runs of one configuration share (a campaign's config, else the run's name)."""
    return str(row.get("config") or row.get("name") or row.get("run_id"))
