"""The domain XML rtvirt writes (``<cputune>`` with vCPU and emulator pinning and ``vcpusched``, memory
locking, hugepages, NUMA placement, the guest's consoles and channel) and what libvirt dropped of it."""

from __future__ import annotations

import os
import socket
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from ...explain.clocksync import CLOCK_PORT
from ...explain.guest_channel import GUEST_TRACE_PORT
from ...procs import process_start_time
from ..guest_image import COPY_DISK, LINUX_COMMAND_LINE, LINUX_GUEST_PORTS
from ..qemu import ACK_PORT, OUTPUT_PORT
from ..tcg_clock import tsc_kernel_args
from .config import parse_cputune
from .connection import POOL_NAME
from .host import MEMLOCK_OVERHEAD_MIB
from .state import LibvirtDomainState

BAREMETAL_CHANNEL = "org.rtvirt.baremetal.samples"  # the bare-metal guest's stream: port 1 of its virtio-serial

OWNER_NS = "https://github.com/rtvirt/rtvirt/libvirt-owner"
XML_LIMIT = 1 << 16  # characters of the applied domain XML kept in the manifest


@dataclass(frozen=True)
class GuestBoard:
    """What a domain's machine is on one architecture (the environment's ``arch``)."""

    os_type: dict[str, str]  # <os><type>'s attributes
    linux_cmdline: str  # the Linux guest's kernel command line
    acpi: bool  # <features><acpi/>: the guest's poweroff ends the domain (x86; Arm powers off through PSCI)
    gic_version: str | None  # <features><gic version>: a KVM guest's vGIC is of the host's GIC (the lab's: v2)
    baremetal_console_address: str | None  # the bare-metal guest's virtio console's transport (Arm: virtio-mmio)


GUEST_BOARDS = {
    # LINUX_COMMAND_LINE says why each of its words
    "x86_64": GuestBoard({"arch": "x86_64"}, LINUX_COMMAND_LINE,
                         acpi=True, gic_version=None, baremetal_console_address=None),
    # QEMU's virt board (the lab's own machine), its PL011 as the console; the aarch64 bare-metal kernel finds its
    # virtio console on virtio-mmio (it has no PCI driver)
    "aarch64": GuestBoard({"arch": "aarch64", "machine": "virt"}, "console=ttyAMA0 quiet panic=-1",
                          acpi=False, gic_version="2", baremetal_console_address="virtio-mmio"),
}


ET.register_namespace("rtvirt", OWNER_NS)


class LibvirtDomainXml(LibvirtDomainState):
    """Writes the domain's XML and compares it with what libvirt applied."""

    def _accel(self) -> str:
        """QEMU's accelerator behind the chosen domain type (kvm or tcg)."""
        return "kvm" if self._type["type"] == "kvm" else "tcg"

    def _cputune(self) -> ET.Element:
        if self.config.cputune is not None:
            return parse_cputune(self.config.cputune)
        element = ET.Element("cputune")
        if self.config.pin:
            host_cpus = self._host_cpus()
            for vcpu in range(self.config.vcpus):
                ET.SubElement(element, "vcpupin", vcpu=str(vcpu), cpuset=str(host_cpus[vcpu % len(host_cpus)]))
            ET.SubElement(element, "emulatorpin", cpuset=",".join(map(str, self.emulator_cpus())))
        if self.config.vcpu_sched.policy != "other":
            ET.SubElement(element, "vcpusched", vcpus=f"0-{self.config.vcpus - 1}",
                          scheduler=self.config.vcpu_sched.policy, priority=str(self.config.vcpu_sched.priority))
        return element

    def _domain_xml(self, kernel: str, initrd: str | None, with_output: bool) -> str:
        """The domain: a Linux guest when ``initrd`` is given, else the bare-metal one; ``with_output``: a
        measuring guest, whose stream (and explanation channels) the host reads."""
        config = self.config
        root = ET.Element("domain", type=self._type["type"])
        ET.SubElement(root, "name").text = self._name
        ET.SubElement(ET.SubElement(root, "metadata"), f"{{{OWNER_NS}}}owner",
                      host=socket.gethostname()[:64], pid=str(os.getpid()),
                      started=process_start_time(os.getpid()) or "")
        ET.SubElement(root, "memory", unit="MiB").text = str(config.memory)
        ET.SubElement(root, "vcpu", placement="static").text = str(config.vcpus)
        cputune = self._cputune()
        if len(cputune):
            root.append(cputune)
        self._add_memory_placement(root)
        board = GUEST_BOARDS[config.arch]
        self._add_os(root, board, kernel, initrd)
        features = ET.SubElement(root, "features")
        if board.acpi:
            ET.SubElement(features, "acpi")
        if board.gic_version:
            ET.SubElement(features, "gic", version=board.gic_version)
        ET.SubElement(root, "cpu", mode="host-passthrough" if self._type["type"] == "kvm" else "maximum")
        for event in ("on_poweroff", "on_reboot", "on_crash"):
            ET.SubElement(root, event).text = "destroy"
        devices = ET.SubElement(root, "devices")
        ET.SubElement(ET.SubElement(devices, "serial", type="pty"), "target", port="0")
        ET.SubElement(ET.SubElement(devices, "console", type="pty"), "target", type="serial", port="0")
        if initrd is None:
            self._add_baremetal_console(devices, board, with_output)
        else:
            ET.SubElement(devices, "controller", type="virtio-serial", index="0", ports=str(LINUX_GUEST_PORTS))
        if self._copy_volume:  # the guest's own disk: the copy of its stream
            disk = ET.SubElement(devices, "disk", type="volume", device="disk")
            ET.SubElement(disk, "driver", name="qemu", type="raw")
            ET.SubElement(disk, "source", pool=POOL_NAME, volume=self._copy_volume)
            ET.SubElement(disk, "target", dev=COPY_DISK, bus="virtio")
        if with_output and initrd is not None:
            self._add_linux_channels(devices)
        ET.SubElement(devices, "memballoon", model="none")
        return ET.tostring(root, encoding="unicode")

    def _add_memory_placement(self, root: ET.Element) -> None:
        """NUMA nodes, locked guest RAM and huge pages, as configured."""
        config = self.config
        if config.numa_nodes:
            ET.SubElement(ET.SubElement(root, "numatune"), "memory", mode="strict",
                          nodeset=",".join(map(str, config.numa_nodes)))
        if config.memory_locked:
            # libvirt raises QEMU's RLIMIT_MEMLOCK to the hard limit (unlimited without one): guest RAM plus
            # room for QEMU's own allocations
            ET.SubElement(ET.SubElement(root, "memtune"), "hard_limit", unit="MiB").text = str(
                config.memory + MEMLOCK_OVERHEAD_MIB)
        if config.hugepages or config.memory_locked:
            backing = ET.SubElement(root, "memoryBacking")
            if config.hugepages:
                ET.SubElement(backing, "hugepages")
            if config.memory_locked:
                ET.SubElement(backing, "locked")

    def _add_os(self, root: ET.Element, board: GuestBoard, kernel: str, initrd: str | None) -> None:
        """The board, the kernel and its command line: the bare-metal probe's argv, or Linux's with the TSC rate."""
        os_element = ET.SubElement(root, "os")
        ET.SubElement(os_element, "type", dict(board.os_type)).text = "hvm"
        ET.SubElement(os_element, "kernel").text = kernel
        if initrd is None:  # the bare-metal guest: the probe's argv is its command line
            ET.SubElement(os_element, "cmdline").text = self._baremetal_cmdline
        else:
            ET.SubElement(os_element, "initrd").text = initrd
            ET.SubElement(os_element, "cmdline").text = " ".join([board.linux_cmdline, *tsc_kernel_args(
                self.config.arch, self._accel(), self.config.local)])

    @staticmethod
    def _add_baremetal_console(devices: ET.Element, board: GuestBoard, with_output: bool) -> None:
        """The bare-metal guest's driver writes to port 1 of a multiport virtio-serial device (ports = 2): a
        virtserialport, which QEMU holds back while libvirtd has not read what it sent (a virtconsole on port 0
        would drop it). A guest without output (a disturbing guest) gets no multiport, so no port to wait for
        being opened: what it writes to port 0, which does not exist, QEMU discards."""
        controller = ET.SubElement(devices, "controller", type="virtio-serial", index="0",
                                   ports="2" if with_output else "1")
        if board.baremetal_console_address:
            ET.SubElement(controller, "address", type=board.baremetal_console_address)
        if with_output:
            channel = ET.SubElement(devices, "channel", type="unix")
            ET.SubElement(channel, "source", mode="bind")
            ET.SubElement(channel, "target", type="virtio", name=BAREMETAL_CHANNEL)
            ET.SubElement(channel, "address", type="virtio-serial", controller="0", bus="0", port="1")

    def _add_linux_channels(self, devices: ET.Element) -> None:
        """A measuring Linux guest's ports: the samples, and the way back for the end-of-stream confirmation the
        agent waits for (an explained run: the clock exchange of the VM layer, the guest's own trace sent after
        its main job)."""
        for port in (OUTPUT_PORT, ACK_PORT, *((CLOCK_PORT,) if self._vm_source is not None else ()),
                     *((GUEST_TRACE_PORT,) if self._guest_trace_files else ())):
            if port == CLOCK_PORT and self._clock_pipes:  # (a KVM host over SSH: FIFOs the exchange runs on)
                channel = ET.SubElement(devices, "channel", type="pipe")
                ET.SubElement(channel, "source", path=self._clock_pipes)
            else:
                channel = ET.SubElement(devices, "channel", type="unix")
                ET.SubElement(channel, "source", mode="bind")
            ET.SubElement(channel, "target", type="virtio", name=port)

    def _dropped_tuning(self) -> list[str]:
        """Elements of the requested <cputune> missing from the XML libvirt applied (e.g. out of range)."""
        try:
            applied = ET.fromstring(self._applied_xml).find("cputune")
        except ET.ParseError:  # none yet, or cut at XML_LIMIT
            return []
        have = [child.tag for child in applied] if applied is not None else []
        wanted = [child.tag for child in self._cputune()]
        return sorted({f"<{tag}>" for tag in wanted if wanted.count(tag) > have.count(tag)})
