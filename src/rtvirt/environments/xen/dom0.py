"""xl in one dom0 (this machine's or a lab's, through its transport), shared by every run of a campaign:
commands, ``xl info``, domains, cpupools, and what a killed campaign left behind."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from ...errors import CommandTimeout, RunError
from .dom0_image import hvm_archive
from .files import A653_TOOL, VIF_SCRIPT, a653_tool, local_domu_files
from .lab import XenLab
from .local import _bring_cpus_online

if TYPE_CHECKING:
    from ...remote.transport import HostTransport

NAME_PREFIX = "rtvirt-"
DEFAULT_POOL = "Pool-0"
RUN_DIR = "/run/rtvirt"
XL_TIMEOUT_S = 120.0
# a status read (the console, whether a domain exists) waits this long at first, then twice as long after each
# time dom0 did not answer in time, up to PATIENT_MAX_S: a dom0 slowed by the load under test is not a failure
PATIENT_FIRST_S = 30.0
PATIENT_MAX_S = 240.0
POOL_DESTROY_S = 30.0


class Dom0:
    """xl in one dom0 (local or a lab's), shared by every run of a campaign."""

    def __init__(self, transport: HostTransport, lab: XenLab | None, kernel: str, initramfs: str,
                 arch: str = "x86_64") -> None:
        self.transport = transport
        self.lab = lab
        self.arch = arch  # its domUs' architecture
        # (guest kernel flavour, HVM) -> (kernel, initramfs) in dom0; a lab's image holds linux's for PV and PVH
        self._domu: dict[tuple[str, bool], tuple[str, str]] = {("linux", False): (kernel, initramfs)}
        self._hvm_ready = False
        self._count = 0
        self._info: str | None = None
        self.restore_dom0_vcpus: int | None = None
        self.vif_script = VIF_SCRIPT  # in the lab's dom0 image; a local dom0 gets it installed (_open_dom0)
        self.slow_answers = 0  # status reads dom0 did not answer in time (patient_run)
        self._patience = PATIENT_FIRST_S

    def a653_command(self) -> str:
        """The ARINC 653 schedule tool: in the lab's dom0 image, else the one built with the agents."""
        if self.lab is not None:
            return A653_TOOL
        return str(a653_tool())

    def domu_files(self, flavour: str, mode: str) -> tuple[str, str]:
        """(kernel, initramfs) in dom0 of a ``mode`` domU with the flavour's guest kernel
        (files.local_domu_files); copied into a lab's dom0 on first use (its image holds linux's for PV and PVH
        only: the others would cost every lab boot their size)."""
        key = (flavour, mode == "hvm")
        if key not in self._domu:
            kernel, initramfs = local_domu_files(flavour, mode, self.arch)
            if self.lab is None:
                self._domu[key] = (str(kernel), str(initramfs))
            else:
                directory = f"{RUN_DIR}/domu-{flavour}"
                self.run(["mkdir", "-p", directory]).check("xen: dom0 mkdir")
                self.transport.put(kernel, f"{directory}/{kernel.name}")
                self.transport.put(initramfs, f"{directory}/base.cpio")
                self._domu[key] = (f"{directory}/{kernel.name}", f"{directory}/base.cpio")
        return self._domu[key]

    def hvm_support(self) -> None:
        """The device model and firmware HVM domUs need: a Xen host has them (qemu-system-xen); a lab's dom0 gets
        them on first use (dom0_image.hvm_archive, unpacked by busybox tar)."""
        if self.lab is None or self._hvm_ready:
            return
        self.transport.run(["tar", "-x", "-f", "-", "-C", "/"], timeout=600, input=hvm_archive()).check(
            "xen: copying the HVM device model into the lab's dom0")
        self._hvm_ready = True

    def next_index(self) -> int:
        self._count += 1
        return self._count

    def run(self, argv: list[str], timeout: float = XL_TIMEOUT_S) -> Any:
        return self.transport.run(argv, timeout=timeout)

    def patient_run(self, argv: list[str]) -> Any | None:
        """A read-only status command whose answer can wait: None when dom0 did not answer within this read's
        bound, which then doubles for the next read (the caller keeps what it knew and asks again; the run's
        own watchdog bounds the whole). Counted in ``slow_answers``."""
        try:
            result = self.run(argv, timeout=self._patience)
        except CommandTimeout:
            self.slow_answers += 1
            self._patience = min(2 * self._patience, PATIENT_MAX_S)
            return None
        self._patience = PATIENT_FIRST_S
        return result

    def xl(self, *args: str, what: str | None = None) -> str:
        result = self.run(["xl", *args])
        if result.returncode != 0:
            said = " ".join((result.stderr or result.stdout).split())[-300:] or f"status {result.returncode}"
            raise RunError(f"xl {what or args[0]}: {said}")
        return str(result.stdout)

    def cpu_khz(self) -> int | None:
        """The TSC rate Xen measured (``xl info`` cpu_mhz, to the kHz)."""
        match = re.search(r"^cpu_mhz\s*:\s*(\d+(?:\.\d+)?)", self.info(), re.M)
        return round(float(match.group(1)) * 1000) if match else None

    def info(self) -> str:
        if self._info is None:
            self._info = self.xl("info")[:8192]
        return self._info

    def domains(self) -> list[str]:
        return [line.split()[0] for line in self.xl("list").splitlines()[1:] if line.split()]

    def pools(self) -> dict[str, tuple[int, ...]]:
        """cpupool name -> its pCPUs."""
        pools: dict[str, tuple[int, ...]] = {}
        for line in self.xl("cpupool-list", "-c").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 2:
                pools[fields[0]] = tuple(int(c) for c in re.findall(r"\d+", fields[1])) if fields[1] != "any" else ()
        return pools

    def destroy_pool(self, name: str) -> None:
        cpus = self.pools().get(name, ())
        # a destroyed domain leaves its pool only once Xen has finished tearing it down
        deadline = time.monotonic() + POOL_DESTROY_S
        while (result := self.run(["xl", "cpupool-destroy", name])).returncode != 0:
            if time.monotonic() > deadline:
                said = " ".join((result.stderr or result.stdout).split())[-300:]
                raise RunError(f"xl cpupool-destroy {name}: {said or f'status {result.returncode}'}")
            time.sleep(0.5)
        for cpu in cpus:
            self.xl("cpupool-cpu-add", DEFAULT_POOL, str(cpu))

    def reclaim(self) -> list[str]:
        """Destroy domains and cpupools with rtvirt's prefix and stop its tracers (left by a killed campaign)."""
        from ...explain.xen import reclaim_xentrace

        removed = reclaim_xentrace(self.transport)
        for name in self.domains():
            if name.startswith(NAME_PREFIX):
                self.xl("destroy", name)
                removed.append(f"domain {name}")
        for name in self.pools():
            if name.startswith(NAME_PREFIX):
                self.destroy_pool(name)
                removed.append(f"cpupool {name}")
        return removed

    def close(self) -> None:
        if self.restore_dom0_vcpus is not None:
            self.run(["xl", "vcpu-set", "0", str(self.restore_dom0_vcpus)])
            if self.lab is None:
                _bring_cpus_online(self.restore_dom0_vcpus)
        self.transport.close()
        if self.lab is not None:
            self.lab.close()
