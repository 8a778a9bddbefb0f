"""NUMA placement: the real-time CPUs' node(s), and whether the memory their work touches can be local to them.

Automatic NUMA balancing is the memory family's; this family reads the topology (``node<N>/cpulist`` and
``node<N>/meminfo`` under ``/sys/devices/system/node``). The functions take that root, so a fake tree shows
the multi-node cases on a one-node machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import US, HostContext, Item, Status, Step, cpu_list, parse_list

FAMILY = "numa"

NODES = "/sys/devices/system/node"


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    memory_kib: int


def read_nodes(ctx: HostContext, root: str = NODES) -> list[Node]:
    """Every NUMA node under ``root`` with its CPUs and memory; empty where the kernel has no NUMA in sysfs."""
    dirs = [d for d in ctx.view.glob(root, "node[0-9]*", 1024) if d.rsplit("node", 1)[1].isdigit()]
    found = ctx.view.read_many([f"{d}/{f}" for d in dirs for f in ("cpulist", "meminfo")], 4096)
    nodes = []
    for d in dirs:
        total = re.search(r"MemTotal:\s*(\d+)", found.get(f"{d}/meminfo") or "")
        nodes.append(Node(int(d.rsplit("node", 1)[1]), parse_list(found.get(f"{d}/cpulist")) or (),
                          int(total.group(1)) if total else 0))
    return sorted(nodes, key=lambda n: n.id)


def placement(ctx: HostContext, root: str = NODES) -> Item:
    """Are the RT CPUs on one node that has memory (so that their work's memory can be local)?"""
    nodes = read_nodes(ctx, root)
    rt = set(ctx.rt_cpus)
    described = "; ".join(f"node{n.id}: CPUs {cpu_list(n.cpus) or '-'}, {n.memory_kib // 1024} MiB"
                          for n in nodes[:8])
    rt_nodes = [n for n in nodes if rt & set(n.cpus)]
    with_memory = [n for n in nodes if n.memory_kib > 0]
    home = rt_nodes[0].id if len(rt_nodes) == 1 else None
    # the node to bind to: the RT CPUs' own if it has memory, else the first that has (the RT CPUs go there)
    local = home if home is not None and rt_nodes[0].memory_kib > 0 else (with_memory[0].id if with_memory else None)
    status: Status
    if not nodes:
        status, found = "unknown", f"no NUMA nodes under {root}"
    elif len(nodes) == 1:
        status, found = "ok", f"one NUMA node ({described}): every allocation is local"
    elif len(rt_nodes) > 1:
        status, found = "not-ready", (f"real-time CPUs {cpu_list(ctx.rt_cpus)} span nodes "
                                      f"{', '.join(str(n.id) for n in rt_nodes)} ({described})")
    elif rt_nodes and rt_nodes[0].memory_kib == 0:
        status, found = "not-ready", (f"real-time CPUs on node{rt_nodes[0].id}, which has no memory: every "
                                      f"allocation is remote ({described})")
    else:
        status, found = "ok", (f"real-time CPUs on node{home} ({described}); bind their work's memory there: the "
                               "default policy allocates on the node a task runs on when it first touches a page")
    node = "N" if local is None else str(local)
    return Item("numa-placement", FAMILY, "real-time CPUs on one NUMA node, their memory on it",
                status, found, "the RT CPUs within one node that has memory, and the RT tasks' / VMs' memory bound "
                "to it", "a remote access costs a cross-node hop (tens to hundreds of ns per cache miss), and a "
                "task or vCPU whose pages sit on another node pays it on every miss",
                f"choose RT CPUs within one node (lscpu -e); bind memory: numactl --cpunodebind={node} "
                f"--membind={node} CMD, libvirt <numatune><memory mode='strict' nodeset='{node}'/></numatune> "
                f"with vCPUs pinned on node{node}, or cpuset.mems={node} in the RT cgroup", "runtime", 10 * US)


def check(ctx: HostContext) -> list[Item]:
    return [placement(ctx)]


def steps(ctx: HostContext, wanted: set[str]) -> list[Step]:
    return []  # where a workload's memory comes from is set where it is started (numactl, libvirt, cgroups)
