"""mix: the COTS study's reference load, 10 cpu + 10 mem workers (agents/stressors/mix.c)."""

from __future__ import annotations

from pydantic import ByteSize, Field, model_validator

from ..params import cli
from .base import StressorSpec, StressParams
from .mem import BLOCK_DEFAULT


class MixParams(StressParams):
    cpu_workers: int = Field(10, ge=0, le=512, description="sqrt-spinning workers")
    mem_workers: int = Field(10, ge=0, le=512, description="malloc/touch/free workers")
    block: ByteSize = Field(BLOCK_DEFAULT, ge=4096, le=1 << 40,  # type: ignore[assignment]
                            description="bytes per mem worker cycle", json_schema_extra=cli(metavar="BYTES"))

    @model_validator(mode="after")
    def _worker_counts(self) -> MixParams:
        if self.workers:
            raise ValueError("--workers does not apply to mix; use --cpu-workers and --mem-workers")
        if not self.cpu_workers and not self.mem_workers:
            raise ValueError("--cpu-workers and --mem-workers are both 0: nothing to run")
        return self

    def worker_count(self) -> int:
        return self.cpu_workers + self.mem_workers


def _stress_ng(params: MixParams, workers: int) -> list[str]:
    args = ["--cpu", str(params.cpu_workers), "--cpu-method", "sqrt"] if params.cpu_workers else []
    if params.mem_workers:
        args += ["--vm", str(params.mem_workers), "--vm-bytes", str(int(params.block))]
    return args


STRESSOR = StressorSpec(
    name="mix",
    summary="the reference load: 10 sqrt + 10 malloc/touch/free (64 MiB) workers",
    params=MixParams,
    represents="the COTS-hypervisor study's load (testing profiles TP3-TP6): 20 workers, 10 spinning on sqrt "
               "and 10 doing malloc/free of 64 MB blocks, to overload all cores",
    stress_ng=_stress_ng,
    cli_exclude=("workers",),
)
