"""Power management: CPU frequency scaling, idle states, and the PM QoS latency limit."""

from __future__ import annotations

from .base import US, HostContext, Item, Step, cpu_list

FAMILY = "power"

DEEP_US = 10  # idle states slower than this to leave are "deep"
PM_QOS = "/dev/cpu_dma_latency"


def pm_qos_limit_us() -> int | None:
    """The CPU latency limit now in force (PM QoS), in us; None where unreadable (not root, no device)."""
    try:
        with open(PM_QOS, "rb") as f:
            raw = f.read(4)
    except OSError:
        return None
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 4 else None


def _governors(ctx: HostContext) -> dict[int, str | None]:
    paths = {cpu: f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor" for cpu in ctx.rt_cpus}
    values = ctx.read(*paths.values())
    return {cpu: values[path] for cpu, path in paths.items()}


def _deep_states(ctx: HostContext) -> list[tuple[int, str, str]]:
    """(cpu, state directory, name) of enabled idle states of the RT CPUs slower than DEEP_US to leave."""
    found = []
    for cpu in ctx.rt_cpus:
        for state in ctx.view.glob(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle", "state*", 16):
            values = ctx.read(f"{state}/name", f"{state}/latency", f"{state}/disable")
            latency = (values[f"{state}/latency"] or "0").strip()
            if latency.isdigit() and int(latency) > DEEP_US and (values[f"{state}/disable"] or "0").strip() == "0":
                found.append((cpu, state, f"{values[f'{state}/name']} ({latency} us)"))
    return found


def check(ctx: HostContext) -> list[Item]:
    rt = cpu_list(ctx.rt_cpus)
    governors = _governors(ctx)
    known = {cpu: g for cpu, g in governors.items() if g}
    slow = sorted({g for g in known.values() if g != "performance"})
    items = [Item("governor", FAMILY, "CPU frequency fixed at its highest (performance governor)",
                  "unknown" if not known else ("not-ready" if slow else "ok"),
                  ", ".join(sorted(set(known.values()))) if known else "no cpufreq driver (frequency not scaled "
                  "by this kernel; a VM's host may still scale it)", "performance",
                  "a frequency change stalls the CPU for tens of microseconds, and a low frequency slows every path",
                  f"cpupower -c {rt} frequency-set -g performance (rtvirt host tune does)", "runtime", 50 * US)]
    deep = _deep_states(ctx)
    items.append(Item("cstates", FAMILY, "no deep idle states on the real-time CPUs", "not-ready" if deep else "ok",
                      ", ".join(sorted({d[2] for d in deep})) or f"none slower than {DEEP_US} us enabled",
                      f"idle states above {DEEP_US} us exit latency disabled",
                      "leaving a deep C-state adds its exit latency to every wake-up of the real-time task",
                      f"rtvirt host tune disables them (cpuidle stateN/disable = 1 on {rt}); or hold "
                      "/dev/cpu_dma_latency at 0 (tuned does), or limit them at boot", "runtime", 100 * US))
    if ctx.view.label == "local":  # a binary device: read here only
        limit = pm_qos_limit_us()
        items.append(Item("pm-qos", FAMILY, "a PM QoS CPU latency limit held", "unknown" if limit is None else (
                          "ok" if limit <= DEEP_US else "not-ready"),
                          "unreadable" if limit is None else f"cpu_dma_latency {limit} us" + (
                              " (no limit)" if limit >= 2_000_000_000 else ""), f"<= {DEEP_US} us while measuring",
                          "the cpuidle governor picks states whose exit latency fits the limit; without one it may "
                          "pick deep ones on a wake-up path", "a process keeps /dev/cpu_dma_latency open with 0 "
                          "written (tuned does; a campaign's [host] tune does for its duration; rtvirt's probes do "
                          "while they run)", "runtime", 100 * US))
    return items


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    result = []
    if "governor" in wanted:
        result += [Step("governor", f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "performance")
                   for cpu, governor in _governors(ctx).items() if governor and governor != "performance"]
    if "cstates" in wanted:
        result += [Step("cstates", f"{state}/disable", "1") for _, state, _ in _deep_states(ctx)]
    return result
