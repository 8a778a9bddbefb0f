"""What a KVM lab boots: a Debian root file system (QEMU, libvirtd, OpenSSH's sshd, as Debian installs them) in an
ext4 image, and a small initramfs (busybox, the kernel's KVM, disk and network modules, our agents) that mounts
it and hands over to the root's own init.

The root is made by ``mmdebstrap`` from Debian's archive, not by copying this machine's binaries and their
``ldd`` closure as the Xen lab's dom0 is: libvirtd loads drivers and reads data files (cpu_map, firmware,
option ROMs, schemas) no ``ldd`` names, and an arm64 lab is the same recipe with ``--architectures=arm64``.
Both are built once and cached under ``$RTVIRT_CACHE/kvm-lab/``, content-addressed: the root by its recipe and
the versions of its packages that apt names here, the initramfs by its bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...agents import AGENTS, agent_path
from ...fileio import mark_used, prune_cache, write_atomically
from ..debian_root import DOC_FILES, debian_root, handover_init
from ..guest_image import Cpio, _fetch_kernel, _modules_in_load_order, arch_cache, busybox, cache_dir
from ..lab_machine import HEARTBEAT_MARK, HEARTBEAT_S, sshd_config
from .arch import LabArch

__all__ = ["LAB_AGENT_DIR", "LAB_FAILED_MARK", "LAB_READY_MARK", "ROOT_PACKAGES", "boot_initramfs", "lab_files",
           "root_image"]


IMAGE_DIR = "kvm-lab"
ROOT_PACKAGES = ("libvirt-daemon", "libvirt-daemon-driver-qemu", "libvirt-clients", "openssh-server", "iproute2",
                 "procps", "mount")
# the archive's suites the root is made from (debian_root: this machine's release), in the recipe's words
SUITES = ("{codename}", "{codename}-updates")
SECURITY = "{codename}-security"
# docs, and the 32-bit emulator: libvirtd probes every qemu-system-* it finds at start (seconds each under TCG)
EXCLUDED = (*DOC_FILES, "/usr/bin/qemu-system-i386")
LAB_READY_MARK = "RTVIRT-KVM-LAB-READY"
LAB_FAILED_MARK = "RTVIRT-KVM-LAB-FAILED"
LAB_AGENT_DIR = "/opt/rtvirt/bin"
LAB_INIT = "/usr/local/sbin/rtvirt-lab-init"

# the initramfs: modules, the root mounted, this lab's keys and our agents put in it, then the root's init
NO_KVM = 'fail "no /dev/kvm: $(cat /rtvirt/kvm-module) did not load ($(dmesg | grep -i -m1 -e svm -e kvm))"'
INITRAMFS_INIT = handover_init(LAB_FAILED_MARK, "the lab's root file system", f"""[ -c /dev/kvm ] || {NO_KVM}
mkdir -p /newroot/root/.ssh /newroot{LAB_AGENT_DIR}
cp /rtvirt/lab/ssh_host_ed25519_key /newroot/etc/ssh/ssh_host_ed25519_key
chmod 600 /newroot/etc/ssh/ssh_host_ed25519_key
cp /rtvirt/lab/authorized_keys /newroot/root/.ssh/authorized_keys
cp /rtvirt/bin/* /newroot{LAB_AGENT_DIR}/
""", LAB_INIT)

# A paused one-vCPU VM that holds KVM's static keys for a KVM host's lifetime (why: ROOT_INIT below); the test
# suite's nested KVM host starts the same one, each with its own -pidfile
KEY_HOLDER_QEMU = ("qemu-system-x86_64 -name rtvirt-key-holder -accel kvm -machine q35 -cpu host -smp 1 -m 16 -S"
                   " -display none -nodefaults -no-user-config -daemonize")

# the root's init (no systemd): tmpfs, cgroup v2, the network QEMU's user mode gives, sshd, virtlogd and libvirtd
ROOT_INIT = rf"""#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fail() {{ echo "{LAB_FAILED_MARK} $*"; sleep 2; poweroff -f; }}
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /run/sshd /run/libvirt /run/lock /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# the KVM host's tracer (explanations' VM and KVM layers) and KVM's debugfs (each vCPU's TSC offset)
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
hostname rtvirt-kvm-lab
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
/usr/sbin/sshd -f /etc/rtvirt-lab/sshd_config -E /var/log/sshd.log || fail "sshd did not start"
LIBVIRT_LOG_OUTPUTS="3:file:/var/log/virtlogd.log" virtlogd -d || fail "virtlogd did not start"
LIBVIRT_LOG_OUTPUTS="3:file:/var/log/libvirtd.log" libvirtd -d || fail "libvirtd did not start"
# virsh answers once libvirtd's drivers are up (the QEMU driver probes QEMU's capabilities first)
n=0; until virsh -q -c qemu:///system version >/dev/null 2>&1 || [ $n -gt 300 ]; do n=$((n+1)); sleep 0.5; done
virsh -q -c qemu:///system version >/dev/null 2>&1 ||
  fail "libvirtd does not serve: $(grep error /var/log/libvirtd.log | tail -n 2)"
# A paused VM with one vCPU, for the lab's lifetime: KVM enables static keys on a VM's creation and a vCPU's
# (preempt_notifier_key in __schedule, apic_sw_disabled), which rewrites kernel text at every domain's start and
# end while the first VM comes and the last goes. Under this machine's TCG another lab CPU can go on executing the
# text from before the rewrite: in two stalls here a lab CPU looped for good through int3 exceptions with interrupts
# off, once both at __schedule's preempt-notifier site (docs/environments-kvm-lab.md). Held at one, those keys stay:
# a VM's start and end rewrite no kernel text with the holder (4 sites without it).
# (x86 only so far: the stalls were seen there; one that does not start leaves the lab as it was, and says so)
if [ "$(uname -m)" = x86_64 ]; then
  {KEY_HOLDER_QEMU} -pidfile /run/rtvirt-key-holder.pid ||
    echo "RTVIRT-KEY-HOLDER-FAILED: KVM's static keys will be rewritten at every domain's start and end"
fi
echo "{LAB_READY_MARK} $(cat /proc/uptime)"
# a heartbeat: a lab that stops answering over SSH shows on its console whether its kernel still ran, how loaded
while :; do sleep {HEARTBEAT_S}; echo "{HEARTBEAT_MARK} $(cat /proc/uptime /proc/loadavg | tr '\n' ' ')"; done
"""

SSHD_CONFIG = sshd_config(f"PATH={LAB_AGENT_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

# QEMU runs as root (the lab has no libvirt-qemu user: libvirt-daemon-system, which makes it, pulls in systemd)
# and without AppArmor or DAC relabelling: the lab is a throwaway machine that runs only rtvirt's domains
QEMU_USER, QEMU_ID = "libvirt-qemu", 64055  # Debian's
QEMU_CONF = """user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
"""


def _recipe(arch: LabArch) -> str:
    return "\n".join((arch.debian_arch, arch.qemu_package, *ROOT_PACKAGES, *SUITES, SECURITY, *EXCLUDED,
                      *arch.excluded, ROOT_INIT, SSHD_CONFIG, QEMU_CONF))


def root_image(arch: LabArch) -> Path:
    """The lab's root file system (an ext4 image, sparse), built on first use: mmdebstrap, about 40 s here for
    x86_64, 3 min for arm64 (its maintainer scripts run under qemu-user)."""
    return debian_root(IMAGE_DIR, f"root-{arch.name}", arch.name, (arch.qemu_package, *ROOT_PACKAGES),
                       (*EXCLUDED, *arch.excluded), _recipe(arch), _customise, "kvm lab")


def _customise(root: Path) -> None:
    """Our init and configuration in the root; the host keys openssh-server's installation made go (every lab
    gets its own at boot)."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "rtvirt-lab").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "rtvirt-lab" / "sshd_config").write_text(SSHD_CONFIG)
    (root / "etc" / "libvirt").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "libvirt" / "qemu.conf").write_text(QEMU_CONF)
    (root / "etc" / "hostname").write_text("rtvirt-kvm-lab\n")
    # libvirtd resolves its built-in QEMU user and group before it reads qemu.conf
    with (root / "etc" / "passwd").open("a") as passwd:
        passwd.write(f"{QEMU_USER}:x:{QEMU_ID}:{QEMU_ID}::/var/lib/libvirt:/usr/sbin/nologin\n")
    with (root / "etc" / "group").open("a") as group:
        group.write(f"{QEMU_USER}:x:{QEMU_ID}:\nkvm:x:{QEMU_ID + 1}:\n")
    (root / "var" / "lib" / "libvirt" / "images").mkdir(parents=True, exist_ok=True)
    init = root / LAB_INIT.lstrip("/")
    init.parent.mkdir(parents=True, exist_ok=True)
    init.write_text(ROOT_INIT)
    init.chmod(0o755)


def boot_initramfs(arch: LabArch) -> tuple[Path, Path]:
    """(the lab's kernel, its base initramfs): Debian's kernel and busybox of the lab's architecture with the
    modules and our agents built for it."""
    shell = busybox(arch.name)
    vmlinuz, modules_dir = _fetch_kernel(arch_cache(arch.name), arch.kernel_flavour, arch.name)
    modules = _modules_in_load_order(modules_dir, (*arch.machine_modules, *arch.kvm_modules))
    agents = {name: agent_path(name, arch.name) for name in AGENTS}
    digest = hashlib.sha256(INITRAMFS_INIT.encode() + arch.kvm_name.encode())
    for path in [shell, *modules, *agents.values()]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    target = cache_dir() / IMAGE_DIR / f"boot-{arch.name}-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        mark_used(target)
        return vmlinuz, target
    archive = Cpio()
    for directory in ("bin", "proc", "sys", "dev", "rtvirt", "rtvirt/modules.d", "rtvirt/bin", "rtvirt/lab"):
        archive.directory(directory)
    archive.file("bin/busybox", shell.read_bytes(), executable=True)
    archive.file("init", INITRAMFS_INIT.encode(), executable=True)
    for module in modules:
        archive.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    archive.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    archive.file("rtvirt/kvm-module", arch.kvm_name.encode())
    for name, path in agents.items():
        archive.file(f"rtvirt/bin/{name}", path.read_bytes(), executable=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, archive.to_bytes())
    prune_cache(target.parent, f"boot-{arch.name}-*.cpio", target)
    return vmlinuz, target


def lab_files(host_key: Path, client_public: str) -> bytes:
    """The cpio appended to the base initramfs for one lab: its host key and the client key it authorises."""
    archive = Cpio()
    archive.file("rtvirt/lab/ssh_host_ed25519_key", host_key.read_bytes())
    archive.file("rtvirt/lab/authorized_keys", (client_public + "\n").encode())
    return archive.to_bytes()
