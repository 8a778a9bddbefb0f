"""Importers of the files people already have, into the results store's schema (docs/results-store.md)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..store import new_run, write_run
from . import column, cyclictest_hist, cyclictest_json, cyclictest_verbose, jitterdebugger, rtla_timerlat
from .base import Imported, ImporterSpec, ImportOptions

__all__ = ["IMPORTERS", "ImportOptions", "Imported", "ImporterSpec", "import_file"]

IMPORTERS: dict[str, ImporterSpec] = {
    module.SPEC.name: module.SPEC
    for module in (cyclictest_verbose, cyclictest_json, cyclictest_hist, jitterdebugger, rtla_timerlat, column)
}


def import_file(results: Path, format_name: str, path: Path, options: ImportOptions | None = None, *,
                name: str | None = None, config: str | None = None) -> dict:
    """Parse one foreign file and write it as an ``imported`` run; returns the manifest."""
    spec = IMPORTERS.get(format_name)
    if spec is None:
        raise InputError(f"import format {format_name!r}: expected one of {', '.join(IMPORTERS)}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: file not found")
    imported = spec.parse(path, options or ImportOptions())
    run = new_run(results, name or path.stem)
    manifest = {
        "name": name or path.name,
        "source": "imported",
        "value_field": "latency_ns",
        "params": {"format": format_name, "file": str(path.resolve())},
        "config": config,
        "system": {**imported.meta.get("system", {}), "warnings": imported.warnings},
        **{k: v for k, v in imported.meta.items() if k != "system"},
    }
    return write_run(run, imported.table, manifest, histogram=imported.histogram,
                     group_by="cpu")
