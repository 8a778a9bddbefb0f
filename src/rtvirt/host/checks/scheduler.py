"""The scheduler around the real-time tasks: RT throttling, and load balancing across the real-time CPUs."""

from __future__ import annotations

from .base import MS, US, HostContext, Item, Status, Step, cpu_list

FAMILY = "scheduler"

RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"
RT_PERIOD = "/proc/sys/kernel/sched_rt_period_us"
V1_BALANCE = "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance"
V2_ROOT = "/sys/fs/cgroup/cgroup.controllers"


def check(ctx: HostContext) -> list[Item]:
    rt = cpu_list(ctx.rt_cpus)
    values = ctx.read(RT_RUNTIME, RT_PERIOD, V1_BALANCE, V2_ROOT)
    runtime, period = values[RT_RUNTIME], values[RT_PERIOD]
    items = [Item("rt-throttling", FAMILY, "no RT throttling cutting a busy real-time task short",
                  "unknown" if runtime is None else ("ok" if runtime.strip() == "-1" else "not-ready"),
                  f"sched_rt_runtime_us {runtime} of {period}" if runtime else "unreadable", "-1 (off)",
                  "real-time tasks together get at most runtime per period; past it they are stopped for the rest of "
                  "the period (50 ms each second by default), a gap a busy real-time loop sees as latency",
                  "sysctl kernel.sched_rt_runtime_us=-1 (rtvirt host tune --profile realtime-virtual-host does; a "
                  "runaway SCHED_FIFO task then owns its CPU)", "runtime", 50 * MS)]
    isolated = set(ctx.rt_cpus) <= set(_isolated(ctx))
    balance = values[V1_BALANCE]
    status: Status
    if isolated:
        found, status = f"CPU(s) {rt} isolated from load balancing (isolcpus)", "ok"
    elif values[V2_ROOT] is not None:
        found, status = "cgroup v2: a cpuset partition root is made per run by partition environments", "ok"
    elif balance is not None:
        found = f"cgroup v1 root cpuset sched_load_balance {balance}"
        status = "ok" if balance.strip() == "0" else "not-ready"
    else:
        found, status = "no cpuset hierarchy found", "unknown"
    items.append(Item("load-balancing", FAMILY, "the real-time CPUs are a scheduling domain of their own", status,
                      found, "isolcpus=domain, or an exclusive cpuset without load balancing above it",
                      "load balancing pulls tasks onto an idle real-time CPU, and SCHED_DEADLINE refuses tasks pinned "
                      "to fewer CPUs than their root domain", f"partition environments make one per run (cgroup v1: "
                      "exclusive cpuset, sched_load_balance 0 on the root; v2: cpuset.cpus.partition root); for "
                      f"everything: isolcpus=domain,{rt} at boot", "runtime", 100 * US))
    return items


def _isolated(ctx: HostContext) -> tuple[int, ...]:
    from .base import parse_list

    value = ctx.one("/sys/devices/system/cpu/isolated")
    return parse_list(value) or ()


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return [Step("rt-throttling", RT_RUNTIME, "-1")] if "rt-throttling" in wanted else []
