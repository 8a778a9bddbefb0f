"""The Xen lab: a real Xen hypervisor and a small dom0, booted inside QEMU where no Xen host is at hand.

What it boots (hypervisor.py, dom0_image.py) is built once and cached under the guest image's cache
directory (``$RTVIRT_CACHE``, default ``~/.cache/rtvirt``):

* the hypervisor, built from Debian's Xen source package with the real-time schedulers switched on
  (RTDS, ARINC 653 and null are upstream options that Debian's binary leaves out);
* dom0's initramfs: busybox, the Debian kernel's Xen modules, the ``xl`` toolstack and OpenSSH's
  ``sshd`` with every library they link, our static agents, and a per-lab host key and client key;
  on aarch64 (dom0_root.py) a Debian arm64 root with the same toolstack and a small initramfs that mounts it.

A lab boot runs QEMU (x86: multiboot, Xen, then dom0's kernel and initramfs; aarch64: the study's Cortex-A72
board with a GICv2, dom0 loaded by guest-loader: arch.py) with a user-mode network whose only forwarded port is
dom0's sshd on 127.0.0.1; everything afterwards goes through SSH with the host key pinned in a known_hosts file
written before the boot (lab_machine.py, shared with the KVM lab).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ...errors import RunError
from ...procs import Supervisor
from ..guest_image import Cpio
from ..lab_machine import LabKeys, LabMachine, free_port, reclaim_labs
from .arch import XEN_LAB_ARCHES
from .config import XenLabConfig
from .debug_keys import DEBUG_KEYS, summary
from .dom0_image import DOM0_READY_MARK, dom0_image
from .dom0_root import DOM0_FAILED_MARK, dom0_root_image
from .hypervisor import rt_hypervisor

__all__ = ["LAB_ROOT", "LabKeys", "XenLab", "reclaim_xen_labs"]


LAB_ROOT = "xen-lab"
PANIC_MARK = "Panic on CPU"
PANIC_WINDOW = 1 << 16
DEBUG_KEY_ANSWER_S = 3.0  # time Xen gets to print each debug key's dump (seconds under TCG on a busy machine)


def reclaim_xen_labs() -> list[str]:
    return reclaim_labs(LAB_ROOT, "Xen lab")


class XenLab(LabMachine):
    """One boot of Xen + dom0 in QEMU; ``connection`` drives dom0 over SSH. ``close`` stops QEMU."""

    what = "xen lab"
    title = "Xen lab"
    console_kept = "xen-lab-console.log"
    root_name = LAB_ROOT
    ready_mark = DOM0_READY_MARK

    def __init__(self, config: XenLabConfig, dom0_vcpus: int, supervisor: Supervisor, arch: str = "x86_64",
                 earlier: list[str] | None = None) -> None:
        if dom0_vcpus >= config.pcpus:
            raise RunError(f"xen lab: dom0_vcpus ({dom0_vcpus}) leaves no pCPU of the lab's {config.pcpus} "
                           "for domUs")
        super().__init__(supervisor, config.boot_timeout, earlier)
        self.config = config
        self.dom0_vcpus = dom0_vcpus
        self.arch = XEN_LAB_ARCHES[arch]
        self.accel: dict[str, str] = {}
        self.hypervisor: Path | None = None
        self.dom0_root: Path | None = None

    def boot(self) -> XenLab:
        """Build what the lab boots (cached), start QEMU, wait for dom0, then connect to its sshd."""
        from ..qemu import choose_accel

        self.hypervisor = rt_hypervisor(self.arch.name)
        if self.arch.name == "x86_64":  # dom0 in an initramfs of this machine's toolstack
            kernel, base = dom0_image()
        else:  # dom0 on a Debian root of the lab's architecture
            kernel, base, self.dom0_root = dom0_root_image(self.arch.name)
        keys = self.keys()
        initrd = self._initrd(base, keys)
        self.accel = choose_accel(self.config.accel, self.arch.name)
        port = free_port()
        self.start(self._qemu_argv(kernel, initrd, port), port)
        self.await_ready()
        self.connect(keys)
        return self

    def _initrd(self, base: Path, keys: LabKeys) -> Path:
        """dom0's initramfs for this boot: the cached image plus this lab's keys."""
        initrd = self.directory / "dom0.cpio"
        lab_files = Cpio()
        lab_files.file("etc/ssh/ssh_host_ed25519_key", keys.host_key.read_bytes())
        lab_files.file("root/.ssh/authorized_keys", (keys.client_public + "\n").encode())
        with initrd.open("wb") as out, base.open("rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
            out.write(lab_files.to_bytes())
        return initrd

    def _qemu_argv(self, kernel: Path, initrd: Path, port: int) -> list[str]:
        """QEMU booting Xen with dom0's kernel and initramfs (and root disk), its sshd forwarded to
        127.0.0.1:port; what differs between architectures is the lab's entry of XEN_LAB_ARCHES."""
        assert self.hypervisor is not None
        kvm = self.accel["accel"] == "kvm"
        xen_options = (f"dom0_mem={self.config.dom0_memory}M,max:{self.config.dom0_memory}M "
                       f"dom0_max_vcpus={self.dom0_vcpus} dom0_vcpus_pin sched=credit2")
        return [self.arch.qemu, "-accel", self.accel["accel"], "-cpu", "host" if kvm else self.arch.tcg_cpu,
                "-smp", str(self.config.pcpus), "-m", str(self.config.memory),
                "-display", "none", "-nodefaults", "-no-reboot", *self.serial_args(), *self.monitor_args(),
                *self.arch.boot_args(self.hypervisor, xen_options, kernel, initrd, self.dom0_root),
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-device", f"{self.arch.net_device},netdev=n0"]

    def hang_report(self) -> str:
        """Xen's own account of the hang: its debug keys pressed on the serial console (the dump kept in the
        console's log), summed up as where each pCPU and dom0 vCPU was."""
        cpus = super().hang_report()  # (first: QEMU's view before the keys set Xen to work)
        start = self.console_size()
        if not self.type_on_console(DEBUG_KEYS, answer_within=DEBUG_KEY_ANSWER_S):  # (QEMU gone: refused)
            return cpus
        return f"{cpus}Xen's debug keys: {summary(self.console_since(start))}; "

    def failure(self) -> str | None:
        """Xen's panic message if the hypervisor crashed (QEMU keeps running a halted machine), or the arm64 dom0
        root's init saying why it could not start."""
        text = self.console_text(PANIC_WINDOW)
        at = text.rfind(DOM0_FAILED_MARK)
        if at >= 0:
            return "dom0 failed to start: " + text[at + len(DOM0_FAILED_MARK):].strip().splitlines()[0][:300]
        at = text.rfind(PANIC_MARK)
        if at < 0:
            return None
        said = [line.removeprefix("(XEN)").strip() for line in text[at:].splitlines()[1:4]]
        return "Xen panicked: " + " | ".join(line[:160] for line in said if line and not line.startswith("*"))
