"""mix: the COTS study's reference load, 10 cpu + 10 mem workers (agents/stressors/mix.c)."""

from __future__ import annotations

from pydantic import ByteSize, Field, model_validator

from ..params import cli
from .base import StressorSpec, StressParams
from .mem import BLOCK_DEFAULT

REFERENCE_WORKERS = 10  # of each kind, as in the study


class MixParams(StressParams):
    """``workers`` counts each kind (as stress-ng counts per stressor); 0 means the study's 10."""

    cpu_workers: int | None = Field(None, ge=0, le=512,
                                    description="sqrt-spinning workers (none: as --workers, else 10)")
    mem_workers: int | None = Field(None, ge=0, le=512,
                                    description="malloc/touch/free workers (none: as --workers, else 10)")
    block: ByteSize = Field(BLOCK_DEFAULT, ge=4096, le=1 << 40,  # type: ignore[assignment]
                            description="bytes per mem worker cycle", json_schema_extra=cli(metavar="BYTES"))

    @model_validator(mode="after")
    def _worker_counts(self) -> MixParams:
        if self.workers > 512:
            raise ValueError("--workers counts each kind for mix: at most 512")
        if self.counts() == (0, 0):
            raise ValueError("--cpu-workers and --mem-workers are both 0: nothing to run")
        return self

    def counts(self) -> tuple[int, int]:
        """(cpu workers, mem workers) as the agent resolves them."""
        each = self.workers or REFERENCE_WORKERS
        return (each if self.cpu_workers is None else self.cpu_workers,
                each if self.mem_workers is None else self.mem_workers)

    def worker_count(self) -> int:
        return sum(self.counts())


def _stress_ng(params: MixParams, workers: int) -> list[str]:
    cpu, mem = params.counts()
    args = ["--cpu", str(cpu), "--cpu-method", "sqrt"] if cpu else []
    if mem:
        args += ["--vm", str(mem), "--vm-bytes", str(int(params.block))]
    return args


STRESSOR = StressorSpec(
    name="mix",
    summary="the reference load: 10 sqrt + 10 malloc/touch/free (64 MiB) workers",
    params=MixParams,
    represents="the COTS-hypervisor study's load (testing profiles TP3-TP6): 20 workers, 10 spinning on sqrt "
               "and 10 doing malloc/free of 64 MB blocks, to overload all cores; --workers N gives N of each",
    stress_ng=_stress_ng,
)
