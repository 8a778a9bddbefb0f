"""Memory management work that stalls tasks: huge page compaction, page merging, swap, NUMA balancing."""

from __future__ import annotations

from .base import MS, HostContext, Item, Step, chosen

FAMILY = "memory"

THP = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"
KSM = "/sys/kernel/mm/ksm/run"
NUMA = "/proc/sys/kernel/numa_balancing"
SWAPS = "/proc/swaps"
SWAPPINESS = "/proc/sys/vm/swappiness"


def check(ctx: HostContext) -> list[Item]:
    v = ctx.read(THP, THP_DEFRAG, KSM, NUMA, SWAPS, SWAPPINESS)
    thp_text, defrag_text, ksm, numa = v[THP], v[THP_DEFRAG], v[KSM], v[NUMA]
    thp, defrag = (chosen(thp_text) if thp_text else None), (chosen(defrag_text) if defrag_text else None)
    swaps = [line for line in (v[SWAPS] or "").splitlines()[1:] if line.strip()]
    return [
        Item("thp", FAMILY, "no transparent huge pages behind the application's back",
             "unknown" if thp is None else ("not-ready" if thp == "always" else "ok"), f"enabled [{thp}]",
             "never (or madvise)", "khugepaged collapses pages and page faults compact memory, stalling the faulting "
             "task for milliseconds", f"echo never > {THP} (rtvirt host tune does), or transparent_hugepage=never at "
             "boot", "runtime", 1 * MS),
        Item("thp-defrag", FAMILY, "no synchronous huge page compaction",
             "unknown" if defrag is None else ("not-ready" if defrag in ("always", "defer+madvise") else "ok"),
             f"defrag [{defrag}]", "never (or madvise, defer)",
             "a fault that compacts memory synchronously waits for it",
             f"echo never > {THP_DEFRAG} (rtvirt host tune does)", "runtime", 1 * MS),
        Item("ksm", FAMILY, "no kernel same-page merging",
             "unknown" if ksm is None else ("ok" if ksm.strip() == "0" else "not-ready"), f"ksm run {ksm}",
             "0", "ksmd scans memory and turns merged pages copy-on-write: the next write faults",
             f"echo 0 > {KSM} (rtvirt host tune does; 2 also unmerges)", "runtime", 1 * MS),
        Item("swap", FAMILY, "no swap under real-time memory", "not-ready" if swaps else "ok",
             f"{len(swaps)} swap area(s), swappiness {v[SWAPPINESS]}", "no swap, or the RT tasks' memory locked",
             "a swapped-out page costs a disk read at its next touch", "swapoff -a, or mlockall() in the real-time "
             "application (rtvirt's probes lock their memory)", "runtime", 10 * MS),
        Item("numa-balancing", FAMILY, "no automatic NUMA balancing",
             "unknown" if numa is None else ("ok" if numa.strip() == "0" else "not-ready"),
             f"numa_balancing {numa}" if numa else "not in this kernel", "0",
             "NUMA balancing unmaps pages to sample accesses: the task takes hinting faults",
             "sysctl kernel.numa_balancing=0 (rtvirt host tune does)", "runtime", 1 * MS),
    ]


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    table = {"thp": (THP, "never", chosen), "thp-defrag": (THP_DEFRAG, "never", chosen), "ksm": (KSM, "0", None),
             "numa-balancing": (NUMA, "0", None)}
    return [Step(item, path, value, restore_as) for item, (path, value, restore_as) in table.items()
            if item in wanted and ctx.one(path) is not None]
