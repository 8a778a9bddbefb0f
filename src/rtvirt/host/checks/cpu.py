"""The CPUs themselves: SMT siblings sharing a core with a real-time CPU, and the clock source."""

from __future__ import annotations

from .base import US, HostContext, Item, Step, cpu_list, parse_list

FAMILY = "cpu"

CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0/current_clocksource"


def check(ctx: HostContext) -> list[Item]:
    paths = {cpu: f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list" for cpu in ctx.rt_cpus}
    values = ctx.read(*paths.values())
    siblings = sorted({s for cpu, path in paths.items() for s in (parse_list(values[path]) or ())
                       if s != cpu and s not in ctx.rt_cpus})
    known = any(values[p] is not None for p in paths.values())
    clock = ctx.one(CLOCKSOURCE)
    return [
        Item("smt-siblings", FAMILY, "no other work on the real-time CPUs' SMT siblings",
             "unknown" if not known else ("not-ready" if siblings else "ok"),
             f"sibling CPU(s) {cpu_list(siblings)} run other work" if siblings else "no busy siblings",
             "siblings offline or also reserved",
             "SMT siblings share the core's pipeline and caches: a busy sibling slows the real-time thread",
             f"echo 0 > /sys/devices/system/cpu/cpuN/online for each of {cpu_list(siblings) or 'them'}, or nosmt "
             "at boot", "runtime", 100 * US),
        Item("clocksource", FAMILY, "time read without a trap (TSC clocksource)",
             "unknown" if clock is None else ("ok" if clock.strip() in ("tsc", "arch_sys_counter") else "not-ready"),
             clock or "unreadable", "tsc", "a slower clock source (hpet, acpi_pm, a paravirtual one) makes every "
             "timestamp and timer read cost microseconds", "tsc=reliable at boot when the TSC is invariant "
             "(clocksource=tsc)", "boot", 100 * US),
    ]


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return []  # taking a CPU offline changes what the user's work may use: advised, never done
