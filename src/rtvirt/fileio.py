"""Writing files that readers (the catalog, the report, --resume) must never see half-written."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it into place.

    A process killed at any instant (kill -9, power loss) leaves the old file or the new one.
    """
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
