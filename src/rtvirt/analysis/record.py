"""Analysis results as a record in the results store (source "analysis", no samples), next to simulated and
measured runs of the same model, so reports can show bound vs simulated vs measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..store import RunDir, new_run, write_run
from .system import SystemAnalysis

__all__ = ["write_analysis_run"]


def write_analysis_run(analysis: SystemAnalysis, results: Path, *, model_path: str,
                       extra: dict[str, Any] | None = None) -> tuple[RunDir, dict[str, Any]]:
    run = new_run(results, f"analysis-{analysis.model}")
    manifest = {
        "name": analysis.model,
        "source": "analysis",
        "status": "complete",
        "params": {"model": model_path, "hypervisor_scheduler": analysis.scheduler},
        "analysis": {**analysis.as_dict(), **(extra or {})},
    }
    return run, write_run(run, None, manifest)
