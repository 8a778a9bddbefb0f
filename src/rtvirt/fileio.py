"""Writing files that readers (the catalog, the report, --resume) must never see half-written, the caches of
built images that several checkouts of rtvirt may share, and freeing what was read of a file that keeps growing."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomically", "prune_cache", "mark_used", "free_range"]

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


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def _libc_fallocate() -> Callable[..., int] | None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        fallocate = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).fallocate
        fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
        fallocate.restype = ctypes.c_int
        return fallocate  # type: ignore[no-any-return]
    return None


_fallocate = _libc_fallocate()


def free_range(fd: int, start: int, end: int) -> str | None:
    """Give the blocks of bytes [start, end) of an open file back to the file system, its length unchanged (a trace
    streamed into a file and read as it grows: what was read need not stay on disk). Python has no binding for
    Linux's hole punching (fallocate's FALLOC_FL_PUNCH_HOLE), hence libc's through ctypes. Returns why it could
    not (a file system without hole punching), or None."""
    if end <= start:
        return None
    if _fallocate is None:
        return "this C library has no fallocate"
    if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
        return os.strerror(ctypes.get_errno())
    return None
