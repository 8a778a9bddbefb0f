"""The lab's hypervisor: Debian's Xen source built with the real-time schedulers switched on (RTDS, ARINC 653
and null are upstream options that Debian's binary leaves out), cached under the guest image's cache directory."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from ...errors import RunError
from ...fileio import mark_used, prune_cache, write_atomically
from ..guest_image import cache_dir
from .files import _run

__all__ = ["XEN_CONFIG_OPTIONS", "rt_hypervisor"]


# Kconfig options added to Debian's own hypervisor config: the real-time schedulers are "unsupported".
XEN_CONFIG_OPTIONS = ("CONFIG_EXPERT=y", "CONFIG_UNSUPPORTED=y", "CONFIG_SCHED_RTDS=y",
                      "CONFIG_SCHED_ARINC653=y", "CONFIG_SCHED_NULL=y")
PACKAGED_CONFIG_GLOB = "/boot/xen-4.*-amd64.config"
# Xen 4.17's RTDS crashes the hypervisor when the last pCPU of an RTDS cpupool leaves it (cpupool-destroy):
# rt_deinit_pdata -> move_repl_timer reads the cpupool that pCPU has just left (NULL, page fault). The
# lab's hypervisor gets this fix: with no pool left there is no pCPU to move the timer to, so it is killed.
RTDS_FIX = ("xen/common/sched/rt.c",
            """    cpumask_t *online = get_sched_res(old_cpu)->cpupool->res_valid;
    unsigned int new_cpu = cpumask_cycle(old_cpu, online);
""",
            """    const struct cpupool *pool = get_sched_res(old_cpu)->cpupool;
    unsigned int new_cpu = pool ? cpumask_cycle(old_cpu, pool->res_valid) : nr_cpu_ids;
""")


def _packaged_config() -> Path:
    found = sorted(Path("/").glob(PACKAGED_CONFIG_GLOB.lstrip("/")))
    if not found:
        raise RunError("xen lab: no packaged Xen hypervisor config in /boot "
                       "(apt-get install xen-hypervisor-4.17-amd64; scripts/setup.sh does)")
    return found[-1]

def rt_hypervisor() -> Path:
    """The multiboot ELF of a Xen with RTDS, ARINC 653 and null; built on first use (a few minutes)."""
    config = _packaged_config()
    digest = hashlib.sha256(config.read_bytes() + "\n".join((*XEN_CONFIG_OPTIONS, *RTDS_FIX)).encode()).hexdigest()[:16]
    root = cache_dir() / "xen"
    target = root / f"xen-rt-{digest}.elf"
    if target.exists():
        mark_used(target)
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        # apt-get source needs the deb-src entry scripts/setup.sh adds; --download-only + dpkg-source
        # would be the same; this unpacks too. No build dependencies are installed beyond flex/bison.
        _run(["apt-get", "source", "--only-source", "xen"], work, "apt-get source xen", timeout=900)
        trees = [p for p in work.glob("xen-*") if p.is_dir() and (p / "xen" / "Makefile").exists()]
        if not trees:
            raise RunError("xen lab: apt-get source xen unpacked no source tree")
        xen_dir = trees[0] / "xen"
        fixed, before, after = trees[0] / RTDS_FIX[0], RTDS_FIX[1], RTDS_FIX[2]
        source = fixed.read_text()
        if before not in source:
            raise RunError(f"xen lab: {RTDS_FIX[0]} of this Xen source is not the one the RTDS fix is for")
        fixed.write_text(source.replace(before, after))
        text = config.read_text()
        for option in XEN_CONFIG_OPTIONS:
            name = option.split("=")[0]
            text = re.sub(rf"^(# )?{name}[ =].*$\n?", "", text, flags=re.M) + option + "\n"
        (xen_dir / ".config").write_text(text)
        env = {**os.environ, "XEN_TARGET_ARCH": "x86_64"}
        _run(["make", "olddefconfig"], xen_dir, "make olddefconfig", env=env)
        built = (xen_dir / ".config").read_text()
        for option in XEN_CONFIG_OPTIONS:
            if f"\n{option}\n" not in f"\n{built}":
                raise RunError(f"xen lab: the hypervisor config refused {option}")
        _run(["make", f"-j{os.cpu_count() or 1}"], xen_dir, "building the hypervisor", env=env)
        elf = xen_dir / "xen"
        if not elf.exists():
            raise RunError("xen lab: the hypervisor build left no xen/xen")
        write_atomically(target, elf.read_bytes())
        write_atomically(target.with_suffix(".config"), built.encode())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prune_cache(root, "xen-rt-*.elf", target)
    return target
