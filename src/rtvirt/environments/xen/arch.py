"""What a Xen lab of one architecture boots and how QEMU boots it: everything that differs between architectures, in
one place (``XEN_LAB_ARCHES``, keyed by the environment's ``arch``).

x86_64: QEMU's PC with AMD's SVM and nested paging, Xen by multiboot with dom0's kernel and initramfs as its
modules, dom0 a busybox initramfs (dom0_image.py). aarch64: the guest-isolation study's board (Cortex-A72, GICv2) as
QEMU's virt board with EL2, Xen as the kernel and dom0's kernel and initramfs put in memory by QEMU's guest-loader
(Xen finds them in the device tree), dom0 a Debian arm64 root on a virtio disk (dom0_root.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import RunError

__all__ = ["XEN_LAB_ARCHES", "XenLabArch"]


@dataclass(frozen=True)
class XenLabArch:
    name: str  # as rtvirt names architectures (agents, the environments' ``arch``)
    debian_arch: str
    qemu: str
    machine: str | None  # None: QEMU's default machine
    tcg_cpu: str  # a CPU model whose emulation Xen and its dom0 run on (with hardware virtualisation for domUs)
    xen_console: str  # Xen's own console options
    dom0_console: str  # dom0 kernel's console options
    extra_xen_options: str = ""
    gic_version: int | None = None

    def emulated(self, accel: str) -> str:
        """What QEMU emulates for the lab, for every run's manifest and warnings."""
        if accel == "kvm":
            return f"QEMU {self.machine or 'pc'} with this host's CPU (KVM)"
        gic = f", GICv{self.gic_version}" if self.gic_version else ""
        return f"QEMU {(self.machine or 'pc').split(',')[0]} board, CPU {self.tcg_cpu}{gic}, emulated by TCG"

    def boot_args(self, hypervisor: Path, xen_options: str, kernel: Path, initrd: Path,
                  root_disk: Path | None) -> list[str]:
        """QEMU's arguments that load Xen, dom0's kernel (with its command line) and its initramfs, and dom0's root
        disk if it has one (copy-on-write: the cached image is never written)."""
        for path in (kernel, initrd, *((root_disk,) if root_disk else ())):
            if "," in str(path):
                raise RunError(f"xen lab: QEMU cannot take a path with a comma: {path}")
        dom0_line = f"{self.dom0_console} rdinit=/init quiet"
        xen_line = f"{self.xen_console} {xen_options} {self.extra_xen_options}".strip()
        if self.name == "x86_64":  # multiboot: dom0's kernel and initramfs are Xen's modules
            return ["-kernel", str(hypervisor), "-append", xen_line, "-initrd", f"{kernel} {dom0_line},{initrd}"]
        # Arm: guest-loader puts them in memory and tells Xen in the device tree (above Xen, below the initramfs)
        args = ["-machine", str(self.machine), "-kernel", str(hypervisor), "-append", xen_line,
                "-device", f"guest-loader,addr={DOM0_KERNEL_ADDRESS:#x},kernel={kernel},bootargs={dom0_line}",
                "-device", f"guest-loader,addr={DOM0_INITRD_ADDRESS:#x},initrd={initrd}"]
        if root_disk is not None:
            args += ["-drive", f"file={root_disk},format=raw,if=none,id=root,snapshot=on",
                     "-device", "virtio-blk-device,drive=root"]
        return args

    @property
    def net_device(self) -> str:
        """dom0's network card: virtio-net on PCI (x86), on virtio-mmio (Arm: a device-tree node Xen hands dom0)."""
        return "virtio-net-pci" if self.name == "x86_64" else "virtio-net-device"


# the virt board's RAM starts at 1 GiB: dom0's kernel (Debian's arm64 Image, 33 MB) 144 MiB above it, its
# initramfs (the domUs' kernel and initramfs inside: about 50 MB) 256 MiB above it
DOM0_KERNEL_ADDRESS = 0x49000000
DOM0_INITRD_ADDRESS = 0x50000000

# TCG: qemu64 (-cpu max faults the PV dom0) with AMD's nested paging (+npt): Xen's HVM side needs it for PVH/HVM
# domUs (Debian's Xen has no shadow paging)
X86_64 = XenLabArch(name="x86_64", debian_arch="amd64", qemu="qemu-system-x86_64", machine=None,
                    tcg_cpu="qemu64,+npt", xen_console="console=com1 com1=115200", dom0_console="console=hvc0",
                    extra_xen_options="noreboot")
# measured: /work/shared/kvm-lab.md ("DOM0 UP ... xen 4.17" in 4.6 s under TCG)
AARCH64 = XenLabArch(name="aarch64", debian_arch="arm64", qemu="qemu-system-aarch64",
                     machine="virt,virtualization=on,gic-version=2", tcg_cpu="cortex-a72",
                     xen_console="console=dtuart dtuart=/pl011@9000000", dom0_console="console=hvc0 earlycon=xen",
                     gic_version=2)

XEN_LAB_ARCHES = {X86_64.name: X86_64, AARCH64.name: AARCH64}
