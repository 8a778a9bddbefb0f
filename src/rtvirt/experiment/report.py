"""An experiment run as the report shows it: its plan's name, description and findings, and the summary of
its records (summary.json as `rtvirt experiment` wrote it, or computed from the records of an interrupted run)."""

from __future__ import annotations

import json
from typing import Any

from ..store import StoredRun
from .records import iter_records
from .summary import summarize

__all__ = ["experiment_section"]


def experiment_section(run: StoredRun) -> dict[str, Any]:
    plan = run.manifest.get("experiment") or {}
    written = run.path / "summary.json"
    summary = json.loads(written.read_text()) if written.exists() and not run.partial else \
        summarize(iter_records(run.path))
    return {"run_id": run.run_id, "name": plan.get("name", run.label), "status": run.manifest.get("status"),
            "description": plan.get("description", ""), "findings": plan.get("findings", []), **summary}
