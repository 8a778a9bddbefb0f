"""Where the compiled C agents live.

The build installs them as package data (rtvirt/_bin); in an editable install that directory sits in
site-packages rather than beside the sources, so the distribution's file list is the authority.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata
from pathlib import Path

from .errors import RunError

__all__ = ["AGENTS", "agent_path"]

AGENTS = ("rtvirt-probe", "rtvirt-stress")


@cache
def _installed_agents() -> dict[str, Path]:
    try:
        files = metadata.files("rtvirt") or []
    except metadata.PackageNotFoundError:
        return {}
    return {f.name: Path(str(f.locate())) for f in files if f.parent.name == "_bin" and f.name in AGENTS}


def agent_path(name: str) -> Path:
    """Path of agent ``name``; $RTVIRT_AGENT_DIR overrides (e.g. a cross-built set for a guest)."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}")
    override = os.environ.get("RTVIRT_AGENT_DIR")
    path = Path(override) / name if override else _installed_agents().get(name)
    if path is None or not os.access(path, os.X_OK):
        raise RunError(f"the native agent {name} is missing ({path or 'not installed'}); "
                       "run `make setup` so that it is compiled")
    return path
