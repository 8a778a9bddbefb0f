"""Atomic writes and the caches of built images that several checkouts share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rtvirt.fileio import KEEP_NEWEST, RECENT_USE_S, mark_used, prune_cache


def _aged(path: Path, seconds_ago: float) -> Path:
    path.write_bytes(b"x")
    os.utime(path, (time.time() - seconds_ago, time.time() - seconds_ago))
    return path


def test_pruning_keeps_the_builds_other_checkouts_used_lately(tmp_path: Path) -> None:
    # another checkout's image, used a minute ago, was deleted under a dom0 about to read it (a clean-clone run
    # beside other worktrees): only builds unused for an hour beyond the newest few go
    current = _aged(tmp_path / "initramfs-current.cpio", 0)
    recent = [_aged(tmp_path / f"initramfs-recent{i}.cpio", 60 + i) for i in range(KEEP_NEWEST + 2)]
    stale = [_aged(tmp_path / f"initramfs-stale{i}.cpio", RECENT_USE_S * 2 + i) for i in range(3)]
    other_flavour = _aged(tmp_path / "initramfs-rt-old.cpio", RECENT_USE_S * 3)
    undeletable = tmp_path / "initramfs-dir.cpio"
    undeletable.mkdir()  # unlink fails on it, as on a read-only cache: best effort, no error
    os.utime(undeletable, (0, 0))
    prune_cache(tmp_path, "initramfs-*.cpio", current, lambda p: not p.name.startswith("initramfs-rt-"))
    assert current.exists() and all(p.exists() for p in recent) and other_flavour.exists() and undeletable.exists()
    assert not any(p.exists() for p in stale)
    # once nobody used them for an hour, the newest few are kept and the rest go
    for path in recent:
        os.utime(path, (time.time() - RECENT_USE_S * 2, time.time() - RECENT_USE_S * 2 - recent.index(path)))
    prune_cache(tmp_path, "initramfs-*.cpio", current, lambda p: not p.name.startswith("initramfs-rt-"))
    assert [p.exists() for p in recent] == [True] * (KEEP_NEWEST - 1) + [False] * 3
    mark_used(recent[-1])  # gone: marking it does not raise
    mark_used(current)  # a use is a fresh mtime
    assert time.time() - current.stat().st_mtime < 60


WRITER = """
import sys
from pathlib import Path
from rtvirt.fileio import write_atomically
path, fill = Path(sys.argv[1]), sys.argv[2].encode()
for _ in range(30):
    write_atomically(path, fill * 2_000_000)
"""


def test_two_processes_writing_one_path_each_leave_a_whole_file(tmp_path: Path) -> None:
    # test workers building the same guest image wrote one shared "<name>.tmp": one truncated the other's
    target = tmp_path / "image.cpio"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), fill]) for fill in ("a", "b")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    data = target.read_bytes()
    assert data in (b"a" * 2_000_000, b"b" * 2_000_000)
    assert [p.name for p in tmp_path.iterdir()] == ["image.cpio"]  # no temporary file left
