"""io: write, fsync, drop from cache and read back a nameless file (agents/stressors/io.c)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ByteSize, Field, field_validator

from ..params import cli
from .base import StressorSpec, StressParams


class IoParams(StressParams):
    path: Path = Field(Path("/var/tmp"), description="directory for the work files (a disk, not tmpfs, for real I/O)",
                       json_schema_extra=cli(metavar="DIR"))
    size: ByteSize = Field(16 << 20, ge=4096, le=1 << 40,  # type: ignore[assignment]
                           description="bytes written and read back per cycle and worker",
                           json_schema_extra=cli(metavar="BYTES"))

    @field_validator("path")
    @classmethod
    def _writable_directory(cls, path: Path) -> Path:
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{str(path)[:200]!r} is not a writable directory")
        return path


def _stress_ng(params: IoParams, workers: int) -> list[str]:
    return ["--hdd", str(workers), "--hdd-bytes", str(int(params.size)), "--hdd-opts", "wr-seq,rd-seq,fsync",
            "--temp-path", str(params.path)]


STRESSOR = StressorSpec(
    name="io",
    summary="write, fsync, drop from cache and read back a nameless file in --path",
    params=IoParams,
    represents="the disk-heavy neighbour the studies list as wanted next: block I/O, journal commits and "
               "completion interrupts",
    stress_ng=_stress_ng,
)
