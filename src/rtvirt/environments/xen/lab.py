"""The Xen lab: a real Xen hypervisor and a small dom0, booted inside QEMU where no Xen host is at hand.

What it boots (hypervisor.py, dom0_image.py) is built once and cached under the guest image's cache
directory (``$RTVIRT_CACHE``, default ``~/.cache/rtvirt``):

* the hypervisor, built from Debian's Xen source package with the real-time schedulers switched on
  (RTDS, ARINC 653 and null are upstream options that Debian's binary leaves out);
* dom0's initramfs: busybox, the Debian kernel's Xen modules, the ``xl`` toolstack and OpenSSH's
  ``sshd`` with every library they link, our static agents, and a per-lab host key and client key.

A lab boot runs QEMU (multiboot: Xen, then dom0's kernel and initramfs) with a user-mode network
whose only forwarded port is dom0's sshd on 127.0.0.1; everything afterwards goes through SSH with
the host key pinned in a known_hosts file written before the boot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import RunError
from ...procs import Supervisor
from ..guest_image import Cpio, cache_dir
from .config import XenLabConfig
from .dom0_image import DOM0_READY_MARK, dom0_image
from .files import _run
from .hypervisor import rt_hypervisor

if TYPE_CHECKING:
    from ...remote import SshConnection


__all__ = ["LAB_ROOT", "XenLab", "reclaim_labs"]


QEMU = "qemu-system-x86_64"
LAB_ROOT = "xen-lab"
OWNER_FILE = "owner.pid"
QEMU_PID_FILE = "qemu.pid"
CONSOLE_LIMIT = 1 << 20
PANIC_MARK = "Panic on CPU"
PANIC_WINDOW = 1 << 16


@dataclass(frozen=True)
class LabKeys:
    host_key: Path
    host_public: str
    client_key: Path
    client_public: str

def _keypair(path: Path) -> str:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rtvirt-xen-lab", "-f", str(path)], path.parent,
         "ssh-keygen", timeout=60)
    return path.with_suffix(".pub").read_text().strip()

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

def reclaim_labs() -> list[str]:
    """Kill lab QEMUs whose rtvirt died (should PDEATHSIG have missed one) and remove their directories."""
    removed: list[str] = []
    root = cache_dir() / LAB_ROOT
    for lab in sorted(root.glob("lab-*")) if root.exists() else []:
        try:
            owner = int((lab / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue
        with contextlib.suppress(OSError, ValueError):
            qemu = int((lab / QEMU_PID_FILE).read_text())
            cmdline = Path(f"/proc/{qemu}/cmdline").read_bytes()
            if str(lab).encode() in cmdline:  # that pid is still our QEMU, not a reused number
                os.kill(qemu, signal.SIGKILL)
                removed.append(f"stray Xen lab QEMU (pid {qemu})")
        shutil.rmtree(lab, ignore_errors=True)
    return removed

class XenLab:
    """One boot of Xen + dom0 in QEMU; ``connection`` drives dom0 over SSH. ``close`` stops QEMU."""

    def __init__(self, config: XenLabConfig, dom0_vcpus: int, supervisor: Supervisor) -> None:
        if dom0_vcpus >= config.pcpus:
            raise RunError(f"xen lab: dom0_vcpus ({dom0_vcpus}) leaves no pCPU of the lab's {config.pcpus} "
                           "for domUs")
        self.config = config
        self.dom0_vcpus = dom0_vcpus
        self.supervisor = supervisor
        self.accel: dict[str, str] = {}
        self.boot_seconds: float | None = None
        self.hypervisor: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._connection: SshConnection | None = None
        root = cache_dir() / LAB_ROOT
        root.mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="lab-", dir=root))
        self.console = self.directory / "console.log"
        (self.directory / OWNER_FILE).write_text(str(os.getpid()))

    def boot(self) -> XenLab:
        """Build what the lab boots (cached), start QEMU, wait for dom0, then connect to its sshd."""
        from ..qemu import choose_accel

        self.hypervisor = rt_hypervisor()
        kernel, base = dom0_image()
        keys = self._keys()
        initrd = self._initrd(base, keys)
        for path in (kernel, initrd):
            if "," in str(path):
                raise RunError(f"xen lab: QEMU cannot take a multiboot module path with a comma: {path}")
        self.accel = choose_accel(self.config.accel)
        port = _free_port()
        started = time.monotonic()
        self._proc = self.supervisor.start(self._qemu_argv(kernel, initrd, port), stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE)
        (self.directory / QEMU_PID_FILE).write_text(str(self._proc.pid))
        self._await_dom0(started + self.config.boot_timeout / 1e9)
        self._connect(port, keys)
        self.boot_seconds = round(time.monotonic() - started, 1)
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
        """QEMU booting Xen (multiboot) with dom0's kernel and initramfs, its sshd forwarded to 127.0.0.1:port."""
        assert self.hypervisor is not None
        kvm = self.accel["accel"] == "kvm"
        xen_command_line = (f"console=com1 com1=115200 dom0_mem={self.config.dom0_memory}M,"
                            f"max:{self.config.dom0_memory}M dom0_max_vcpus={self.dom0_vcpus} "
                            "dom0_vcpus_pin noreboot sched=credit2")
        # TCG: qemu64 (-cpu max faults the PV dom0) with AMD's nested paging (+npt): Xen's HVM side needs it
        # for PVH/HVM domUs (Debian's Xen has no shadow paging)
        cpu = "host" if kvm else "qemu64,+npt"
        argv = [QEMU, "-accel", self.accel["accel"], "-cpu", cpu,
                "-smp", str(self.config.pcpus), "-m", str(self.config.memory),
                "-display", "none", "-nodefaults", "-no-reboot", "-serial", f"file:{self.console}",
                "-kernel", str(self.hypervisor), "-append", xen_command_line,
                "-initrd", f"{kernel} console=hvc0 rdinit=/init quiet,{initrd}",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-device", "virtio-net-pci,netdev=n0"]
        return argv

    def _await_dom0(self, deadline: float) -> None:
        """Until dom0 says it is ready on the serial console; QEMU's end or the deadline is an error."""
        assert self._proc is not None
        while DOM0_READY_MARK not in self.console_text():
            if self._proc.poll() is not None:
                error = self._proc.stderr.read(2000).decode(errors="replace") if self._proc.stderr else ""
                raise RunError(f"xen lab: QEMU exited while Xen booted: {error.strip()[-300:] or 'no message'}; "
                               f"console: {self.console_tail()}")
            if time.monotonic() > deadline:
                raise RunError(f"xen lab: dom0 did not come up within {self.config.boot_timeout / 1e9:.0f}s; "
                               f"console: {self.console_tail()}")
            time.sleep(0.2)

    def _connect(self, port: int, keys: LabKeys) -> None:
        """SSH to dom0 with its host key pinned, retrying for a minute while its sshd comes up."""
        from ...remote import SshTarget, connect

        assert self._proc is not None
        known_hosts = self.directory / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {keys.host_public}\n")
        target = SshTarget(host="127.0.0.1", port=port, user="root", identity_file=keys.client_key,
                           known_hosts=known_hosts, ssh_config=self.directory / "ssh_config",
                           connect_timeout=60, proxy_jump=None)
        (self.directory / "ssh_config").write_text("")  # never the user's ~/.ssh/config
        attempt_deadline = time.monotonic() + 60
        while True:
            try:
                self._connection = connect(target)
                break
            except RunError:
                if time.monotonic() > attempt_deadline or self._proc.poll() is not None:
                    raise
                time.sleep(1.0)

    def _keys(self) -> LabKeys:
        host, client = self.directory / "host_ed25519", self.directory / "client_ed25519"
        host_public = " ".join(_keypair(host).split()[:2])
        client_public = _keypair(client)
        return LabKeys(host, host_public, client, client_public)

    @property
    def connection(self) -> SshConnection:
        if self._connection is None:
            raise RunError("xen lab: not booted")
        return self._connection

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self.panic() is None

    def panic(self) -> str | None:
        """Xen's panic message if the hypervisor crashed (QEMU keeps running a halted machine)."""
        if not self.console.exists():
            return None
        with self.console.open("rb") as f:
            f.seek(max(0, self.console.stat().st_size - PANIC_WINDOW))
            text = f.read().decode("utf-8", errors="replace")
        at = text.rfind(PANIC_MARK)
        if at < 0:
            return None
        said = [line.removeprefix("(XEN)").strip() for line in text[at:].splitlines()[1:4]]
        return "Xen panicked: " + " | ".join(line[:160] for line in said if line and not line.startswith("*"))

    def console_text(self) -> str:
        if not self.console.exists():
            return ""
        with self.console.open("rb") as f:
            f.seek(max(0, self.console.stat().st_size - CONSOLE_LIMIT))
            return f.read().decode("utf-8", errors="replace")

    def console_tail(self) -> str:
        lines = [line.strip() for line in self.console_text().splitlines() if line.strip()]
        return " | ".join(line[:160] for line in lines[-3:]) or "empty"

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._proc is not None:
            self.supervisor.stop(self._proc, grace=2.0)
            self._proc = None
        shutil.rmtree(self.directory, ignore_errors=True)
