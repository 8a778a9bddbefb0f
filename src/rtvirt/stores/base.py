"""The results store as the commands see it: where new runs are written, which runs exist, and the per-run
rows (provenance and statistics) that history and regression questions are answered from.

Two implementations: :class:`LocalStore` (a results directory, the embedded default) and the shared store
(rtvirt.stores.postgres: a PostgreSQL catalog with the run directories on shared storage). Both hold runs in the
run-directory format of rtvirt.store; a shared store's writers fill a local spool and deliver from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InputError
from .provenance import configuration, run_row

if TYPE_CHECKING:  # rtvirt.store imports numpy and pyarrow: `rtvirt trend` on a shared store needs neither
    from ..store import StoredRun

__all__ = ["RunStore", "LocalStore", "Delivery", "resolve_in"]


@dataclass
class Delivery:
    """What one delivery from a spool did."""

    delivered: list[str] = field(default_factory=list)  # run ids now in the store
    already: list[str] = field(default_factory=list)  # in the store before (a retry): not added again
    kept: list[str] = field(default_factory=list)  # still in the spool
    error: str | None = None  # why the rest stayed in the spool

    def as_dict(self) -> dict[str, Any]:
        return {"delivered": self.delivered, "already_there": self.already, "still_spooled": self.kept,
                "error": self.error}


class RunStore(Protocol):
    """What every results store offers the commands."""

    label: str  # names the store in messages: a path, or a URL without its password
    write_dir: Path  # where producers write new runs (a results directory: the store itself, or its spool)
    shared: bool

    def list_runs(self) -> list[StoredRun]: ...

    def find_run(self, run_id: str) -> StoredRun | None: ...

    def rows(self, *, config: str | None = None, machine: str | None = None,
             identity: str | None = None) -> list[dict[str, Any]]:
        """One row per run (rtvirt.stores.provenance.COLUMNS), oldest first, optionally of one configuration
        label, machine and identity (comparable runs: rtvirt.identity)."""
        ...

    def deliver(self, keep: bool = False) -> Delivery: ...


class LocalStore:
    """A results directory: runs are written into it and read from it; nothing to deliver."""

    shared = False

    def __init__(self, path: Path) -> None:
        self.write_dir = Path(path)
        self.label = str(path)

    def list_runs(self) -> list[StoredRun]:
        from ..store import list_runs

        return list_runs(self.write_dir)

    def find_run(self, run_id: str) -> StoredRun | None:
        from ..store import load_run

        if "/" in run_id or run_id in ("", ".", ".."):
            return None
        directory = self.write_dir / "runs" / run_id
        return load_run(directory) if (directory / "manifest.json").is_file() else None

    def rows(self, *, config: str | None = None, machine: str | None = None,
             identity: str | None = None) -> list[dict[str, Any]]:
        rows = [run_row(run.manifest) for run in self.list_runs()]
        return [row for row in rows if (config is None or configuration(row) == config)
                and (machine is None or row["machine"] == machine)
                and (identity is None or row["identity"] == identity)]

    def deliver(self, keep: bool = False) -> Delivery:
        return Delivery()


def resolve_in(spec: str, store: RunStore) -> list[StoredRun]:
    """A run directory or manifest on this machine, or a run id of ``store``."""
    from ..store import resolve_runs

    path = Path(spec)
    if (path / "manifest.json").exists() or path.name == "manifest.json" or (path / "runs").is_dir():
        return resolve_runs(path)
    found = store.find_run(spec)
    if found is None:
        raise InputError(f"{spec}: not a run directory, manifest or run id of {store.label}")
    if found.failed:
        reason = str((found.manifest.get("campaign") or {}).get("reason") or "no reason recorded")[:300]
        raise InputError(f"{spec}: this run failed without samples ({reason})")
    return [found]
