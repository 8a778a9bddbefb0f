"""Boot-time items: the kernel's preemption model and the command line that isolates the real-time CPUs.

None of them can change while the system runs; the fix is a kernel command line (printed whole) and the way to
make it stick (GRUB, grubby, kernel-install). rtvirt never changes the boot configuration itself.
"""

from __future__ import annotations

from .base import US, HostContext, Item, Step, cpu_list, parse_list

FAMILY = "kernel"


def boot_line(ctx: HostContext) -> str:
    """The command line parameters that isolate ``ctx.rt_cpus`` (what ``host check`` tells the user to add)."""
    rt, housekeeping = cpu_list(ctx.rt_cpus), cpu_list(ctx.housekeeping) or "0"
    return (f"isolcpus=managed_irq,domain,{rt} nohz_full={rt} rcu_nocbs={rt} irqaffinity={housekeeping} "
            "rcu_nocb_poll processor.max_cstate=1 intel_idle.max_cstate=0 nosoftlockup tsc=reliable")


def how_to_boot_with(line: str) -> str:
    return (f"add to the kernel command line: {line} — GRUB: append it to GRUB_CMDLINE_LINUX in /etc/default/grub, "
            f"then update-grub (Debian) or grub2-mkconfig -o /boot/grub2/grub.cfg; Fedora/RHEL: grubby "
            f"--update-kernel=ALL --args=\"{line}\"; systemd-boot/kernel-install: append it to /etc/kernel/cmdline and "
            "run kernel-install add; then reboot")


def _listed(value: str | None) -> tuple[int, ...]:
    """The CPUs of a parameter value, flags before the list left out ("managed_irq,domain,1-3" -> 1, 2, 3)."""
    return parse_list(",".join(p for p in (value or "").split(",") if p[:1].isdigit())) or ()


def _covers(value: str | None, cpus: tuple[int, ...]) -> bool:
    listed = _listed(value)
    return bool(listed) and set(cpus) <= set(listed)


def check(ctx: HostContext) -> list[Item]:
    audit = ctx.audit
    rt = cpu_list(ctx.rt_cpus)
    params = {name: value for name, _, value in (p.partition("=") for p in boot_line(ctx).split())}

    def fix(*names: str) -> str:
        wanted = " ".join(f"{n}={params[n]}" if params[n] else n for n in names)
        return f"boot with {wanted} (the whole line, and how: `rtvirt host check` ends with it)"

    items = [Item("preempt-rt", FAMILY, "fully preemptible kernel (PREEMPT_RT)",
                  "ok" if audit["preemption"] == "PREEMPT_RT" else "not-ready", audit["preemption"], "PREEMPT_RT",
                  "without it, kernel code paths with preemption disabled delay the real-time task by up to "
                  "milliseconds", "install a PREEMPT_RT kernel (Debian: linux-image-rt-amd64; RHEL: kernel-rt) and "
                  "boot it", "boot", 100 * US)]
    for key, title, why in (
            ("isolcpus", "real-time CPUs isolated from the scheduler (isolcpus)",
             "other tasks and unbound kernel work stay off isolated CPUs, and no load balancing moves work onto "
             "them"),
            ("nohz_full", "no scheduler tick on the real-time CPUs (nohz_full)",
             "the periodic tick interrupts the real-time task every 1-4 ms; nohz_full stops it while one task runs"),
            ("rcu_nocbs", "RCU callbacks off the real-time CPUs (rcu_nocbs)",
             "RCU callbacks run in softirq on the CPU that queued them, in bursts")):
        value = audit.get(key)
        items.append(Item(key.replace("_", "-"), FAMILY, title, "ok" if _covers(value, ctx.rt_cpus) else "not-ready",
                          str(value or "not set"), f"covers CPU(s) {rt}", why, fix(key), "boot", 50 * US))
    cmdline = audit.get("cmdline") or ""
    irqaffinity = next((t.partition("=")[2] for t in cmdline.split() if t.startswith("irqaffinity=")), None)
    routed = _listed(irqaffinity)
    items.append(Item("irqaffinity", FAMILY, "interrupts start on housekeeping CPUs (irqaffinity)",
                      "ok" if routed and not set(routed) & set(ctx.rt_cpus) else "not-ready",
                      irqaffinity or "not set", f"CPUs outside {rt}",
                      "devices probed at boot get their IRQ affinity from it; without it every IRQ may land on a "
                      "real-time CPU until something moves it", fix("irqaffinity"), "boot", 100 * US))
    limits = [t for t in cmdline.split() if t.startswith(("processor.max_cstate=", "intel_idle.max_cstate=",
                                                          "idle=poll", "idle=halt"))]
    items.append(Item("cstate-limit", FAMILY, "deep C-states limited at boot", "ok" if limits else "not-ready",
                      " ".join(limits) or "not limited",
                      "processor.max_cstate=1 intel_idle.max_cstate=0 (or idle=poll)",
                      "leaving a deep C-state takes tens to hundreds of microseconds; a runtime limit "
                      "(cpu_dma_latency, cpuidle disable) also works but only while it is held",
                      fix("processor.max_cstate", "intel_idle.max_cstate"), "boot", 100 * US))
    return items


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return []  # boot items are never changed by rtvirt: `host check` prints the line to add
