"""A real KVM host for tests: Debian's kernel with kvm-amd, booted under TCG (``-cpu max`` emulates AMD's SVM with
nested paging, /work/shared/kvm-lab.md), running this machine's own root file system read-only over virtio-9p and
its sshd on a forwarded loopback port, its host key pinned before the boot.

Its QEMU, taskset, chrt and sshd are this machine's binaries, so the qemu kind reaches it exactly as it reaches
any KVM host over SSH (``host = "root@127.0.0.1:<port>"``); /var/tmp (where rtvirt copies its images and agents),
/tmp and /run are memory file systems of its own. Nothing here is part of rtvirt: the KVM lab (the kvmlab
environment) is the product; this is the smallest real KVM host a test can boot in a few seconds, for the KVM
layer of explanations (docs/explain.md).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sshd_server import _keygen, free_port

from rtvirt.environments.guest_image import BUSYBOX, Cpio, _fetch_kernel, _modules_in_load_order, cache_dir, kernel_elf
from rtvirt.environments.kvmlab.image import KEY_HOLDER_QEMU
from rtvirt.errors import RunError
from rtvirt.procs import Supervisor

QEMU = "qemu-system-x86_64"
MODULES = ("virtio_pci", "virtio_net", "9p", "9pnet_virtio", "kvm_amd")
READY = "RTVIRT-KVM-HOST-READY"

SSHD_CONFIG = """\
Port 22
HostKey /run/kvmhost/host_key
PidFile /run/kvmhost/sshd.pid
AuthorizedKeysFile /run/kvmhost/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
X11Forwarding no
PrintMotd no
MaxStartups 50
MaxSessions 50
LogLevel ERROR
SetEnv SHLVL=1
"""

INIT = rf"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/modules.d/$m" || echo "insmod $m failed"; done
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro host /host
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts && mount -t devpts devpts /host/dev/pts
mount -t tracefs nodev /host/sys/kernel/tracing
mount -t debugfs nodev /host/sys/kernel/debug
for d in tmp run var/tmp; do mount -t tmpfs tmp "/host/$d"; done
mkdir -p /host/run/kvmhost /host/run/sshd
cp /kvmhost/* /host/run/kvmhost/
chmod 600 /host/run/kvmhost/host_key
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
chroot /host /usr/sbin/sshd -f /run/kvmhost/sshd_config -E /run/kvmhost/sshd.log
[ -c /dev/kvm ] && echo "kvm: /dev/kvm is there"
# a paused VM for the host's lifetime, as the KVM lab's init starts one: it holds KVM's static keys, so that the
# tests' VMs starting and ending rewrite no kernel text, which under TCG once left a lab's CPU looping for good
# (docs/environments-kvm-lab.md); an explanation test's run here once sat ten minutes without a guest console line
chroot /host {KEY_HOLDER_QEMU} -pidfile /run/kvmhost/key-holder.pid &&
  echo "kvm: the key holder runs"
echo RTVIRT-KVM-HOST-READY
while true; do sleep 3600; done
"""


class NestedKvmHost:
    """One boot of the KVM host; a context manager. ``target()`` is how rtvirt reaches it."""

    def __init__(self, cpus: int = 2, memory: int = 2048, boot_timeout: float = 300.0) -> None:
        self.cpus, self.memory, self.boot_timeout = cpus, memory, boot_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="rtvirt-kvmhost-"))
        self.console = self.dir / "console.log"
        self.port = 0
        self.user = "root"
        self.client_key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"
        (self.dir / "ssh_config").touch()  # never the user's ~/.ssh/config
        self.supervisor = Supervisor()
        self.proc: subprocess.Popen[bytes] | None = None

    def _initramfs(self) -> Path:
        vmlinuz, modules_dir = _fetch_kernel(cache_dir())
        host_public = _keygen(self.dir / "host_key")
        archive = Cpio()
        for name in ("bin", "proc", "sys", "dev", "modules.d", "kvmhost"):
            archive.directory(name)
        archive.file("bin/busybox", BUSYBOX.read_bytes(), executable=True)
        archive.file("init", INIT.encode(), executable=True)
        modules = _modules_in_load_order(modules_dir, MODULES)
        for module in modules:
            archive.file(f"modules.d/{module.name}", module.read_bytes())
        archive.file("modules", "".join(f"{m.name}\n" for m in modules).encode())
        archive.file("kvmhost/host_key", (self.dir / "host_key").read_bytes())
        archive.file("kvmhost/authorized_keys", (_keygen(self.client_key) + "\n").encode())
        archive.file("kvmhost/sshd_config", SSHD_CONFIG.encode())
        self._host_public = " ".join(host_public.split()[:2])
        self._kernel = kernel_elf(vmlinuz)
        path = self.dir / "kvmhost.cpio"
        path.write_bytes(archive.to_bytes())
        return path

    def start(self) -> NestedKvmHost:
        initramfs = self._initramfs()
        self.port = free_port()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self._host_public}\n")
        self.proc = self.supervisor.start(
            [QEMU, "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", str(self.cpus), "-m", str(self.memory),
             "-display", "none", "-nodefaults", "-no-reboot", "-serial", f"file:{self.console}",
             "-kernel", str(self._kernel), "-initrd", str(initramfs),
             "-append", "console=ttyS0 rdinit=/init quiet panic=-1",
             "-virtfs", "local,path=/,mount_tag=host,security_model=none,multidevs=remap,readonly=on",
             "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22", "-device", "virtio-net-pci,netdev=n0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.boot_timeout
        while READY not in self.console_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RunError(f"the nested KVM host did not come up: {self.console_text()[-2000:]}")
            time.sleep(0.5)
        if "kvm: /dev/kvm is there" not in self.console_text() or "kvm: the key holder runs" not in \
                self.console_text():
            self.stop()
            raise RunError(f"the nested KVM host has no /dev/kvm or no key holder: {self.console_text()[-2000:]}")
        self._await_sshd(deadline)
        return self

    def _await_sshd(self, deadline: float) -> None:
        from rtvirt.remote import connect

        while True:
            try:
                connect(self.target()).close()
                return
            except RunError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def target(self):  # -> rtvirt.remote.SshTarget
        from rtvirt.remote import SshTarget

        return SshTarget(host="127.0.0.1", port=self.port, user=self.user, identity_file=self.client_key,
                         known_hosts=self.known_hosts, ssh_config=self.dir / "ssh_config", connect_timeout=60)

    def environment_fields(self) -> str:
        """The qemu kind's fields that put its QEMU on this KVM host (TOML)."""
        return (f'host = "root@127.0.0.1:{self.port}"\n'
                f'ssh = {{ known_hosts = "{self.known_hosts}", identity_file = "{self.client_key}", '
                f'ssh_config = "{self.dir / "ssh_config"}", connect_timeout = 60 }}\n')

    def qemus_besides_the_holder(self, connection) -> list[str]:  # type: ignore[no-untyped-def]
        """Pids of QEMUs running on the KVM host other than its key holder (``connection``: an SshConnection)."""
        holder = connection.run(["cat", "/run/kvmhost/key-holder.pid"]).stdout.strip()
        return [pid for pid in connection.run(["pgrep", "-f", "qemu-system"]).stdout.split() if pid != holder]

    def console_text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.supervisor.stop_all(grace=2.0)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NestedKvmHost:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
