"""A test harness that runs rtvirt's aarch64 bare-metal kernel under real Linux KVM on arm64, without an ARM lab:
Debian's arm64 kernel boots at EL2 in qemu-system-aarch64 (``virtualization=on``, TCG) with a busybox initramfs
holding ``rtvb-vmm`` (vmm.c, our tiny VMM), our kernel's Image and the jobs to run; each job runs the kernel with
KVM_RUN on the emulated board's CPU 1, optionally beside a SCHED_FIFO host task on that CPU, and its sample stream
comes back base64-encoded on the serial console.

The emulated board's CPU 1 is a thread of this machine: it gets a host CPU of its own at SCHED_FIFO (the other
threads the other CPUs), or this machine's load takes it away in stretches no layer inside can see.

Debian's packages (linux-image-*-arm64, busybox-static) are fetched with ``apt-get download`` (the machine needs
``dpkg --add-architecture arm64``) into $RTVIRT_CACHE/armkvm and unpacked there with ``dpkg-deb -x``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rtvirt.agents import agent_path
from rtvirt.environments.guest_image import Cpio, cache_dir

HERE = Path(__file__).parent
VMM_SOURCE = HERE / "vmm.c"
CROSS_CC = "aarch64-linux-gnu-gcc"

INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t devtmpfs dev /dev
echo "HARNESS-EL $(dmesg | grep -o 'CPU: All CPU(s) started at EL[0-9]')"
for job in /jobs/*; do
  . "$job"
  echo "HARNESS-JOB $NAME"
  [ -n "$HOG" ] && /vmm hog $HOG &
  hog=$!
  /vmm run /Image "$PROBE" /tmp/stream.rtvs --gic=$GIC --cpu=1 $VMM_FLAGS > /tmp/console.txt 2> /tmp/vmm.err
  echo "HARNESS-VMM $?"
  [ -n "$HOG" ] && kill $hog 2>/dev/null
  cat /tmp/vmm.err
  echo "HARNESS-CONSOLE-BEGIN"; cat /tmp/console.txt; echo "HARNESS-CONSOLE-END"
  echo "HARNESS-STREAM-BEGIN"; base64 /tmp/stream.rtvs; echo "HARNESS-STREAM-END"
  HOG= VMM_FLAGS=
done
poweroff -f
"""


@dataclass
class Job:
    """One run of the kernel under KVM: its probe's command line, the vGIC, and the host task beside it
    (``hog``: "CPU PRIORITY SLICE_US PERIOD_US SECONDS")."""

    name: str
    probe: str
    hog: str = ""
    pvtime: bool = True


@dataclass
class JobResult:
    name: str
    vmm_status: int
    vmm_said: str
    console: str
    stream: bytes


def _fetch(work: Path) -> tuple[Path, Path]:
    """Debian's arm64 kernel and busybox, unpacked (fetched once)."""
    root = work / "root"
    kernels = sorted(root.glob("boot/vmlinuz-*-arm64"))
    if kernels and (root / "bin" / "busybox").exists():
        return kernels[-1], root / "bin" / "busybox"
    depends = subprocess.run(["apt-cache", "depends", "linux-image-arm64:arm64"], capture_output=True, text=True,
                             check=True).stdout
    image = re.search(r"Depends: (linux-image-[0-9.]+-[0-9]+-arm64)", depends)
    if image is None:
        raise RuntimeError(f"no arm64 kernel package: {depends[:300]} (dpkg --add-architecture arm64; apt-get update)")
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", f"{image.group(1)}:arm64", "busybox-static:arm64"], cwd=debs, check=True,
                   capture_output=True)
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return _fetch(work)


def _vmm(work: Path) -> Path:
    source = VMM_SOURCE.read_bytes()
    binary = work / f"rtvb-vmm-{hashlib.sha256(source).hexdigest()[:16]}"
    if not binary.exists():
        partial = binary.with_suffix(".tmp")
        subprocess.run([CROSS_CC, "-O2", "-static", "-Wall", "-Wextra", "-o", str(partial), str(VMM_SOURCE)],
                       check=True)
        partial.rename(binary)
    return binary


def run_jobs(jobs: list[Job], gic: int, timeout_s: float = 600) -> tuple[str, list[JobResult]]:
    """Boot the arm64 KVM host once (its GIC: ``gic``, the vGIC the jobs get) and run ``jobs`` in it: the
    console, and each job's result."""
    work = cache_dir() / "armkvm"
    work.mkdir(parents=True, exist_ok=True)
    kernel, busybox = _fetch(work)
    archive = Cpio()
    for directory in ("bin", "jobs"):
        archive.directory(directory)
    archive.file("bin/busybox", busybox.read_bytes(), executable=True)
    archive.file("init", INIT.encode(), executable=True)
    archive.file("vmm", _vmm(work).read_bytes(), executable=True)
    archive.file("Image", agent_path("rtvirt-baremetal", "aarch64").read_bytes())
    for index, job in enumerate(jobs):
        flags = "" if job.pvtime else "--no-pvtime"
        archive.file(f"jobs/{index:02d}", (f"NAME='{job.name}'\nPROBE='{job.probe}'\nGIC={gic}\nHOG='{job.hog}'\n"
                                           f"VMM_FLAGS='{flags}'\n").encode())
    with tempfile.TemporaryDirectory(prefix="rtvirt-armkvm-") as tmp:
        initrd, console, qmp = Path(tmp) / "initrd.cpio", Path(tmp) / "console.log", Path(tmp) / "qmp.sock"
        initrd.write_bytes(archive.to_bytes())
        argv = [shutil.which("qemu-system-aarch64") or "qemu-system-aarch64", "-M",
                f"virt,virtualization=on,gic-version={gic}", "-cpu", "cortex-a72", "-smp", "2", "-m", "1024",
                "-display", "none", "-nodefaults", "-no-reboot", "-S", "-name", "armkvm,debug-threads=on",
                "-qmp", f"unix:{qmp},server=on,wait=off", "-serial", f"file:{console}", "-kernel", str(kernel),
                "-initrd", str(initrd), "-append", "console=ttyAMA0 panic=-1 quiet rdinit=/init"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _place(proc, qmp)
            proc.wait(timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"qemu-system-aarch64 failed: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
        text = console.read_bytes().decode("utf-8", errors="replace").replace("\r", "")
    return text, _results(text)


def _place(proc: subprocess.Popen[bytes], qmp: Path) -> None:
    """The board's CPU 1 (where the jobs run) at SCHED_FIFO 80 alone on the last host CPU, everything else of
    QEMU on the others; then the board runs."""
    from qemu.qmp.legacy import QEMUMonitorProtocol

    deadline = time.monotonic() + 30
    while not qmp.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("qemu-system-aarch64 did not start")
        time.sleep(0.05)
    monitor = QEMUMonitorProtocol(str(qmp))
    monitor.connect()
    try:
        cpus = {int(c["cpu-index"]): int(c["thread-id"]) for c in monitor.cmd("query-cpus-fast")}  # type: ignore[call-overload]
        host = sorted(os.sched_getaffinity(0))
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), host[:-1] or host)
        os.sched_setaffinity(cpus[1], host[-1:])
        os.sched_setscheduler(cpus[1], os.SCHED_FIFO, os.sched_param(80))
        monitor.cmd("cont")
    finally:
        monitor.close()


def _between(text: str, begin: str, end: str) -> str:
    start = text.find(begin)
    stop = text.find(end, start)
    return text[start + len(begin):stop].strip("\n") if start >= 0 and stop > start else ""


def _results(text: str) -> list[JobResult]:
    results = []
    for chunk in text.split("HARNESS-JOB ")[1:]:
        name = chunk.splitlines()[0].strip()
        status = re.search(r"HARNESS-VMM (\d+)", chunk)
        said = chunk[status.end():chunk.find("HARNESS-CONSOLE-BEGIN")].strip() if status else ""
        try:
            stream = base64.b64decode(_between(chunk, "HARNESS-STREAM-BEGIN", "HARNESS-STREAM-END"))
        except binascii.Error:
            stream = b""
        results.append(JobResult(name, int(status.group(1)) if status else -1, said,
                                 _between(chunk, "HARNESS-CONSOLE-BEGIN", "HARNESS-CONSOLE-END"), stream))
    return results
