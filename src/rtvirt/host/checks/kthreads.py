"""Kernel housekeeping work: unbound workqueues and kthreads, the lockup watchdog, timers, vmstat updates."""

from __future__ import annotations

from .base import MS, US, HostContext, Item, Step, cpu_list, hex_mask, parse_hex_mask, parse_list

FAMILY = "kthreads"

WORKQUEUE = "/sys/devices/virtual/workqueue/cpumask"
WATCHDOG = "/proc/sys/kernel/watchdog_cpumask"
TIMER_MIGRATION = "/proc/sys/kernel/timer_migration"
STAT_INTERVAL = "/proc/sys/vm/stat_interval"


def _kthreads_on_rt(ctx: HostContext) -> list[str]:
    """Unbound kernel threads (children of kthreadd that may run on more than one CPU) allowed on the RT CPUs."""
    statuses = ctx.view.read_many([f"{p}/status" for p in ctx.view.glob("/proc", "[0-9]*", 8192)], 2048)
    found = []
    for status in statuses.values():
        fields = dict(line.split(":", 1) for line in (status or "").splitlines() if ":" in line)
        if fields.get("PPid", "").strip() != "2":
            continue
        allowed = parse_list(fields.get("Cpus_allowed_list", "").strip())
        if allowed and len(allowed) > 1 and set(allowed) & set(ctx.rt_cpus):
            found.append(fields.get("Name", "?").strip()[:32])
    return sorted(found)


def check(ctx: HostContext) -> list[Item]:
    rt, housekeeping = cpu_list(ctx.rt_cpus), cpu_list(ctx.housekeeping)
    values = ctx.read(WORKQUEUE, WATCHDOG, TIMER_MIGRATION, STAT_INTERVAL)
    items = []
    mask = values[WORKQUEUE]
    items.append(Item("workqueue-cpumask", FAMILY, "unbound workqueues off the real-time CPUs",
                      "unknown" if mask is None else (
                          "not-ready" if set(parse_hex_mask(mask)) & set(ctx.rt_cpus) else "ok"),
                      f"cpumask {mask}" if mask else "no writable workqueue cpumask",
                      f"mask {hex_mask(ctx.housekeeping)}",
                      "unbound kworkers (writeback, deferred frees, many drivers) run wherever the mask allows and "
                      "preempt a SCHED_OTHER task or delay the CPU's return to the real-time one",
                      f"echo {hex_mask(ctx.housekeeping)} > {WORKQUEUE} (rtvirt host tune does)", "runtime", 100 * US))
    kthreads = _kthreads_on_rt(ctx)
    items.append(Item("kthread-affinity", FAMILY, "unbound kernel threads off the real-time CPUs",
                      "ok" if not kthreads else "not-ready",
                      f"{len(kthreads)} unbound kthreads allowed on {rt}" + (
                          f" ({', '.join(kthreads[:8])}{', ...' if len(kthreads) > 8 else ''})" if kthreads else ""),
                      f"allowed on {housekeeping or 'the other CPUs'} only",
                      "a kthread woken on the real-time CPU runs there before the task it preempts gets the CPU back",
                      f"isolcpus=domain,{rt} at boot, or for a run: a partition environment with shield = true "
                      f"(moves movable tasks and kthreads to {housekeeping or 'the other CPUs'}); tuna -c {rt} -i "
                      "does the same by hand", "runtime", 100 * US))
    watchdog = values[WATCHDOG]
    watched = parse_list(watchdog)
    items.append(Item("watchdog-cpumask", FAMILY, "no lockup watchdog on the real-time CPUs",
                      "unknown" if watched is None else ("not-ready" if set(watched) & set(ctx.rt_cpus) else "ok"),
                      f"watchdog_cpumask {watchdog}" if watchdog else "unreadable", housekeeping or "-",
                      "the soft-lockup watchdog's per-CPU thread and hrtimer wake on every watched CPU every few "
                      "seconds", f"sysctl kernel.watchdog_cpumask={housekeeping} (rtvirt host tune does), or "
                      "nosoftlockup at boot", "runtime", 100 * US))
    migration = values[TIMER_MIGRATION]
    items.append(Item("timer-migration", FAMILY, "timers stay on the CPU that armed them",
                      "unknown" if migration is None else ("ok" if migration.strip() == "0" else "not-ready"),
                      f"timer_migration {migration}" if migration else "unreadable", "0",
                      "with migration on, an idle CPU's timers are pulled to (and expire on) a busy one, possibly a "
                      "real-time CPU", "sysctl kernel.timer_migration=0 (rtvirt host tune does)", "runtime", 100 * US))
    interval = values[STAT_INTERVAL]
    items.append(Item("vm-stat-interval", FAMILY, "rare vmstat updates",
                      "unknown" if interval is None else (
                          "ok" if interval.strip().isdigit() and int(interval) >= 10 else "not-ready"),
                      f"stat_interval {interval}s" if interval else "unreadable", ">= 10 s",
                      "the vmstat_update work item runs on every CPU each interval", "sysctl vm.stat_interval=10 "
                      "(rtvirt host tune does)", "runtime", 1 * MS))
    return items


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    if not ctx.housekeeping:
        return []
    table = {"workqueue-cpumask": (WORKQUEUE, hex_mask(ctx.housekeeping)),
             "watchdog-cpumask": (WATCHDOG, cpu_list(ctx.housekeeping)),
             "timer-migration": (TIMER_MIGRATION, "0"), "vm-stat-interval": (STAT_INTERVAL, "10")}
    return [Step(item, path, value) for item, (path, value) in table.items() if item in wanted]
