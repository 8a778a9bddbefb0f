"""Kernel housekeeping work: unbound workqueues and kthreads, the lockup watchdog, timers, vmstat updates."""

from __future__ import annotations

from dataclasses import dataclass

from .base import MS, US, HostContext, Item, Step, affinity_setting, cpu_list, hex_mask, parse_hex_mask, parse_list

FAMILY = "kthreads"

WORKQUEUE = "/sys/devices/virtual/workqueue/cpumask"
WATCHDOG = "/proc/sys/kernel/watchdog_cpumask"
TIMER_MIGRATION = "/proc/sys/kernel/timer_migration"
STAT_INTERVAL = "/proc/sys/vm/stat_interval"


PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000  # per-CPU kthreads and kworkers: the kernel binds them, sched_setaffinity refuses
WORKQUEUES = "/sys/devices/virtual/workqueue"


@dataclass(frozen=True)
class Kthread:
    pid: int
    start_time: str
    name: str
    allowed: tuple[int, ...]
    movable: bool


def kthreads(ctx: HostContext) -> list[Kthread]:
    """Every kernel thread (PF_KTHREAD in /proc/PID/stat) with its allowed CPUs, and whether it may be moved."""
    pids = ctx.view.glob("/proc", "[0-9]*", 8192)
    found = ctx.view.read_many([f"{p}/{f}" for p in pids for f in ("stat", "status")], 2048)
    threads = []
    for proc in pids:
        stat, status = found.get(f"{proc}/stat"), found.get(f"{proc}/status")
        if not stat or not status or ")" not in stat:
            continue
        name, rest = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 1:].split()
        if len(rest) < 20 or not rest[6].isdigit() or not int(rest[6]) & PF_KTHREAD:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        allowed = parse_list(fields.get("Cpus_allowed_list", "").strip()) or ()
        threads.append(Kthread(int(proc.rsplit("/", 1)[1]), rest[19], name[:32], allowed,
                               not int(rest[6]) & PF_NO_SETAFFINITY))
    return threads


def _movable_on_rt(ctx: HostContext) -> list[Kthread]:
    """Kernel threads allowed on an RT CPU that may be moved to a housekeeping one they are allowed on. IRQ threads
    (irq/N-name) are left out: the kernel gives them their IRQ's affinity, which the irq items move."""
    rt, housekeeping = set(ctx.rt_cpus), set(ctx.housekeeping)
    return [k for k in kthreads(ctx) if k.movable and not k.name.startswith("irq/") and set(k.allowed) & rt
            and set(k.allowed) & housekeeping]


def _workqueue_masks(ctx: HostContext) -> dict[str, str | None]:
    """The unbound workqueues' global cpumask and each sysfs-visible workqueue's own (WQ_SYSFS ones)."""
    own = [f"{d}/cpumask" for d in ctx.view.glob(WORKQUEUES, "*", 256) if not d.endswith(("cpumask", "power",
                                                                                          "uevent"))]
    values = ctx.read(*own, WORKQUEUE)
    return {path: value for path, value in values.items() if value is not None or path == WORKQUEUE}


def check(ctx: HostContext) -> list[Item]:
    rt, housekeeping = cpu_list(ctx.rt_cpus), cpu_list(ctx.housekeeping)
    values = ctx.read(WORKQUEUE, WATCHDOG, TIMER_MIGRATION, STAT_INTERVAL)
    items = []
    masks = _workqueue_masks(ctx)
    mask = masks[WORKQUEUE]
    on_rt = [("all unbound" if p == WORKQUEUE else p.split("/")[-2]) for p, m in masks.items()
             if m is not None and set(parse_hex_mask(m)) & set(ctx.rt_cpus)]
    items.append(Item("workqueue-cpumask", FAMILY, "unbound workqueues off the real-time CPUs",
                      "unknown" if mask is None else ("not-ready" if on_rt else "ok"),
                      (f"cpumask {mask.strip()}" + (f"; allowed on {rt}: {', '.join(on_rt[:6])}" if on_rt else "")
                       if mask else "no writable workqueue cpumask"),
                      f"mask {hex_mask(ctx.housekeeping)}",
                      "unbound kworkers (writeback, deferred frees, many drivers) run wherever the mask allows and "
                      "preempt a SCHED_OTHER task or delay the CPU's return to the real-time one",
                      f"echo {hex_mask(ctx.housekeeping)} > {WORKQUEUE} and each {WORKQUEUES}/*/cpumask "
                      "(rtvirt host tune does)", "runtime", 100 * US))
    movable = sorted(k.name for k in _movable_on_rt(ctx))
    items.append(Item("kthread-affinity", FAMILY, "unbound kernel threads off the real-time CPUs",
                      "ok" if not movable else "not-ready",
                      f"{len(movable)} movable kthreads allowed on {rt}" + (
                          f" ({', '.join(movable[:8])}{', ...' if len(movable) > 8 else ''})" if movable else "")
                      + " (per-CPU kthreads, kworkers and IRQ threads are the kernel's to place)",
                      f"allowed on {housekeeping or 'the other CPUs'} only",
                      "a kthread woken on the real-time CPU runs there before the task it preempts gets the CPU back",
                      f"taskset -pc {housekeeping or 'OTHER_CPUS'} PID for each (rtvirt host tune does; tuna -c {rt} "
                      f"-i the same), or isolcpus=domain,{rt} at boot; a partition with shield = true does it for "
                      "one run", "runtime", 100 * US))
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
    found: list[Step] = []
    if "workqueue-cpumask" in wanted:  # each workqueue's own mask first: restored last-first, the global one widens
        masks = _workqueue_masks(ctx)  # again before the workqueues' own masks are put back inside it
        found += [Step("workqueue-cpumask", path, hex_mask(ctx.housekeeping)) for path in masks if path != WORKQUEUE]
        found.append(Step("workqueue-cpumask", WORKQUEUE, hex_mask(ctx.housekeeping)))
    if "kthread-affinity" in wanted:
        housekeeping = set(ctx.housekeeping)
        found += [Step("kthread-affinity", affinity_setting(k.pid, k.start_time),
                       cpu_list(tuple(c for c in k.allowed if c in housekeeping))) for k in _movable_on_rt(ctx)]
    table = {"watchdog-cpumask": (WATCHDOG, cpu_list(ctx.housekeeping)),
             "timer-migration": (TIMER_MIGRATION, "0"), "vm-stat-interval": (STAT_INTERVAL, "10")}
    return found + [Step(item, path, value) for item, (path, value) in table.items() if item in wanted]
