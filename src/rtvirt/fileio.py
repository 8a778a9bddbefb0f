"""Writing files that readers (the catalog, the report, --resume) must never see half-written, and the caches of
built images that several checkouts of rtvirt may share."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomically", "prune_cache", "mark_used"]

# a cached build somebody used within this long may still be about to be opened (another checkout, a dom0 that
# reads the cache over a share): never pruned
RECENT_USE_S = 3600
KEEP_NEWEST = 4


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it into place.

    A process killed at any instant (kill -9, power loss) leaves the old file or the new one. The temporary file's
    name is this writer's own, so two processes writing one path (test workers building the same image) each
    rename a whole file into place.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def mark_used(path: Path) -> None:
    """Note that a cached build was just used (its mtime), so that pruning by another checkout keeps it."""
    with contextlib.suppress(OSError):  # a read-only cache (a dom0's share of the host's) is pruned elsewhere
        os.utime(path)


def prune_cache(directory: Path, pattern: str, current: Path, belongs: Callable[[Path], bool] = lambda _: True) -> None:
    """Remove the cached builds matching ``pattern`` (and ``belongs``) beyond the ``KEEP_NEWEST`` most recently
    used, leaving ``current`` and any used within ``RECENT_USE_S``. Best effort: a build that cannot be removed
    (a read-only cache) stays."""
    def used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0

    builds = sorted((p for p in directory.glob(pattern) if p != current and belongs(p)), key=used, reverse=True)
    for old in builds[KEEP_NEWEST - 1:]:
        if time.time() - used(old) > RECENT_USE_S:
            with contextlib.suppress(OSError):
                old.unlink()
