"""Where the compiled C agents live.

The build installs them as package data (rtvirt/_bin); in an editable install that directory sits in
site-packages rather than beside the sources, so the distribution's file list is the authority.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from .errors import InputError, PrivilegeError, RunError

__all__ = ["AGENTS", "BAREMETAL_KERNEL", "XEN_A653", "CROSS_COMPILERS", "native_arch", "agent_path", "agent_args",
           "agent_failure"]

AGENTS = ("rtvirt-probe", "rtvirt-stress", "rtvirt-trace")  # rtvirt-trace: a Linux guest's trace relay
# Our own x86_64 guest kernel (agents/baremetal), installed beside the agents but never copied into a guest.
BAREMETAL_KERNEL = "rtvirt-baremetal"
# Sets Xen's ARINC 653 schedules (agents/xen), built only where libxenctrl's headers are; runs in a dom0.
XEN_A653 = "rtvirt-a653"


# Architectures cross-built beside the native agents (in _bin/<arch>/), with the Debian package that builds them.
CROSS_COMPILERS = {"aarch64": "gcc-aarch64-linux-gnu"}


def native_arch() -> str:
    machine = platform.machine()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)


@cache
def _installed_agents() -> dict[tuple[str, str], Path]:
    """(architecture, name) -> path: the native set in _bin, cross-built sets in _bin/<arch>."""
    try:
        files = metadata.files("rtvirt") or []
    except metadata.PackageNotFoundError:
        return {}
    found = {}
    for f in files:
        if f.name not in (*AGENTS, BAREMETAL_KERNEL, XEN_A653):
            continue
        if f.parent.name == "_bin":
            found[(native_arch(), f.name)] = Path(str(f.locate()))
        elif f.parent.parent.name == "_bin":
            found[(f.parent.name, f.name)] = Path(str(f.locate()))
    return found


def agent_path(name: str, arch: str | None = None) -> Path:
    """Path of agent ``name`` built for ``arch`` (default: this machine's); $RTVIRT_AGENT_DIR overrides
    the native set (e.g. a cross-built set for a guest)."""
    if name not in (*AGENTS, BAREMETAL_KERNEL, XEN_A653):
        raise ValueError(f"unknown agent {name!r}")
    arch = arch or native_arch()
    override = os.environ.get("RTVIRT_AGENT_DIR")
    path = Path(override) / name if override and arch == native_arch() else _installed_agents().get((arch, name))
    if path is None or not os.access(path, os.X_OK):
        if arch != native_arch():
            package = CROSS_COMPILERS.get(arch)
            hint = (f"install {package} and run `make setup`" if package
                    else f"rtvirt builds agents for {native_arch()} and {', '.join(CROSS_COMPILERS)} only")
            raise RunError(f"no {arch} build of the agent {name} ({path or 'not installed'}): {hint}")
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
