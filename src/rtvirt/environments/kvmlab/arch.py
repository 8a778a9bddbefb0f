"""What a KVM lab of one architecture boots: everything that differs between architectures, in one place
(``LAB_ARCHES``, keyed by the environment's ``arch``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AARCH64", "LAB_ARCHES", "LabArch", "X86_64"]


@dataclass(frozen=True)
class LabArch:
    name: str  # as rtvirt names architectures (agents, the environments' ``arch``)
    debian_arch: str  # the root file system's Debian architecture (mmdebstrap --architectures)
    qemu: str  # the emulator that runs the lab here
    machine: str
    tcg_cpu: str  # a CPU model whose emulation offers hardware virtualisation to the lab's kernel
    console: str  # the lab kernel's serial console
    kernel_flavour: str  # guest_image.KERNEL_PACKAGES: the Debian kernel the lab boots (and its modules)
    qemu_package: str  # the Debian package of the lab's own QEMU (run by libvirtd in the lab)
    lab_qemu: str  # that QEMU's binary in the lab
    kvm_modules: tuple[str, ...]  # loaded in this order; the last is the one the manifest names (none: built in)
    machine_modules: tuple[str, ...]  # the lab's disk, file system and network
    excluded: tuple[str, ...] = ()  # more files the root leaves out (the lab's QEMU package's other emulators)
    gic_version: int | None = None  # the emulated board's interrupt controller (Arm)

    @property
    def kvm_name(self) -> str:
        """How the manifest names the lab's KVM: its module, or the kernel's built-in KVM."""
        return self.kvm_modules[-1].replace("_", "-") if self.kvm_modules else "kvm (built in)"

    def emulated(self, accel: str) -> str:
        """What QEMU emulates for the lab, for every run's manifest."""
        if accel == "kvm":
            return f"QEMU {self.machine} with this host's CPU (KVM)"
        gic = f", GICv{self.gic_version}" if self.gic_version else ""
        return f"QEMU {self.machine.split(',')[0]} board, CPU {self.tcg_cpu}{gic}, emulated by TCG"


# Under TCG, -cpu max carries AMD's SVM and nested paging (NPT): Debian's kvm-amd loads ("Nested Virtualization
# enabled", "Nested Paging enabled") and /dev/kvm appears (measured: /work/shared/kvm-lab.md)
X86_64 = LabArch(
    name="x86_64", debian_arch="amd64", qemu="qemu-system-x86_64", machine="q35", tcg_cpu="max",
    console="ttyS0", kernel_flavour="linux", qemu_package="qemu-system-x86", lab_qemu="qemu-system-x86_64",
    kvm_modules=("irqbypass", "kvm", "ccp", "kvm_amd"),
    machine_modules=("virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4"))

# The guest-isolation study's board (a Raspberry Pi 4: Cortex-A72, GIC-400): QEMU's virt board with EL2
# (virtualization=on) and a GICv2; Debian's arm64 kernel starts at EL2 with its built-in KVM ("Hyp mode
# initialized successfully", vgic-v2). qemu-system-arm's 32-bit emulator stays out of the root: libvirtd would
# probe it at every start.
AARCH64 = LabArch(
    name="aarch64", debian_arch="arm64", qemu="qemu-system-aarch64", machine="virt,virtualization=on,gic-version=2",
    tcg_cpu="cortex-a72", console="ttyAMA0", kernel_flavour="linux", qemu_package="qemu-system-arm",
    lab_qemu="qemu-system-aarch64", kvm_modules=(),
    machine_modules=("virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4"),
    excluded=("/usr/bin/qemu-system-arm",), gic_version=2)

LAB_ARCHES = {X86_64.name: X86_64, AARCH64.name: AARCH64}
