"""The simulation model: physical CPUs, a hypervisor scheduler, VMs with vCPUs, guest schedulers, tasks, event
chains, background load and gap probes (docs/model.md). Times accept unit suffixes; bare numbers are in ms."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ..params import CpuList
from ..units import duration_field

__all__ = [
    "HV_SCHEDULERS", "GUEST_SCHEDULERS", "SERVERS", "Ms", "Name", "Overheads", "CreditParams", "FairParams",
    "Arinc653Params", "Enforcement", "Hypervisor", "Window", "VCpu", "Execution", "Task", "Gap", "Vm", "Chain",
    "Simulation", "Model",
]

HvScheduler = Literal["partitioned", "fifo", "rtds", "sedf", "sedf-prime", "psedf", "credit", "arinc653", "deadline",
                      "fair"]
GuestScheduler = Literal["fp", "edf", "fifo"]
Server = Literal["none", "deferrable", "periodic", "work-conserving-periodic", "slack-stealing-periodic"]
HV_SCHEDULERS: tuple[str, ...] = get_args(HvScheduler)
GUEST_SCHEDULERS: tuple[str, ...] = get_args(GuestScheduler)
SERVERS: tuple[str, ...] = get_args(Server)

if TYPE_CHECKING:  # checkers see the validated value: nanoseconds
    Ms = int
else:
    Ms = duration_field("ms")
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,40}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Overheads(_Strict):
    context_switch: Ms = Field(0, description="guest task switch inside a vCPU")
    vm_switch: Ms = Field(0, description="pCPU switching from one vCPU to another")
    interrupt_delay: Ms = Field(0, description="event delivery delay: source to driver, VM to VM")


class CreditParams(_Strict):
    slice: Ms = 30_000_000
    accounting: Ms = 10_000_000
    rate_limit: Ms = 1_000_000


class FairParams(_Strict):
    slice: Ms = 4_000_000


class Arinc653Params(_Strict):
    major_frame: Ms = Field(gt=0)


class Enforcement(_Strict):
    tick: Ms = Field(0, ge=0, description="deadline: runtimes are checked only at this periodic tick (Linux without "
                                          "HRTICK_DL), so a server overruns up to the next tick and pays the "
                                          "overrun back; 0 = enforced exactly")
    phase: Ms = Field(0, ge=0, description="time of the first tick; servers start their first period at 0")
    resume_jitter: Ms = Field(0, ge=0, description="a replenished server resumes after a wake-up latency drawn "
                                                   "uniformly from [0, resume_jitter]")
    resume_latencies: list[Ms] = Field(default_factory=list, max_length=1000,
                                       description="instead of resume_jitter: the latency drawn from these "
                                                   "values with equal chance (a measured distribution's quantiles)")


class Hypervisor(_Strict):
    scheduler: HvScheduler
    pcpus: int = Field(1, ge=1, le=64)
    quantum: Ms = Field(0, description="scheduler tick: preemptions wait for the next tick; 0 = event-driven")
    server: Server = "none"
    mode: Literal["global", "partitioned"] = "global"
    overheads: Overheads = Overheads.model_validate({})
    credit: CreditParams = CreditParams.model_validate({})
    fair: FairParams = FairParams.model_validate({})
    arinc653: Arinc653Params | None = None
    enforcement: Enforcement = Enforcement.model_validate({})


class Window(_Strict):
    start: Ms
    length: Ms = Field(gt=0)


class VCpu(_Strict):
    affinity: CpuList | None = None
    priority: int = Field(0, ge=0, le=1000, description="fifo / psedf: larger runs first")
    budget: Ms | None = None
    period: Ms | None = None
    extratime: bool = False
    slice: Ms | None = None
    rt: bool = False
    weight: int | None = Field(None, ge=1, le=65535)
    cap: float = Field(0, ge=0, le=100, description="credit: % of one CPU per accounting period, 0 = none")
    runtime: Ms | None = None
    deadline: Ms | None = None
    windows: list[Window] = []


class Execution(_Strict):
    distribution: Literal["uniform", "normal"]
    min: Ms
    max: Ms
    mean: Ms | None = None
    stdev: Ms | None = None


class Task(_Strict):
    name: Name
    vcpu: int = Field(0, ge=0)
    type: Literal["periodic", "sporadic", "event"] = "periodic"
    period: Ms | None = None
    min_interarrival: Ms | None = None
    max_interarrival: Ms | None = None
    offset: Ms = 0
    jitter: Ms = 0
    execution: Ms | Execution
    priority: int = Field(0, ge=0, le=1000, description="fp guest: larger runs first")
    deadline: Ms | None = None


class Gap(_Strict):
    vcpu: int = Field(0, ge=0)
    threshold: Ms = 1_000


class Vm(_Strict):
    name: Name
    scheduler: GuestScheduler = "fp"
    vcpu: list[VCpu] = Field(default_factory=lambda: [VCpu.model_validate({})], min_length=1, max_length=64)
    task: list[Task] = []
    load: float = Field(0, ge=0, le=1, description="background utilisation of every vCPU of this VM")
    load_period: Ms = Field(10_000_000, gt=0)
    gap: Gap | None = None


class Chain(_Strict):
    name: Name
    period: Ms = Field(gt=0)
    jitter: Ms = 0
    offset: Ms = 0
    deadline: Ms | None = None
    stages: list[str] = Field(min_length=1, max_length=16, description='"vm/task" of event tasks, in order')


class Simulation(_Strict):
    duration: Ms = Field(1_000_000_000, gt=0)
    seed: int = Field(1, ge=0, le=2**63 - 1)
    event_cap: int = Field(100_000_000, ge=1)
    supply_window: Ms = Field(10_000_000, gt=0)


class Model(_Strict):
    name: Name = "model"
    simulation: Simulation = Simulation.model_validate({})
    hypervisor: Hypervisor
    vm: list[Vm] = Field(min_length=1, max_length=256)
    chain: list[Chain] = []
