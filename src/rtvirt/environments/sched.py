"""Scheduling policies for threads we do not run ourselves (vCPU threads, probe threads).

``sched_setattr`` has no libc wrapper, so it is called by number through ctypes; SCHED_DEADLINE needs it.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import PrivilegeError, RunError
from ..units import duration_field

__all__ = ["SchedPolicy", "apply_policy", "thread_ids"]

_SCHED_OTHER, _SCHED_FIFO, _SCHED_DEADLINE = 0, 1, 6
_SYS_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}
_libc = ctypes.CDLL(None, use_errno=True)


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64)]


class SchedPolicy(BaseModel):
    """``other``; ``fifo`` with ``priority``; or ``deadline`` with ``runtime`` / ``period`` (deadline = period)."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["other", "fifo", "deadline"] = "other"
    priority: int = Field(1, ge=1, le=99, description="SCHED_FIFO priority")
    runtime: duration_field("us") | None = None  # type: ignore[valid-type]
    period: duration_field("us") | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _deadline_needs_budget(self) -> SchedPolicy:
        if self.policy == "deadline":
            if self.runtime is None or self.period is None:
                raise ValueError("policy 'deadline' needs both runtime and period")
            if not 1024 <= self.runtime <= self.period:
                raise ValueError("deadline runtime must be at least 1.024us and not exceed the period")
        elif self.runtime is not None or self.period is not None:
            raise ValueError(f"runtime/period only apply to policy 'deadline', not '{self.policy}'")
        return self

    def describe(self) -> str:
        if self.policy == "fifo":
            return f"fifo:{self.priority}"
        if self.policy == "deadline":
            return f"deadline:{self.runtime}/{self.period}ns"
        return "other"


def apply_policy(tid: int, policy: SchedPolicy) -> None:
    """Set ``policy`` on thread ``tid``; refusals say which thread and why."""
    number = _SYS_SCHED_SETATTR.get(platform.machine())
    if number is None:
        raise RunError(f"sched_setattr: unsupported architecture {platform.machine()}")
    attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr))
    if policy.policy == "fifo":
        attr.sched_policy, attr.sched_priority = _SCHED_FIFO, policy.priority
    elif policy.policy == "deadline":
        attr.sched_policy = _SCHED_DEADLINE
        attr.sched_runtime = policy.runtime or 0
        attr.sched_deadline = attr.sched_period = policy.period or 0
    else:
        attr.sched_policy = _SCHED_OTHER
    if _libc.syscall(number, tid, ctypes.byref(attr), 0) != 0:
        errno = ctypes.get_errno()
        message = f"thread {tid}: cannot set scheduling policy {policy.describe()}: {os.strerror(errno)}"
        if errno == 1 and policy.policy == "deadline" and os.geteuid() == 0:
            raise RunError(message + " (the kernel admits SCHED_DEADLINE only for threads free to run on every CPU "
                                     "of their root domain: leave them unpinned or give them an exclusive cpuset)")
        if errno == 1:  # EPERM
            raise PrivilegeError(message + " (needs root or CAP_SYS_NICE)")
        if errno == 16:  # EBUSY: deadline admission control refused the bandwidth
            raise RunError(message + " (SCHED_DEADLINE admission control: not enough bandwidth left)")
        raise RunError(message)


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []
