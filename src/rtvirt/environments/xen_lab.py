"""The Xen lab: a real Xen hypervisor and a small dom0, booted inside QEMU where no Xen host is at hand.

Built once and cached under the guest image's cache directory (``$RTVIRT_CACHE``, default
``~/.cache/rtvirt``):

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
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import RunError
from ..fileio import write_atomically
from ..procs import Supervisor
from ..units import duration_field
from .guest_image import (
    BUSYBOX,
    GUEST_MODULES,
    Cpio,
    _fetch_kernel,
    _modules_in_load_order,
    cache_dir,
    guest_image,
)

if TYPE_CHECKING:
    from ..remote import SshConnection

__all__ = ["A653_TOOL", "XEN_CONFIG_OPTIONS", "LabShare", "XenLab", "XenLabConfig", "a653_tool", "dom0_image",
           "local_domu_files", "reclaim_labs", "rt_hypervisor"]

# Kconfig options added to Debian's own hypervisor config: the real-time schedulers are "unsupported".
XEN_CONFIG_OPTIONS = ("CONFIG_EXPERT=y", "CONFIG_UNSUPPORTED=y", "CONFIG_SCHED_RTDS=y",
                      "CONFIG_SCHED_ARINC653=y", "CONFIG_SCHED_NULL=y")
PACKAGED_CONFIG_GLOB = "/boot/xen-4.*-amd64.config"
# Xen 4.17's RTDS crashes the hypervisor when the last pCPU of an RTDS cpupool leaves it (cpupool-destroy):
# rt_deinit_pdata -> move_repl_timer reads the cpupool that pCPU has just left (NULL, page fault). The
# lab's hypervisor gets this fix: with no pool left there is no pCPU to move the timer to, so it is killed.
RTDS_FIX = ("xen/common/sched/rt.c",
            """    cpumask_t *online = get_sched_res(old_cpu)->cpupool->res_valid;
    unsigned int new_cpu = cpumask_cycle(old_cpu, online);
""",
            """    const struct cpupool *pool = get_sched_res(old_cpu)->cpupool;
    unsigned int new_cpu = pool ? cpumask_cycle(old_cpu, pool->res_valid) : nr_cpu_ids;
""")
BUILD_TIMEOUT_S = 3600


def _run(argv: list[str], cwd: Path, what: str, timeout: float = BUILD_TIMEOUT_S,
         env: dict[str, str] | None = None) -> str:
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunError(f"xen lab: {what} failed: {exc}") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:] or ["no output"]
        raise RunError(f"xen lab: {what} failed: {' | '.join(line[:200] for line in tail)}")
    return result.stdout


def _packaged_config() -> Path:
    found = sorted(Path("/").glob(PACKAGED_CONFIG_GLOB.lstrip("/")))
    if not found:
        raise RunError("xen lab: no packaged Xen hypervisor config in /boot "
                       "(apt-get install xen-hypervisor-4.17-amd64; scripts/setup.sh does)")
    return found[-1]


def rt_hypervisor() -> Path:
    """The multiboot ELF of a Xen with RTDS, ARINC 653 and null; built on first use (a few minutes)."""
    config = _packaged_config()
    digest = hashlib.sha256(config.read_bytes() + "\n".join((*XEN_CONFIG_OPTIONS, *RTDS_FIX)).encode()).hexdigest()[:16]
    root = cache_dir() / "xen"
    target = root / f"xen-rt-{digest}.elf"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        # apt-get source needs the deb-src entry scripts/setup.sh adds; --download-only + dpkg-source
        # would be the same; this unpacks too. No build dependencies are installed beyond flex/bison.
        _run(["apt-get", "source", "--only-source", "xen"], work, "apt-get source xen", timeout=900)
        trees = [p for p in work.glob("xen-*") if p.is_dir() and (p / "xen" / "Makefile").exists()]
        if not trees:
            raise RunError("xen lab: apt-get source xen unpacked no source tree")
        xen_dir = trees[0] / "xen"
        fixed, before, after = trees[0] / RTDS_FIX[0], RTDS_FIX[1], RTDS_FIX[2]
        source = fixed.read_text()
        if before not in source:
            raise RunError(f"xen lab: {RTDS_FIX[0]} of this Xen source is not the one the RTDS fix is for")
        fixed.write_text(source.replace(before, after))
        text = config.read_text()
        for option in XEN_CONFIG_OPTIONS:
            name = option.split("=")[0]
            text = re.sub(rf"^(# )?{name}[ =].*$\n?", "", text, flags=re.M) + option + "\n"
        (xen_dir / ".config").write_text(text)
        env = {**os.environ, "XEN_TARGET_ARCH": "x86_64"}
        _run(["make", "olddefconfig"], xen_dir, "make olddefconfig", env=env)
        built = (xen_dir / ".config").read_text()
        for option in XEN_CONFIG_OPTIONS:
            if f"\n{option}\n" not in f"\n{built}":
                raise RunError(f"xen lab: the hypervisor config refused {option}")
        _run(["make", f"-j{os.cpu_count() or 1}"], xen_dir, "building the hypervisor", env=env)
        elf = xen_dir / "xen"
        if not elf.exists():
            raise RunError("xen lab: the hypervisor build left no xen/xen")
        write_atomically(target, elf.read_bytes())
        write_atomically(target.with_suffix(".config"), built.encode())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for old in root.glob("xen-rt-*.elf"):
        if old != target:
            with contextlib.suppress(OSError):
                old.unlink()
    return target


# ---- rtvirt-a653: xl sets no ARINC 653 schedule, libxenctrl does ------------------------------------

A653_TOOL = "rtvirt-a653"
A653_SOURCE = r"""/* rtvirt-a653: set or show the ARINC 653 schedule of a cpupool (xl has no command for it).
   argv: POOL_ID MAJOR_FRAME_NS then UUID VCPU RUNTIME_NS per window: sets it, prints nothing;
   argv: POOL_ID alone: prints "major_frame NS" and one "UUID VCPU RUNTIME_NS" line per window. */
#define __XEN_TOOLS__ 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xenctrl.h>

static int parse_uuid(const char *text, uint8_t out[16]) {
    int n = 0;
    for (const char *p = text; *p && n < 32; p++) {
        if (*p == '-') continue;
        char c = *p; int v;
        if (c >= '0' && c <= '9') v = c - '0';
        else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        else return -1;
        if (n % 2 == 0) out[n / 2] = (uint8_t)(v << 4); else out[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32 ? 0 : -1;
}

static int show(uint32_t pool) {
    static struct xen_sysctl_arinc653_schedule schedule;
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_get(xch, pool, &schedule);
    xc_interface_close(xch);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_get"); return 1; }
    printf("major_frame %llu\n", (unsigned long long)schedule.major_frame);
    for (int i = 0; i < schedule.num_sched_entries && i < ARINC653_MAX_DOMAINS_PER_SCHEDULE; i++) {
        const uint8_t *h = schedule.sched_entries[i].dom_handle;
        for (int b = 0; b < 16; b++) printf("%02x%s", h[b], (b == 3 || b == 5 || b == 7 || b == 9) ? "-" : "");
        printf(" %u %llu\n", schedule.sched_entries[i].vcpu_id,
               (unsigned long long)schedule.sched_entries[i].runtime);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2) return show((uint32_t)strtoul(argv[1], NULL, 10));
    if (argc < 6 || (argc - 3) % 3 != 0 || (argc - 3) / 3 > ARINC653_MAX_DOMAINS_PER_SCHEDULE) {
        fprintf(stderr, "usage: rtvirt-a653 POOL_ID MAJOR_FRAME_NS (UUID VCPU RUNTIME_NS)...\n");
        return 2;
    }
    static struct xen_sysctl_arinc653_schedule schedule;
    memset(&schedule, 0, sizeof(schedule));
    uint32_t pool = (uint32_t)strtoul(argv[1], NULL, 10);
    schedule.major_frame = strtoull(argv[2], NULL, 10);
    schedule.num_sched_entries = (uint8_t)((argc - 3) / 3);
    for (int i = 0; i < schedule.num_sched_entries; i++) {
        if (parse_uuid(argv[3 + 3 * i], schedule.sched_entries[i].dom_handle) != 0) {
            fprintf(stderr, "rtvirt-a653: bad UUID %.40s\n", argv[3 + 3 * i]);
            return 2;
        }
        schedule.sched_entries[i].vcpu_id = (uint32_t)strtoul(argv[4 + 3 * i], NULL, 10);
        schedule.sched_entries[i].runtime = strtoull(argv[5 + 3 * i], NULL, 10);
    }
    xc_interface *xch = xc_interface_open(NULL, NULL, 0);
    if (!xch) { perror("rtvirt-a653: xc_interface_open"); return 1; }
    int rc = xc_sched_arinc653_schedule_set(xch, pool, &schedule);
    if (rc != 0) { perror("rtvirt-a653: xc_sched_arinc653_schedule_set"); xc_interface_close(xch); return 1; }
    xc_interface_close(xch);
    return 0;
}
"""


def a653_tool() -> Path:
    """The ARINC 653 schedule setter, compiled against libxenctrl on first use (libxen-dev)."""
    digest = hashlib.sha256(A653_SOURCE.encode()).hexdigest()[:16]
    target = cache_dir() / "xen" / f"{A653_TOOL}-{digest}"
    if target.exists():
        return target
    if not Path("/usr/include/xenctrl.h").exists():
        raise RunError("xen: the ARINC 653 scheduler needs libxenctrl's headers (apt-get install libxen-dev; "
                       "scripts/setup.sh does)")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="a653-", dir=target.parent))
    try:
        (work / "a653.c").write_text(A653_SOURCE)
        _run(["cc", "-O2", "-Wall", "-o", str(work / A653_TOOL), str(work / "a653.c"), "-lxenctrl"], work,
             "compiling rtvirt-a653", timeout=300)
        os.replace(work / A653_TOOL, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


# ---- dom0's initramfs -------------------------------------------------------------------------------

TOOLSTACK = ("/usr/lib/xen-4.17/bin/xl", "/usr/lib/xen-4.17/bin/xenstored", "/usr/lib/xen-4.17/bin/xen-init-dom0",
             "/usr/lib/xen-4.17/bin/xenconsoled", "/usr/lib/xen-4.17/bin/libxl-save-helper",
             "/usr/lib/xen-4.17/bin/xenconsole", "/usr/bin/xenstore-read", "/usr/bin/xenstore-write",
             "/usr/bin/xenstore-rm", "/usr/sbin/sshd")
# xl dlopens libgcc_s for pthread_cancel; ldd does not name it
EXTRA_LIBRARIES = ("/lib/x86_64-linux-gnu/libgcc_s.so.1",)
DOM0_MODULES = ("xen_evtchn", "xen_privcmd", "xen_gntdev", "xen_gntalloc", "xenfs", "xen_netback",
                "virtio_pci", "virtio_net", "9p", "9pnet_virtio")  # 9p: host directories shared into dom0
DOMU_MODULES = (*GUEST_MODULES, "xen_netfront")
DOM0_READY_MARK = "RTVIRT-DOM0-READY"
DOM0_PATH = "/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DOM0_LIBRARY_PATH = "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"
DOMU_KERNEL = "/rtvirt/domu/vmlinuz"
DOMU_INITRAMFS = "/rtvirt/domu/base.cpio"
VIF_SCRIPT = "/etc/xen/scripts/rtvirt-vif"
# dom0's address on every domU link (a /32 on each vif) and the domUs' addresses, 10.213.0.N
DOM0_LINK_ADDRESS = "10.213.0.1"

DOM0_INIT = rf"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH={DOM0_PATH} LD_LIBRARY_PATH={DOM0_LIBRARY_PATH}
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /var/run/xen /var/lib/xen /var/lib/xenstored /var/log/xen /run/rtvirt /run/sshd
mount -t devpts devpts /dev/pts
for m in $(cat /rtvirt/modules); do insmod "/rtvirt/modules.d/$m" || echo "rtvirt: insmod $m failed"; done
mount -t xenfs xenfs /proc/xen
# host directories QEMU shares into dom0 (virtio-9p), one "TAG ro|rw" line each: mounted at /mnt/TAG
while read -r tag mode; do
  mkdir -p "/mnt/$tag"
  mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,cache=loose,$mode" "$tag" "/mnt/$tag" \
    || echo "rtvirt: mounting the 9p share $tag failed"
done < /rtvirt/shares
xenstored --pid-file /var/run/xen/xenstored.pid
n=0; until [ -s /var/run/xen/xenstored.pid ] || [ $n -gt 100 ]; do n=$((n+1)); sleep 0.1; done
xen-init-dom0
xenconsoled --log=guest --log-dir=/var/log/xen
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
chmod 600 /etc/ssh/ssh_host_ed25519_key
/usr/sbin/sshd -f /etc/ssh/sshd_config -E /var/log/sshd.log
echo "{DOM0_READY_MARK} $(cat /proc/uptime)"
while :; do sleep 3600; done
"""

# The hotplug script libxl runs for a domU's vif (online/offline): a point-to-point route to the domU's
# address. netback waits for hotplug-status before it connects the frontend.
VIF_HOTPLUG = rf"""#!/bin/sh
case "$1" in
online|add)
  address=$(xenstore-read "$XENBUS_PATH/ip")
  ip link set "$vif" up
  ip addr add {DOM0_LINK_ADDRESS}/32 dev "$vif"
  ip route add "$address/32" dev "$vif"
  xenstore-write "$XENBUS_PATH/hotplug-status" connected
  ;;
offline|remove)
  ip link set "$vif" down 2>/dev/null
  xenstore-rm "$XENBUS_PATH/hotplug-status" 2>/dev/null
  ;;
esac
exit 0
"""

SSHD_CONFIG = f"""Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
AuthorizedKeysFile /root/.ssh/authorized_keys
PidFile /run/sshd.pid
MaxSessions 64
MaxStartups 64
SetEnv PATH={DOM0_PATH} LD_LIBRARY_PATH={DOM0_LIBRARY_PATH}
"""


def _libraries(binaries: tuple[str, ...]) -> list[str]:
    """Every shared library the binaries load, as ldd names them (their paths kept in dom0)."""
    found: set[str] = set(EXTRA_LIBRARIES)
    for binary in binaries:
        output = _run(["ldd", binary], Path("/"), f"ldd {binary}", timeout=60)
        for line in output.splitlines():
            match = re.search(r"(/\S+)\s+\(0x", line)
            if match:
                found.add(match.group(1))
    return sorted(found)


# HVM domUs' device model and firmware (Debian's qemu-system-xen and seabios); the lab's dom0 gets them on first
# use. -vnc none still reads the default keymap.
DEVICE_MODEL = "/usr/libexec/xen-qemu-system-i386"
HVM_FIRMWARE = ("/usr/lib/xen-4.17/boot/hvmloader", "/usr/share/seabios/bios-256k.bin")
QEMU_DATA = Path("/usr/share/qemu")
QEMU_KEYMAPS = ("en-us",)
QEMU_DATA_LIMIT = 600_000  # option ROMs (linuxboot_dma.bin, ...) are small; the big firmware images are not needed


def hvm_archive() -> bytes:
    """A tar of what HVM domUs need in a lab's dom0 beyond its image: the device model, the libraries it adds,
    hvmloader, SeaBIOS and QEMU's option ROMs and keymap (about 30 MB), paths kept."""
    import io
    import tarfile

    missing = [path for path in (DEVICE_MODEL, *HVM_FIRMWARE) if not Path(path).exists()]
    if missing:
        raise RunError(f"xen: HVM domUs need {missing[0]} (apt-get install qemu-system-xen seabios; "
                       "scripts/setup.sh does)")
    in_image = set(_libraries(TOOLSTACK))
    data = [path for path in QEMU_DATA.iterdir() if path.is_file() and path.stat().st_size < QEMU_DATA_LIMIT]
    files = [Path(DEVICE_MODEL), *map(Path, HVM_FIRMWARE), *sorted(data),
             *(QEMU_DATA / "keymaps" / name for name in QEMU_KEYMAPS),
             *(Path(lib) for lib in _libraries((DEVICE_MODEL,)) if lib not in in_image)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in files:
            tar.add(path.resolve(), arcname=str(path).lstrip("/"))  # symlinks (ROMs) as the files they name
    return buffer.getvalue()


def _domu_base(modules_dir: Path, flavour: str = "linux") -> bytes:
    """The guest image's initramfs plus an overlay: the netfront driver and a module list naming it."""
    image = guest_image(flavour)
    modules = _modules_in_load_order(modules_dir, DOMU_MODULES)
    overlay = Cpio()
    for module in modules:
        overlay.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    overlay.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    return image.initramfs.read_bytes() + overlay.to_bytes()


def dom0_image() -> tuple[Path, Path]:
    """(dom0 kernel, dom0 base initramfs), the initramfs rebuilt when anything it holds changed."""
    missing = [path for path in (*TOOLSTACK, *EXTRA_LIBRARIES, str(BUSYBOX)) if not Path(path).exists()]
    if missing:
        raise RunError(f"xen lab: {missing[0]} is missing (scripts/setup.sh installs xen-utils-4.17, "
                       "openssh-server and busybox-static)")
    cache = cache_dir()
    vmlinuz, modules_dir = _fetch_kernel(cache)
    domu = _domu_base(modules_dir)
    modules = _modules_in_load_order(modules_dir, DOM0_MODULES)
    a653 = a653_tool()
    libraries = _libraries((*TOOLSTACK, str(a653)))
    files = [*TOOLSTACK, *libraries, str(BUSYBOX), *map(str, modules), str(a653)]
    digest = hashlib.sha256(DOM0_INIT.encode() + VIF_HOTPLUG.encode() + SSHD_CONFIG.encode() + domu)
    for path in files:
        digest.update(path.encode())
        digest.update(Path(path).read_bytes())
    target = cache / "xen" / f"dom0-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        return vmlinuz, target
    archive = Cpio()
    directories = {"bin", "sbin", "proc", "sys", "dev", "tmp", "run", "var", "var/log", "var/run", "var/lib",
                   "etc", "etc/ssh", "etc/xen", "etc/xen/scripts", "root", "root/.ssh", "rtvirt",
                   "rtvirt/modules.d", "rtvirt/domu", "var/empty"}
    for path in [*TOOLSTACK, *libraries]:
        parts = Path(path).parent.parts[1:]
        directories.update("/".join(parts[:i + 1]) for i in range(len(parts)))
    for directory in sorted(directories, key=lambda d: d.count("/")):
        archive.directory(directory)
    archive.file("bin/busybox", BUSYBOX.read_bytes(), executable=True)
    archive.file("init", DOM0_INIT.encode(), executable=True)
    for path in [*TOOLSTACK, *libraries]:
        archive.file(path.lstrip("/"), Path(path).read_bytes(), executable=True)
    archive.file(f"usr/lib/xen-4.17/bin/{A653_TOOL}", a653.read_bytes(), executable=True)
    for module in modules:
        archive.file(f"rtvirt/modules.d/{module.name}", module.read_bytes())
    archive.file("rtvirt/modules", "".join(f"{m.name}\n" for m in modules).encode())
    archive.file("rtvirt/shares", b"")  # a lab boot's overlay lists its shares
    archive.file(DOMU_KERNEL.lstrip("/"), vmlinuz.read_bytes())
    archive.file(DOMU_INITRAMFS.lstrip("/"), domu)
    archive.file(VIF_SCRIPT.lstrip("/"), VIF_HOTPLUG.encode(), executable=True)
    archive.file("etc/xen/xl.conf", b'autoballoon="off"\n')
    archive.file("etc/ssh/sshd_config", SSHD_CONFIG.encode())
    archive.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n")
    archive.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob("dom0-*.cpio"):
        old.unlink()
    write_atomically(target, archive.to_bytes())
    return vmlinuz, target


# ---- the lab: QEMU running Xen and dom0 -------------------------------------------------------------

QEMU = "qemu-system-x86_64"
LAB_ROOT = "xen-lab"
OWNER_FILE = "owner.pid"
QEMU_PID_FILE = "qemu.pid"
CONSOLE_LIMIT = 1 << 20
PANIC_MARK = "Panic on CPU"
PANIC_WINDOW = 1 << 16


class XenLabConfig(BaseModel):
    """The machine QEMU emulates for the lab and how Xen shares it with dom0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pcpus: int = Field(2, ge=1, le=8, description="physical CPUs of the emulated machine (Xen's pCPUs)")
    memory: int = Field(2048, ge=512, le=16384, description="memory of the emulated machine in MiB")
    dom0_memory: int = Field(768, ge=256, le=8192, description="dom0's memory in MiB")
    accel: Literal["auto", "kvm", "tcg"] = Field("auto", description="QEMU accelerator (auto: KVM if it helps)")
    boot_timeout: duration_field("s") = Field(240_000_000_000, ge=10_000_000_000,  # type: ignore[valid-type]
                                              description="time Xen and dom0 may take to come up")

    def key(self, dom0_vcpus: int) -> str:
        return f"xen-lab:{dom0_vcpus}:" + json.dumps(self.model_dump(mode="json"), sort_keys=True)


@dataclass(frozen=True)
class LabShare:
    """A host directory QEMU shares into the lab's dom0 (virtio-9p), mounted there at ``/mnt/<tag>``."""

    tag: str
    path: Path
    writable: bool = False


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

    def __init__(self, config: XenLabConfig, dom0_vcpus: int, supervisor: Supervisor,
                 shares: tuple[LabShare, ...] = ()) -> None:
        if dom0_vcpus >= config.pcpus:
            raise RunError(f"xen lab: dom0_vcpus ({dom0_vcpus}) leaves no pCPU of the lab's {config.pcpus} "
                           "for domUs")
        self.config = config
        self.dom0_vcpus = dom0_vcpus
        self.supervisor = supervisor
        for share in shares:
            # QEMU's option syntax: a comma would start another option
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", share.tag) or "," in str(share.path):
                raise RunError(f"xen lab: cannot share {share.path} as {share.tag!r} (tag: lower-case word; "
                               "path: no comma)")
        self.shares = shares
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
        from ..remote import SshTarget, connect
        from .qemu import choose_accel

        self.hypervisor = rt_hypervisor()
        vmlinuz, base = dom0_image()
        keys = self._keys()
        initrd = self.directory / "dom0.cpio"
        lab_files = Cpio()
        lab_files.file("etc/ssh/ssh_host_ed25519_key", keys.host_key.read_bytes())
        lab_files.file("root/.ssh/authorized_keys", (keys.client_public + "\n").encode())
        lab_files.file("rtvirt/shares", "".join(f"{share.tag} {'rw' if share.writable else 'ro'}\n"
                                                for share in self.shares).encode())
        with initrd.open("wb") as out, base.open("rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
            out.write(lab_files.to_bytes())
        for path in (vmlinuz, initrd):
            if "," in str(path):
                raise RunError(f"xen lab: QEMU cannot take a multiboot module path with a comma: {path}")
        self.accel = choose_accel(self.config.accel)
        kvm = self.accel["accel"] == "kvm"
        port = _free_port()
        xen_command_line = (f"console=com1 com1=115200 dom0_mem={self.config.dom0_memory}M,"
                            f"max:{self.config.dom0_memory}M dom0_max_vcpus={self.dom0_vcpus} "
                            "dom0_vcpus_pin noreboot sched=credit2")
        # TCG: qemu64 (-cpu max faults the PV dom0) with AMD's nested paging (+npt): Xen's HVM side needs it
        # for PVH/HVM domUs (Debian's Xen has no shadow paging); a dom0 running the host's own binaries from a
        # share needs more than qemu64 has (numpy and pyarrow die with SIGILL): Haswell-noTSX, PV domUs only
        cpu = "host" if kvm else "Haswell-noTSX" if self.shares else "qemu64,+npt"
        argv = [QEMU, "-accel", self.accel["accel"], "-cpu", cpu,
                "-smp", str(self.config.pcpus), "-m", str(self.config.memory),
                "-display", "none", "-nodefaults", "-no-reboot", "-serial", f"file:{self.console}",
                "-kernel", str(self.hypervisor), "-append", xen_command_line,
                "-initrd", f"{vmlinuz} console=hvc0 rdinit=/init quiet,{initrd}",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                "-device", "virtio-net-pci,netdev=n0"]
        for share in self.shares:
            # multidevs=remap: files of different host file systems (/proc, /sys) under one share
            # keep distinct inode numbers, else dom0's 9p client takes one for the other
            argv += ["-virtfs", f"local,path={share.path},mount_tag={share.tag},security_model=none,"
                     "multidevs=remap" + ("" if share.writable else ",readonly=on")]
        started = time.monotonic()
        self._proc = self.supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        (self.directory / QEMU_PID_FILE).write_text(str(self._proc.pid))
        deadline = started + self.config.boot_timeout / 1e9
        while DOM0_READY_MARK not in self.console_text():
            if self._proc.poll() is not None:
                error = self._proc.stderr.read(2000).decode(errors="replace") if self._proc.stderr else ""
                raise RunError(f"xen lab: QEMU exited while Xen booted: {error.strip()[-300:] or 'no message'}; "
                               f"console: {self.console_tail()}")
            if time.monotonic() > deadline:
                raise RunError(f"xen lab: dom0 did not come up within {self.config.boot_timeout / 1e9:.0f}s; "
                               f"console: {self.console_tail()}")
            time.sleep(0.2)
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
        self.boot_seconds = round(time.monotonic() - started, 1)
        return self

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


def local_domu_files(flavour: str = "linux") -> tuple[Path, Path]:
    """(kernel, initramfs) of a domU with the flavour's guest kernel (guest_image.KERNEL_PACKAGES): the guest
    image plus the netfront overlay. A local dom0 boots them from here; a lab's dom0 gets copies of them
    unless they are the ones its image holds (linux)."""
    vmlinuz, modules_dir = _fetch_kernel(cache_dir(), flavour)
    base = _domu_base(modules_dir, flavour)
    prefix = "domu-" if flavour == "linux" else f"domu-{flavour}-"
    target = cache_dir() / "xen" / f"{prefix}{hashlib.sha256(base).hexdigest()[:16]}.cpio"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob(f"{prefix}*.cpio"):
            if old.name.removeprefix(prefix).count("-") == 0:  # not another flavour's ("domu-linux-rt-...")
                old.unlink()
        write_atomically(target, base)
    return vmlinuz, target
