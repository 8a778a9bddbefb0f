"""Interrupts: device IRQs routed away from the real-time CPUs, and nothing that moves them back."""

from __future__ import annotations

from .base import US, HostContext, Item, Step, cpu_list, hex_mask, parse_hex_mask, parse_list, running

FAMILY = "irq"


def _irq_affinities(ctx: HostContext) -> dict[str, str | None]:
    irqs = sorted(ctx.view.glob("/proc/irq", "[0-9]*", 4096), key=lambda p: int(p.rsplit("/", 1)[1]))
    paths = [f"{irq}/smp_affinity_list" for irq in irqs]
    return ctx.read(*paths, limit=256)


def _on_rt(ctx: HostContext, value: str | None) -> bool:
    cpus = parse_list(value)
    return cpus is not None and bool(set(cpus) & set(ctx.rt_cpus))


def check(ctx: HostContext) -> list[Item]:
    rt, housekeeping = cpu_list(ctx.rt_cpus), cpu_list(ctx.housekeeping)
    affinities = _irq_affinities(ctx)
    on_rt = sorted(path.split("/")[3] for path, value in affinities.items() if _on_rt(ctx, value))
    owners = running(ctx, "irqbalance")
    items = [Item("irq-affinity", FAMILY, "device interrupts kept off the real-time CPUs",
                  "ok" if not on_rt else "not-ready",
                  f"{len(on_rt)} of {len(affinities)} IRQs may run on CPU(s) {rt}" + (
                      f" ({', '.join(on_rt[:12])}{', ...' if len(on_rt) > 12 else ''})" if on_rt else ""),
                  f"every IRQ on {housekeeping or 'the other CPUs'}",
                  "an interrupt handler preempts the real-time task for its whole run, and its softirq work may "
                  "follow", f"rtvirt host tune --profile realtime-host --cpus {rt} (writes /proc/irq/*/"
                  f"smp_affinity_list = {housekeeping}); per-CPU IRQs (timers, IPIs) cannot move", "runtime", 100 * US,
                  owners[0] if owners else None)]
    default = ctx.one("/proc/irq/default_smp_affinity")
    default_cpus = parse_hex_mask(default) if default else None
    items.append(Item("default-irq-affinity", FAMILY, "new interrupts start off the real-time CPUs",
                      "unknown" if default_cpus is None else (
                          "not-ready" if set(default_cpus) & set(ctx.rt_cpus) else "ok"),
                      f"default_smp_affinity {default or 'unreadable'}", f"mask {hex_mask(ctx.housekeeping)}",
                      "an IRQ requested later (a VM's passthrough device, a new NIC queue) starts with this mask",
                      f"echo {hex_mask(ctx.housekeeping)} > /proc/irq/default_smp_affinity (rtvirt host tune does)",
                      "runtime", 100 * US))
    items.append(Item("irqbalance", FAMILY, "no IRQ balancer moving interrupts back", "not-ready" if owners else "ok",
                      "irqbalance is running" if owners else "not running", "stopped, or told to avoid the RT CPUs",
                      "irqbalance rewrites IRQ affinities every 10 s and may put them back on the real-time CPUs",
                      f"systemctl stop irqbalance, or set IRQBALANCE_BANNED_CPULIST={rt} in /etc/default/irqbalance",
                      "runtime", 100 * US, owners[0] if owners else None))
    return items


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    if not ctx.housekeeping:
        return []
    housekeeping = cpu_list(ctx.housekeeping)
    result = []
    if "irq-affinity" in wanted:
        result += [Step("irq-affinity", path, housekeeping) for path, value in _irq_affinities(ctx).items()
                   if _on_rt(ctx, value)]
    if "default-irq-affinity" in wanted:
        result.append(Step("default-irq-affinity", "/proc/irq/default_smp_affinity", hex_mask(ctx.housekeeping)))
    return result
