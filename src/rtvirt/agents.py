"""Where the compiled C agents live.

The build installs them as package data (rtvirt/_bin); in an editable install that directory sits in
site-packages rather than beside the sources, so the distribution's file list is the authority.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from .errors import InputError, PrivilegeError, RunError

__all__ = ["AGENTS", "agent_path", "agent_args", "agent_failure"]

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


def agent_args(params: BaseModel) -> list[str]:
    """Render validated parameters as the agent's ``--name=value`` options (never through a shell)."""
    args = []
    for name, value in params.model_dump(exclude={"rt"}).items():
        if value is None:
            continue
        if isinstance(value, bool):
            rendered = "1" if value else "0"
        elif isinstance(value, (tuple, list)):
            rendered = ",".join(str(v) for v in value)
        else:
            rendered = str(value)
        args.append(f"--{name.replace('_', '-')}={rendered}")
    return args


def agent_failure(status: int, stderr: str) -> Exception:
    """The exception an agent's exit status and last stderr line stand for (2: bad input or privilege)."""
    message = stderr.strip().splitlines()[-1] if stderr.strip() else f"agent exited with status {status}"
    message = message.removeprefix("rtvirt-agent: ")
    if status == 2:
        if "priority" in message or "mlockall" in message:
            return PrivilegeError(message)
        return InputError(message)
    return RunError(message)
