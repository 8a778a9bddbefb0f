"""Which dom0 a scenario runs in (this Xen host's, or a lab booted for it) and opening it once per campaign."""

from __future__ import annotations

from pathlib import Path

from ...errors import RunError
from ...remote.local import LocalTransport
from ..base import SharedResources
from ..lab_machine import LabMachine, booted, open_lab
from .config import XenConfig
from .dom0 import RUN_DIR, Dom0
from .dom0_image import DOMU_INITRAMFS, DOMU_KERNEL
from .files import VIF_HOTPLUG, local_domu_files
from .lab import XenLab
from .local import _console_log_problem, is_dom0
from .xl import _vcpu_list


def _open_dom0(config: XenConfig, shared: SharedResources) -> Dom0:
    if _resolve_where(config) == "lab":
        def boot(earlier: list[str]) -> Dom0:
            lab = booted(XenLab(config.lab, config.dom0_vcpus, shared.supervisor, config.arch, earlier))
            return Dom0(lab.connection, lab, DOMU_KERNEL, DOMU_INITRAMFS, config.arch)

        def lab_of(dom0: Dom0) -> LabMachine:
            assert dom0.lab is not None
            return dom0.lab
        return open_lab(shared, config.lab.key(config.dom0_vcpus, config.arch), boot, lab_of)

    def local() -> Dom0:
        problem = _console_log_problem()
        if problem:
            raise RunError(problem)
        kernel, initramfs = local_domu_files()
        dom0 = Dom0(LocalTransport(shared.supervisor, "dom0"), None, str(kernel), str(initramfs))
        # a Xen host has no rtvirt-vif among its hotplug scripts: install ours where rtvirt keeps its files
        script = Path(RUN_DIR) / "rtvirt-vif"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(VIF_HOTPLUG)
        script.chmod(0o755)
        dom0.vif_script = str(script)
        # offline vCPUs are listed too (state "--p")
        online = sum("p" not in vcpu["state"] for vcpu in _vcpu_list(dom0.xl("vcpu-list", "0")))
        if online != config.dom0_vcpus:
            dom0.xl("vcpu-set", "0", str(config.dom0_vcpus))
            dom0.restore_dom0_vcpus = online
        return dom0
    return shared.get(f"xen-dom0:{config.dom0_vcpus}", local)

def _resolve_where(config: XenConfig) -> str:
    if config.where == "auto":
        return "dom0" if is_dom0() else "lab"
    return config.where
