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
from ..guest_image import DEBIAN_ARCHES, _unpacked_package, apt_name, arch_cache
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


# how Xen's build names each architecture, the cross compiler it is built with here, and the hypervisor file
# QEMU boots (x86: the multiboot ELF; arm64: the Image-like binary, as Debian's xen-4.17-arm64)
BUILD_ARCHES = {"x86_64": ("x86_64", None, "elf"), "aarch64": ("arm64", "aarch64-linux-gnu-", "image")}


def _packaged_config(arch: str) -> Path:
    """Debian's own hypervisor config: the installed package's for x86_64, the arm64 package's (downloaded and
    unpacked, not installed) for aarch64."""
    if arch == "x86_64":
        found = sorted(Path("/").glob(PACKAGED_CONFIG_GLOB.lstrip("/")))
        if not found:
            raise RunError("xen lab: no packaged Xen hypervisor config in /boot "
                           "(apt-get install xen-hypervisor-4.17-amd64; scripts/setup.sh does)")
        return found[-1]
    package = f"xen-hypervisor-4.17-{DEBIAN_ARCHES[arch]}"
    tree = _unpacked_package(arch_cache(arch) / package, apt_name(package, arch), arch, "boot/xen-4.*.config")
    return sorted(tree.glob("boot/xen-4.*.config"))[-1]


def rt_hypervisor(arch: str = "x86_64") -> Path:
    """The hypervisor QEMU boots for an ``arch`` lab: Xen with RTDS, ARINC 653 and null, built from Debian's source
    with Debian's config on first use (a few minutes; arm64 cross-compiled with gcc-aarch64-linux-gnu)."""
    target_arch, cross, kind = BUILD_ARCHES[arch]
    config = _packaged_config(arch)
    recipe = "\n".join((*XEN_CONFIG_OPTIONS, *RTDS_FIX)) + (f"\n{target_arch} {cross}" if cross else "")
    digest = hashlib.sha256(config.read_bytes() + recipe.encode()).hexdigest()[:16]
    root = arch_cache(arch) / "xen"
    target = root / f"xen-rt-{digest}.{kind}"
    if target.exists():
        mark_used(target)
        return target
    env = {**os.environ, "XEN_TARGET_ARCH": target_arch, **({"CROSS_COMPILE": cross} if cross else {})}
    if cross and shutil.which(f"{cross}gcc") is None:
        raise RunError(f"xen lab: the {arch} hypervisor is cross-compiled with {cross}gcc (apt-get install "
                       "gcc-aarch64-linux-gnu; scripts/setup.sh arm does)")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        xen_dir = _build(work, config, env)
        write_atomically(target, (xen_dir / "xen").read_bytes())
        write_atomically(target.with_suffix(".config"), (xen_dir / ".config").read_bytes())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    prune_cache(root, f"xen-rt-*.{kind}", target)
    return target


def _build(work: Path, config: Path, env: dict[str, str]) -> Path:
    """Debian's Xen source unpacked in ``work``, the RTDS fix applied, Debian's config with our options, the
    hypervisor built: the source's ``xen`` directory, which holds it (``xen``) and its ``.config``."""
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
    _run(["make", "olddefconfig"], xen_dir, "make olddefconfig", env=env)
    built = (xen_dir / ".config").read_text()
    for option in XEN_CONFIG_OPTIONS:
        if f"\n{option}\n" not in f"\n{built}":
            raise RunError(f"xen lab: the hypervisor config refused {option}")
    _run(["make", f"-j{os.cpu_count() or 1}"], xen_dir, "building the hypervisor", env=env)
    if not (xen_dir / "xen").exists():
        raise RunError("xen lab: the hypervisor build left no xen/xen")
    return xen_dir
