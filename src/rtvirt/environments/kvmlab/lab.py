"""The KVM lab: a real KVM host (Debian's kernel with kvm-amd, Debian's QEMU and libvirtd) booted inside QEMU
where no KVM host is at hand, reached over SSH like any KVM host on a bench.

One boot per campaign: every environment whose ``lab`` table is the same shares it (``open_kvm_lab``). Its
``ssh_target`` (127.0.0.1, the forwarded port, the lab's client key, its host key pinned) is what any
environment that drives a remote KVM host uses, its libvirtd included (libvirt.reach: forwarded over that SSH).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from ...errors import RunError
from ...procs import Supervisor
from ..base import SharedResources
from ..lab_cpus import KernelSymbols
from ..lab_machine import LabMachine, booted, free_port, open_lab, reclaim_labs
from ..tcg_clock import tsc_kernel_args
from .arch import LAB_ARCHES
from .config import KvmLabConfig
from .image import LAB_FAILED_MARK, LAB_READY_MARK, boot_initramfs, lab_files, root_image

__all__ = ["LAB_ROOT", "LAB_WARNING", "KvmLab", "open_kvm_lab", "reclaim_kvm_labs"]


LAB_ROOT = "kvm-lab-runs"
KALLSYMS_LIMIT = 32 << 20  # bytes of the lab kernel's text symbols read (Debian's 6.1 amd64: 2 MB)
KERNEL_PANIC = "Kernel panic - not syncing"
FAILURE_WINDOW = 1 << 16
LAB_WARNING = ("nested KVM under {accel} (a KVM lab in QEMU on this machine; emulated: {emulated}): its timings are "
               "not representative of a KVM host")


def reclaim_kvm_labs() -> list[str]:
    return reclaim_labs(LAB_ROOT, "KVM lab")


# The lab's kernel. Warnings reach its console: a soft lockup's stack is printed at that level, which "quiet" hid.
# A CPU that schedules nothing for 60 s panics it, so that a stalled lab stops at once and is booted again: in one CI
# run the lab's CPU 0 sat in a soft lockup inside the nested guest's QEMU for nine minutes (CPU 1's timers stopped
# too) before the run noticed the lab's silence. 60 s, not the kernel's 20, since this machine can starve the lab's
# emulated CPUs for seconds. The soft-lockup watchdog runs on the stuck CPU itself and may never fire (a later lab sat
# stalled for eight minutes with only RCU's stall report, from the other CPU): an RCU stall of 60 s panics it too.
# Its kernel at the addresses of its System.map (nokaslr): what names where QEMU saw its CPUs once it hung (lab_cpus).
LAB_KERNEL_OPTIONS = ("nokaslr loglevel=5 watchdog_thresh=30 softlockup_panic=1 rcupdate.rcu_cpu_stall_timeout=60 "
                      "sysctl.kernel.panic_on_rcu_stall=1 panic=-1")
# where the lab's kernel says what it took of those options, for every run's record of the lab
STALL_PANIC_SETTINGS = {**{name: f"/proc/sys/kernel/{name}"
                           for name in ("softlockup_panic", "panic_on_rcu_stall", "watchdog_thresh", "panic")},
                        "rcu_cpu_stall_timeout": "/sys/module/rcupdate/parameters/rcu_cpu_stall_timeout"}


class KvmLab(LabMachine):
    """One boot of the KVM lab in QEMU; ``connection`` drives it over SSH, ``close`` stops QEMU."""

    what = "kvm lab"
    title = "KVM lab"
    console_kept = "kvm-lab-console.log"
    heartbeat = True
    root_name = LAB_ROOT
    ready_mark = LAB_READY_MARK

    def __init__(self, config: KvmLabConfig, arch: str, supervisor: Supervisor, earlier: list[str]) -> None:
        super().__init__(supervisor, config.boot_timeout, earlier)
        self.config = config
        self.arch = LAB_ARCHES[arch]
        self.accel: dict[str, str] = {}
        self.root: Path | None = None
        self.facts: dict[str, Any] = {}
        self.kallsyms: Path | None = None  # the lab kernel's text symbols, to name where its CPUs were should it hang

    def boot(self) -> KvmLab:
        """Build what the lab boots (cached), start QEMU, wait for sshd and libvirtd, connect, read its versions."""
        from ..qemu.accel import choose_accel

        self.root = root_image(self.arch)
        kernel, base = boot_initramfs(self.arch)
        digest = hashlib.sha256(kernel.read_bytes()).hexdigest()[:16]  # (a rebuilt kernel may keep its name)
        self.kallsyms = self.root.with_name(f"kallsyms-{self.arch.name}-{digest}.txt")
        self.symbols = KernelSymbols.read(self.kallsyms)
        keys = self.keys()
        initrd = self.directory / "boot.cpio"
        initrd.write_bytes(base.read_bytes() + lab_files(keys.host_key, keys.client_public))
        self.accel = choose_accel(self.config.accel, self.arch.name)
        port = free_port()
        self.start(self._qemu_argv(kernel, initrd, port), port)
        self.await_ready()
        self.connect(keys)
        self.facts = self._read_facts()
        self._read_symbols()
        return self

    def _qemu_argv(self, kernel: Path, initrd: Path, port: int) -> list[str]:
        """QEMU running the lab: its root image copy-on-write (snapshot: the cached image is never written), its
        sshd forwarded to 127.0.0.1:port and nothing else reachable."""
        if "," in str(self.root):
            raise RunError(f"kvm lab: QEMU cannot take a drive path with a comma: {self.root}")
        kvm = self.accel["accel"] == "kvm"
        return [self.arch.qemu, "-machine", self.arch.machine, "-accel", self.accel["accel"],
                "-cpu", "host" if kvm else self.arch.tcg_cpu, "-smp", str(self.config.pcpus),
                "-m", str(self.config.memory), "-display", "none", "-nodefaults", "-no-reboot",
                "-serial", f"file:{self.console}", *self.monitor_args(),
                "-kernel", str(kernel), "-initrd", str(initrd),
                "-append", " ".join([f"console={self.arch.console}", LAB_KERNEL_OPTIONS, "rdinit=/init",
                                     *tsc_kernel_args(self.arch.name, self.accel["accel"], here=True)]),
                "-drive", f"file={self.root},format=raw,if=virtio,snapshot=on",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-device", "virtio-net-pci,netdev=n0"]

    def _read_symbols(self) -> None:
        """The lab kernel's text symbols, read from the booted lab when no earlier boot of its kernel kept them
        (nokaslr puts them at the same addresses in every boot), and this boot's modules' load addresses."""
        assert self.kallsyms is not None
        if not self.kallsyms.exists():
            text = self.connection.run(["awk", '($2 == "t" || $2 == "T") && NF == 3', "/proc/kallsyms"],
                                       timeout=300, limit=KALLSYMS_LIMIT).check("kvm lab: reading its symbols").stdout
            if len(text) < KALLSYMS_LIMIT:  # (cut at the limit, the table would name addresses past it wrongly)
                partial = self.kallsyms.with_suffix(f".{os.getpid()}.part")
                partial.write_text(text)
                partial.replace(self.kallsyms)
                self.symbols = KernelSymbols.read(self.kallsyms)
        modules = self.connection.run(["cat", "/proc/modules"], timeout=60).check("kvm lab: reading its modules")
        self.symbols.add_modules(modules.stdout)

    def _read_facts(self) -> dict[str, Any]:
        """What the manifests say of the lab: what QEMU emulated, its kernel, its KVM (the module and its nested
        paging on x86; on Arm, the kernel's word that it started at EL2 and set up its hypervisor mode and
        vGIC), QEMU, libvirt."""
        module = self.arch.kvm_modules[-1] if self.arch.kvm_modules else "kvm"
        script = (f"uname -r; cat /sys/module/{module}/parameters/npt 2>/dev/null || echo -; "
                  f"{self.arch.lab_qemu} --version | head -n1; libvirtd --version; "
                  "dmesg | grep -m4 -o -e 'All CPU(s) started at EL[0-9]' -e 'Hyp mode initialized successfully' "
                  "-e 'vgic[-a-z0-9]* interrupt IRQ[0-9]*' -e 'GICv[0-9]'; true")
        settings = self.connection.run(["cat", *STALL_PANIC_SETTINGS.values()], timeout=60)
        values = settings.check("kvm lab: reading its stall panics").stdout.split()
        stall_panics = dict(zip(STALL_PANIC_SETTINGS, values, strict=False))
        said = self.connection.run(["sh", "-c", script], timeout=120).check("kvm lab: reading its versions")
        lines = [line.strip()[:200] for line in said.stdout.splitlines()]
        if len(lines) < 4:
            raise RunError(f"kvm lab: unexpected answer to the version query: {said.stdout[:300]!r}")
        accel = self.accel.get("accel", "tcg")
        return {"arch": self.arch.name, "emulated": self.arch.emulated(accel), "machine": self.arch.machine,
                "cpu": "host" if accel == "kvm" else self.arch.tcg_cpu, "gic_version": self.arch.gic_version,
                "kvm_module": self.arch.kvm_name, "kernel": lines[0],
                "nested_paging": {"1": True, "Y": True, "0": False, "N": False}.get(lines[1]),
                "kernel_said": [re.sub(r"[^ -~]", "?", line) for line in lines[4:8]],
                "stall_panics": {name: int(value) for name, value in stall_panics.items()
                                 if value.lstrip("-").isdigit()},
                "qemu": lines[2], "libvirt": lines[3].split()[-1],
                "accel": accel, "accel_reason": self.accel.get("reason"),
                "boot_seconds": self.boot_seconds, "root_image": self.root.name if self.root else None,
                "pcpus": self.config.pcpus, "memory_mib": self.config.memory,
                **self.boot_record()}

    def warning(self) -> str:
        """What every run in this lab says of its timings (the accelerator under the lab, what is emulated)."""
        return LAB_WARNING.format(accel=self.accel.get("accel", "?").upper(), emulated=self.facts.get("emulated", "?"))

    def ensure_alive(self) -> None:
        """A lab that stopped (its QEMU gone, a panic) fails the run that would use it, naming why."""
        if not self.alive():
            raise RunError(f"the KVM lab stopped: {self.why_stopped()}")

    def blamed(self, exc: RunError, workdir: Path) -> RunError:
        """``exc``, or, when what failed was the lab (``lost``), an error that says so."""
        lost = self.lost(str(exc), workdir)
        return exc if lost is None else RunError(f"{lost} ({exc})")

    def failure(self) -> str | None:
        """What the lab's console says went wrong: our init's own failure mark, or a kernel panic."""
        text = self.console_text(FAILURE_WINDOW)
        at = text.rfind(LAB_FAILED_MARK)
        if at >= 0:
            return "the lab failed to boot: " + text[at + len(LAB_FAILED_MARK):].strip().splitlines()[0][:300]
        at = text.rfind(KERNEL_PANIC)
        if at >= 0:
            return "the lab's kernel panicked: " + text[at:].splitlines()[0][:300]
        return None


def open_kvm_lab(config: KvmLabConfig, arch: str, shared: SharedResources) -> KvmLab:
    """The campaign's boot of the ``arch`` lab ``config`` describes (``open_lab``: booted again once it stopped
    under a run; a boot that failed is not tried again)."""
    def boot(earlier: list[str]) -> KvmLab:
        return booted(KvmLab(config, arch, shared.supervisor, earlier))
    return open_lab(shared, config.key(arch), boot, lambda lab: lab)
