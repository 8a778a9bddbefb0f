"""A lab: one probe on many SSH targets at the same time, each target's run stored on its own, one report.

The targets come from a plain inventory file (TOML)::

    remote_dir = "/var/tmp/rtvirt"          # optional
    [[targets]]
    name = "ecu-a"                          # label in results and the report
    host = "10.0.0.5"                       # or a ~/.ssh/config alias
    user = "root"                           # optional, like port, identity_file, known_hosts, proxy_jump
"""

from __future__ import annotations

import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import InputError, RtvirtError
from ..probes import ProbeSpec
from ..scenario.loader import _error as located_error
from ..store import new_run, write_measured_run
from .agents import REMOTE_DIR_PATTERN, TargetLink
from .probe import DEFAULT_REMOTE_DIR, run_probe_on_target
from .target import SshTargetFields

__all__ = ["Inventory", "InventoryTarget", "LabResult", "load_inventory", "run_lab"]


class InventoryTarget(SshTargetFields):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64, description="label in results")


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    remote_dir: str = Field(DEFAULT_REMOTE_DIR, pattern=REMOTE_DIR_PATTERN)
    targets: list[InventoryTarget] = Field(min_length=1, max_length=256)

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[InventoryTarget]) -> list[InventoryTarget]:
        names = [t.name for t in targets]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"target name {name!r} is used twice")
        return targets


def load_inventory(path: Path) -> Inventory:
    """Read and validate an inventory file; errors name the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"inventory {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return Inventory.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"inventory {path}: not valid TOML ({exc})") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        raise located_error(f"inventory {path}", text, tuple(error["loc"]), error["msg"]) from None


@dataclass
class LabResult:
    """What one target gave: its run (None if it failed before measuring) and why it failed, if it did."""

    name: str
    run_id: str | None = None
    status: str = "failed"
    samples: int = 0
    reason: str = ""


def run_lab(inventory: Inventory, spec: ProbeSpec, params: Any, results: Path) -> list[LabResult]:
    """Run ``spec`` with ``params`` on every target at once; Ctrl-C stops them all (samples kept)."""
    stop = threading.Event()
    leftovers: dict[str, list[str]] = {}

    def clean(target: InventoryTarget) -> None:
        link = TargetLink(target.ssh_target(), inventory.remote_dir)
        try:
            leftovers[target.name] = link.reclaim()
        except RtvirtError:
            pass  # the measurement will say why this target cannot be reached
        finally:
            link.close()

    def one(target: InventoryTarget) -> LabResult:
        outcome = LabResult(target.name)
        run = new_run(results, f"{spec.name}-{target.name}")
        try:
            stream, section = run_probe_on_target(spec, params, run.stream_path, target.ssh_target(),
                                                  remote_dir=inventory.remote_dir, stop=stop, reclaim=False)
            section["leftovers_before"] = leftovers.get(target.name, [])
            manifest = write_measured_run(run, stream, name=f"{spec.name} on {target.name}",
                                          params=params.model_dump(mode="json"), group_by=spec.group_by,
                                          extra={"config": target.name, "target": section,
                                                 **({"error": stream.error} if stream.error else {})})
        except RtvirtError as exc:
            outcome.reason = str(exc)[:500]
            return outcome
        outcome.run_id, outcome.status = run.run_id, manifest["status"]
        outcome.samples = int(stream.records.size)
        if section.get("connection") == "lost":
            outcome.reason = f"connection lost; {section.get('recovered', '')}"
        return outcome

    with ThreadPoolExecutor(max_workers=min(len(inventory.targets), 32), thread_name_prefix="rtvirt-lab") as pool:
        list(pool.map(clean, inventory.targets))  # before any agent starts
        futures = [pool.submit(one, target) for target in inventory.targets]
        try:
            return [future.result() for future in futures]
        except KeyboardInterrupt:
            stop.set()  # every target's agent stops (flushing) and its samples are stored
            return [future.result() for future in futures]
