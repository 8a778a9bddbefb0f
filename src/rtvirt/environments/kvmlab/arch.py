"""What a KVM lab of one architecture boots: everything that differs between architectures, in one place
(an arm64 lab is another entry of ``LAB_ARCHES``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LAB_ARCHES", "LabArch"]


@dataclass(frozen=True)
class LabArch:
    name: str  # as rtvirt names architectures (agents, KvmLabConfig.arch)
    debian_arch: str  # the root file system's Debian architecture (mmdebstrap --architectures)
    qemu: str  # the emulator that runs the lab here
    machine: str
    tcg_cpu: str  # a CPU model whose emulation offers hardware virtualisation to the lab's kernel
    console: str  # the lab kernel's serial console
    kernel_flavour: str  # guest_image.KERNEL_PACKAGES: the Debian kernel the lab boots (and its modules)
    qemu_package: str  # the Debian package of the lab's own QEMU (run by libvirtd in the lab)
    lab_qemu: str  # that QEMU's binary in the lab
    kvm_modules: tuple[str, ...]  # loaded in this order; the last is the one the manifest names
    machine_modules: tuple[str, ...]  # the lab's disk, file system and network


# Under TCG, -cpu max carries AMD's SVM and nested paging (NPT): Debian's kvm-amd loads ("Nested Virtualization
# enabled", "Nested Paging enabled") and /dev/kvm appears (measured: /work/shared/kvm-lab.md)
X86_64 = LabArch(
    name="x86_64", debian_arch="amd64", qemu="qemu-system-x86_64", machine="q35", tcg_cpu="max",
    console="ttyS0", kernel_flavour="linux", qemu_package="qemu-system-x86", lab_qemu="qemu-system-x86_64",
    kvm_modules=("irqbypass", "kvm", "ccp", "kvm_amd"),
    machine_modules=("virtio_pci", "virtio_blk", "virtio_net", "crc32c_generic", "ext4"))

LAB_ARCHES = {X86_64.name: X86_64}
