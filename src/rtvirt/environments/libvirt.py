"""libvirt: the workload in a libvirt domain, as KVM is deployed (domain XML with ``<cputune>``).

rtvirt writes the domain XML itself (vCPU and emulator pinning, ``vcpusched``, memory locking, hugepages,
NUMA placement) and talks to libvirtd through libvirt-python, locally (``qemu:///system``) or remotely
(``qemu+ssh://...``). Everything QEMU reads or writes goes through the libvirt connection, so a remote
host needs nothing from us beforehand:

- the guest kernel and the run's initramfs (guest_image.py) are uploaded as volumes of a storage pool
  libvirt owns (``rtvirt``, a directory under /var/lib/libvirt/images); libvirt's own security drivers
  (DAC ownership, AppArmor) then grant QEMU access to them, with no ``seclabel`` override;
- the console and the samples' virtio-serial port are read through the connection
  (``virDomainOpenConsole`` / ``virDomainOpenChannel``) and written to the run directory here.

The domain is defined, started paused, its streams are opened, and only then does it run. Every
domain carries an owner record (host, pid, process start time) in its metadata: ``reclaim`` destroys
and undefines the domains of a campaign that was killed, and only those.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import socket
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import InputError, RunError
from ..fileio import write_atomically
from ..params import CpuList, parse_cpulist
from ..units import duration_field
from . import baremetal
from .base import Environment, EnvironmentConfig, Launched, SharedResources
from .guest_image import (
    EXIT_MARK,
    GUEST_AGENT_DIR,
    READY_MARK,
    GuestImage,
    GuestJob,
    GuestKind,
    agent_failure,
    cache_dir,
    guest_description,
    guest_field,
    guest_image,
    guest_port_path,
    job_archive,
)
from .qemu import OUTPUT_PORT, TCG_WARNING, choose_accel

__all__ = ["LibvirtConfig", "LibvirtEnvironment", "VcpuSched", "DOMAIN_PREFIX"]

DOMAIN_PREFIX = "rtvirt-"
BAREMETAL_CONSOLE = "console1"  # libvirt's alias of the bare-metal guest's virtio console (console0 is COM1)
POOL_NAME = "rtvirt"
POOL_PATH = "/var/lib/libvirt/images/rtvirt"
OWNER_NS = "https://github.com/rtvirt/rtvirt/libvirt-owner"
XML_LIMIT = 1 << 16  # characters of the applied domain XML kept in the manifest
CONSOLE_LIMIT = 1 << 16  # bytes of the guest console kept (it is untrusted)
DRAIN_TIMEOUT_S = 10.0  # time the stream readers get to write the last samples after the guest stopped
MEMLOCK_OVERHEAD_MIB = 256  # locked memory QEMU needs beyond guest RAM (its own allocations)
CONNECT_TIMEOUT_S = 60.0  # time a libvirtd (and an SSH transport to it) gets to answer a new connection
# every connection pings libvirtd every KEEPALIVE_INTERVAL_S and is closed after KEEPALIVE_COUNT unanswered
# pings: a daemon that stopped serving (stopped, shutting down, an SSH session stalled) fails our calls
# within about half a minute instead of blocking them in libvirt's C code, where no signal reaches Python
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 6
URI_PATTERN = r"^qemu(\+(ssh|libssh|libssh2|tcp|tls|unix))?://[^\s'\"\\]*/(system|session)(\?[^\s'\"\\]*)?$"
CPUTUNE_CHILDREN = {"vcpupin", "emulatorpin", "iothreadpin", "vcpusched", "emulatorsched", "iothreadsched",
                    "shares", "period", "quota", "vcpu_period", "vcpu_quota", "global_period", "global_quota",
                    "emulator_period", "emulator_quota", "iothread_period", "iothread_quota", "cachetune",
                    "memorytune"}
RT_SYSCTL = Path("/proc/sys/kernel/sched_rt_runtime_us")
RT_RECORD = "libvirt-rt-throttling.json"  # under cache_dir(): what to restore after a kill -9
RT_REFUSED = "Cannot set scheduler parameters"  # libvirt's message when vcpusched is refused
MEMLOCK_REFUSED = "cannot limit locked memory"  # libvirt's message when QEMU's RLIMIT_MEMLOCK cannot be raised
CAP_SYS_RESOURCE = 24  # the capability that lets libvirtd raise a process's RLIMIT_MEMLOCK hard limit
RESCTRL = Path("/sys/fs/resctrl")
NUMA_ONLINE = Path("/sys/devices/system/node/online")

ET.register_namespace("rtvirt", OWNER_NS)


class VcpuSched(BaseModel):
    """The ``<vcpusched>`` of every vCPU: ``other`` (no element), or ``fifo`` / ``rr`` with a priority."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["other", "fifo", "rr"] = "other"
    priority: int = Field(1, ge=1, le=99, description="real-time priority of the vCPU threads")

    def describe(self) -> str:
        return "other" if self.policy == "other" else f"{self.policy}:{self.priority}"


class LibvirtConfig(EnvironmentConfig):
    kind: Literal["libvirt"] = "libvirt"
    uri: str = Field("qemu:///system", max_length=500, pattern=URI_PATTERN,
                     description="libvirt connection URI: qemu:///system, or qemu+ssh://user@host/system?keyfile=...")
    domain_type: Literal["auto", "kvm", "qemu"] = Field(
        "auto", description="kvm, qemu (TCG), or auto: kvm where it really accelerates")
    vcpus: int = Field(1, ge=1, le=64, description="virtual CPUs; vCPU i is pinned to the i-th of cpus (cycling)")
    memory: int = Field(256, ge=64, le=65536, description="guest memory in MiB")
    emulator_cpus: CpuList | None = Field(None, description="host CPUs for QEMU's other threads (emulatorpin; "
                                                            "default: the CPUs not in cpus, if any)")
    vcpu_sched: VcpuSched = Field(default_factory=lambda: VcpuSched(policy="other", priority=1),
                                  description="vcpusched of every vCPU")
    cputune: str | None = Field(None, max_length=65536,
                                description="a whole <cputune> element (as `rtvirt design` writes it); it "
                                            "replaces cpus, emulator_cpus and vcpu_sched")
    memory_locked: bool = Field(False, description="lock guest memory in host RAM (<memoryBacking><locked/>)")
    hugepages: bool = Field(False, description="back guest memory with the host's reserved hugepages")
    numa_nodes: CpuList | None = Field(None, description="host NUMA nodes guest memory must come from (strict)")
    rt_throttling: Literal["lift", "keep"] = Field(
        "lift", description="lift: as root on a local URI, set kernel.sched_rt_runtime_us=-1 while real-time "
                            "vCPUs run where cgroup v1 RT group scheduling would refuse them; keep: never")
    boot_timeout: duration_field("s") = Field(90_000_000_000, ge=1_000_000_000,  # type: ignore[valid-type]
                                              description="time the guest may take to boot (bare numbers in s)")
    guest: GuestKind = guest_field()

    @model_validator(mode="after")
    def _guest_this_environment_boots(self) -> LibvirtConfig:
        if self.guest == "baremetal" and self.vcpus != 1:
            raise ValueError("vcpus: the bare-metal guest runs on one vCPU (vcpus = 1)")
        return self

    @model_validator(mode="after")
    def _this_host_has_it(self) -> LibvirtConfig:
        # a local URI's libvirtd is this host: refuse what it cannot give before any domain exists
        # (a remote host's refusals come from libvirt when the domain is defined or started)
        if not self.local:
            return self
        problem = ((self.memory_locked and memlock_problem(self.memory))
                   or (self.cputune is not None and resctrl_problem(parse_cputune(self.cputune)))
                   or (self.numa_nodes and numa_problem(self.numa_nodes)))
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("cputune")
    @classmethod
    def _cputune_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cputune(value)
        return value

    @model_validator(mode="after")
    def _cputune_is_whole(self) -> LibvirtConfig:
        if self.cputune is None:
            return self
        if self.cpus is not None or self.emulator_cpus is not None or self.vcpu_sched.policy != "other":
            raise ValueError("cputune replaces cpus, emulator_cpus and vcpu_sched: give either, not both")
        if not self.pin:
            raise ValueError("cputune pins the domain: remove pin = false")
        for pin in parse_cputune(self.cputune).findall("vcpupin"):
            if int(pin.get("vcpu", "0")) >= self.vcpus:
                raise ValueError(f"cputune pins vCPU {pin.get('vcpu')} but the domain has vcpus = {self.vcpus}")
        return self

    @property
    def local(self) -> bool:
        """Whether the URI names this machine's libvirtd (no host part)."""
        return not urlsplit(self.uri).netloc


def parse_cputune(text: str) -> ET.Element:
    """A ``<cputune>`` element from text, checked enough that libvirt's own errors are about values only."""
    if "<!DOCTYPE" in text.upper() or "<!ENTITY" in text.upper():
        raise ValueError("cputune: DOCTYPE and ENTITY declarations are not accepted")
    try:
        element = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"cputune is not well-formed XML: {exc}") from None
    if element.tag != "cputune":
        raise ValueError(f"cputune must be a <cputune> element, not <{element.tag[:40]}>")
    for child in element:
        if child.tag not in CPUTUNE_CHILDREN:
            raise ValueError(f"cputune: <{str(child.tag)[:40]}> is not a <cputune> child libvirt knows")
        if child.tag == "vcpupin":
            if not (child.get("vcpu") or "").isdigit():
                raise ValueError("cputune: every <vcpupin> needs a numeric vcpu attribute")
            parse_cpulist(child.get("cpuset", ""))
    return element


_EVENT_LOOP_LOCK = threading.Lock()
_event_loop: threading.Thread | None = None


def _libvirt() -> Any:
    """The libvirt module, imported on first use (the CLI must start fast), with its stderr printer off and
    its event loop running.

    Console and channel streams are read from that loop (non-blocking), not by threads blocked in
    virStreamRecv: with a blocking reader on a connection, libvirt 9's client can leave another thread's
    call (virDomainGetXMLDesc while a stressor guest's console was being read) waiting for its reply forever.
    """
    try:
        import libvirt
    except ImportError:
        raise RunError("libvirt: the libvirt-python package is missing (run scripts/setup.sh)") from None
    global _event_loop
    with _EVENT_LOOP_LOCK:
        if _event_loop is None:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors reach us as exceptions
            libvirt.virEventRegisterDefaultImpl()  # before any connection opens, so that they all use it
            _event_loop = threading.Thread(target=_run_event_loop, args=(libvirt,), daemon=True,
                                           name="libvirt-events")
            _event_loop.start()
    return libvirt


def _run_event_loop(libvirt: Any) -> None:
    while True:
        libvirt.virEventRunDefaultImpl()


def _process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid); '' if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _error_text(exc: Exception) -> str:
    return " ".join(str(exc).split())[:400]


def _open_bounded(libvirt: Any, uri: str, timeout: float) -> Any:
    """``libvirt.open(uri)`` given ``timeout`` seconds: the opening handshake is not covered by keepalive,
    and a daemon that accepts the socket but never answers (one shutting down, or stopped; an SSH session
    whose virt-ssh-helper stalls) would block it in C forever, deaf to Ctrl-C and to signals. Past the
    timeout the opening thread is left behind (it closes the connection should it still arrive)."""
    outcome: dict[str, Any] = {}
    lock = threading.Lock()
    done = threading.Event()

    def opener() -> None:
        try:
            conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            outcome["error"] = exc
        else:
            with lock:
                if done.is_set():  # given up on: nobody will close it but us
                    with contextlib.suppress(libvirt.libvirtError):
                        conn.close()
                    return
                outcome["conn"] = conn
        done.set()

    threading.Thread(target=opener, daemon=True, name="libvirt-open").start()
    finished = done.wait(timeout)
    with lock:
        if not finished and "conn" not in outcome and "error" not in outcome:
            done.set()
            raise RunError(f"libvirt: {uri} did not answer within {timeout:.0f}s: libvirtd there accepts "
                           "connections but does not serve them (stopped, shutting down or hung; over SSH, the "
                           "session or virt-ssh-helper stalled)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["conn"]


class LibvirtConnection:
    """A connection to one libvirtd (one per domain, one for reclaim), and the storage pool that carries
    guest images to its host."""

    def __init__(self, uri: str) -> None:
        libvirt = _libvirt()
        self.uri = uri
        self.lock = threading.Lock()
        self._kernels: dict[str, str] = {}
        try:
            self.conn = _open_bounded(libvirt, uri, CONNECT_TIMEOUT_S)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt: cannot connect to {uri}: {_error_text(exc)} (libvirtd must run there: "
                           "`systemctl start libvirtd`, or without systemd `virtlogd -d && libvirtd -d`)") from None
        with contextlib.suppress(libvirt.libvirtError):  # drivers without keepalive (test://) run no daemon
            self.conn.setKeepAlive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def pool(self) -> Any:
        libvirt = _libvirt()
        with self.lock:
            try:
                pool = self.conn.storagePoolLookupByName(POOL_NAME)
            except libvirt.libvirtError:
                definition = ET.Element("pool", type="dir")
                ET.SubElement(definition, "name").text = POOL_NAME
                ET.SubElement(ET.SubElement(definition, "target"), "path").text = POOL_PATH
                try:
                    pool = self.conn.storagePoolCreateXML(ET.tostring(definition, encoding="unicode"),
                                                          libvirt.VIR_STORAGE_POOL_CREATE_WITH_BUILD)
                except libvirt.libvirtError as exc:
                    raise RunError(f"libvirt ({self.uri}): cannot create the storage pool {POOL_NAME} at "
                                   f"{POOL_PATH}: {_error_text(exc)}") from None
            if not pool.isActive():
                pool.create(0)
            return pool

    def volume_path(self, name: str) -> str:
        target = ET.fromstring(self.pool().XMLDesc(0)).findtext("target/path") or POOL_PATH
        return f"{target.rstrip('/')}/{name}"

    def upload(self, name: str, source: Path) -> str:
        """Copy ``source`` into the pool as volume ``name`` (replacing one of that name); its path there."""
        libvirt = _libvirt()
        pool = self.pool()
        size = source.stat().st_size
        with contextlib.suppress(libvirt.libvirtError):
            pool.storageVolLookupByName(name).delete(0)
        volume_xml = ET.Element("volume")
        ET.SubElement(volume_xml, "name").text = name
        ET.SubElement(volume_xml, "capacity", unit="bytes").text = str(size)
        target = ET.SubElement(volume_xml, "target")
        ET.SubElement(target, "format", type="raw")
        try:
            volume = pool.createXML(ET.tostring(volume_xml, encoding="unicode"), 0)
            stream = self.conn.newStream(0)
            volume.upload(stream, 0, size, 0)
            with source.open("rb") as data:
                stream.sendAll(lambda _stream, nbytes, f: f.read(nbytes), data)
            stream.finish()
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt ({self.uri}): uploading {source.name} failed: {_error_text(exc)}") from None
        return str(volume.path())

    def kernel(self, source: Path) -> str:
        """The guest kernel in the pool, uploaded once per content (kept as a cache like ~/.cache/rtvirt)."""
        digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
        if digest not in self._kernels:
            name = f"{DOMAIN_PREFIX}kernel-{digest}"
            libvirt = _libvirt()
            try:
                volume = self.pool().storageVolLookupByName(name)
                present = volume.info()[1] == source.stat().st_size
            except libvirt.libvirtError:
                present = False
            self._kernels[digest] = str(volume.path()) if present else self.upload(name, source)
        return self._kernels[digest]

    def delete_volume(self, name: str) -> bool:
        libvirt = _libvirt()
        try:
            self.pool().storageVolLookupByName(name).delete(0)
        except libvirt.libvirtError:
            return False
        return True


def _connection(shared: SharedResources, uri: str) -> LibvirtConnection:
    return shared.get(f"libvirt:{uri}", lambda: LibvirtConnection(uri))


def _mounts() -> list[list[str]]:
    """The fields of each line of /proc/mounts."""
    try:
        return [line.split() for line in Path("/proc/mounts").read_text()[:1 << 20].splitlines()]
    except OSError:
        return []


def _v1_cpu_controller() -> Path | None:
    """The cgroup v1 cpu controller's mount point if RT group scheduling is active there."""
    for fields in _mounts():
        if len(fields) > 3 and fields[2] == "cgroup" and "cpu" in fields[3].split(","):
            mount = Path(fields[1])
            return mount if (mount / "cpu.rt_runtime_us").exists() else None
    return None


def _meminfo_kib(field: str) -> int | None:
    """A field of /proc/meminfo (kB, or a count for the HugePages_ ones); None if absent."""
    try:
        for line in Path("/proc/meminfo").read_text()[:1 << 16].splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def hugepage_problem(memory_mib: int) -> str | None:
    """Why this host cannot back ``memory_mib`` of guest RAM with hugepages (None: it can).

    libvirt only finds hugetlbfs mounts when libvirtd starts, and QEMU fails late (after the domain was
    defined) with a message that does not say what to reserve; this says it up front.
    """
    size_kib = _meminfo_kib("Hugepagesize")
    free = _meminfo_kib("HugePages_Free")
    if not size_kib or free is None:
        return "hugepages = true: this kernel has no hugetlb support (no Hugepagesize in /proc/meminfo)"
    needed = -(-memory_mib * 1024 // size_kib)
    if free < needed:
        return (f"hugepages = true: the guest's {memory_mib} MiB need {needed} free hugepages of {size_kib} kB, "
                f"the host has {free} (HugePages_Free in /proc/meminfo); reserve them with "
                f"`sysctl -w vm.nr_hugepages=N` (N = HugePages_Total + {needed - free} or more)")
    if not any(len(fields) > 2 and fields[2] == "hugetlbfs" for fields in _mounts()):
        return ("hugepages = true: no hugetlbfs is mounted, so libvirt cannot give QEMU hugepages: "
                "`mount -t hugetlbfs hugetlbfs /dev/hugepages`, then restart libvirtd (it looks for mounts at start)")
    return None


def _libvirtd_status() -> tuple[str, str, str]:
    """(/proc status, /proc limits, who) of the running libvirtd, else of this process (libvirtd started
    from here inherits its capability bounding set and limits)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "libvirtd":
                return ((entry / "status").read_text(), (entry / "limits").read_text(), f"libvirtd (pid {entry.name})")
    return (Path("/proc/self/status").read_text(), Path("/proc/self/limits").read_text(),
            "this host (libvirtd is not running; started from here it would inherit these)")


def memlock_problem(memory_mib: int) -> str | None:
    """Why libvirtd cannot lock ``memory_mib`` of guest RAM in QEMU (None: it can).

    libvirt sets QEMU's RLIMIT_MEMLOCK (soft and hard) to the domain's hard_limit: raising a hard limit
    needs CAP_SYS_RESOURCE, lowering it does not. Without the capability and with a smaller hard limit,
    QEMU's start fails ("cannot limit locked memory"); this says so before a domain is defined.
    """
    needed_mib = memory_mib + MEMLOCK_OVERHEAD_MIB
    status, limits, who = _libvirtd_status()
    caps = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    if caps is None or int(caps.group(1), 16) >> CAP_SYS_RESOURCE & 1:
        return None
    hard = re.search(r"^Max locked memory\s+\S+\s+(\S+)", limits, re.M)
    if hard is None or hard.group(1) == "unlimited" or int(hard.group(1)) >= needed_mib << 20:
        return None
    return (f"memory_locked = true: libvirt must raise QEMU's locked-memory limit (RLIMIT_MEMLOCK) to {needed_mib} "
            f"MiB (guest memory + {MEMLOCK_OVERHEAD_MIB} MiB for QEMU), which needs CAP_SYS_RESOURCE; {who} lacks it "
            f"(CapEff {caps.group(1).lstrip('0') or '0'}) and its hard limit is {int(hard.group(1)) >> 10} KiB "
            "(`ulimit -Hl`): run libvirtd with CAP_SYS_RESOURCE (a container must not drop it) or with a hard "
            f"RLIMIT_MEMLOCK of at least {needed_mib} MiB, or set memory_locked = false")


def resctrl_problem(cputune: ET.Element) -> str | None:
    """Why this host cannot apply ``<cachetune>``/``<memorytune>`` (None: it can, or none is asked for).

    libvirt allocates cache ways and memory bandwidth through the kernel's resctrl file system, which
    only exists with CPU support (Intel RDT, AMD PQoS) and must be mounted at /sys/fs/resctrl.
    """
    asked = [child.tag for child in cputune if child.tag in ("cachetune", "memorytune")]
    if not asked or (RESCTRL / "info").is_dir():
        return None
    try:
        flags = set(re.findall(r"\b(rdt_a|cat_l3|cat_l2|mba)\b", Path("/proc/cpuinfo").read_text()[:1 << 16]))
    except OSError:
        flags = set()
    fix = (f"mount it (`mount -t resctrl resctrl {RESCTRL}`), then restart libvirtd" if flags else
           "this CPU (or the hypervisor this host runs in) offers no cache allocation (no rdt_a/cat_l3/mba in "
           "/proc/cpuinfo): remove them, or run on a host that has it")
    return (f"cputune: <{asked[0]}> needs the kernel's resctrl file system at {RESCTRL}, which this host lacks; "
            f"{fix}")


def numa_problem(nodes: tuple[int, ...]) -> str | None:
    """Which of ``nodes`` this host does not have (None: it has them all)."""
    try:
        online = set(parse_cpulist(NUMA_ONLINE.read_text().strip()))
    except (OSError, ValueError):
        online = {0}  # a kernel without NUMA: one node
    missing = sorted(set(nodes) - online)
    if not missing:
        return None
    return (f"numa_nodes: this host has no NUMA node {','.join(map(str, missing))} (online: "
            f"{','.join(map(str, sorted(online)))}, from {NUMA_ONLINE})")


def _rt_sysctl() -> int | None:
    try:
        return int(RT_SYSCTL.read_text().strip())
    except (OSError, ValueError):
        return None


class RtThrottlingLifted:
    """kernel.sched_rt_runtime_us = -1 for a campaign, restored at its end (and by reclaim after a kill -9).

    Under cgroup v1 RT group scheduling the kernel refuses SCHED_FIFO/RR to a thread whose cgroup has
    cpu.rt_runtime_us = 0, and libvirt creates each domain's cgroups (machine/qemu-N-NAME.libvirt-qemu/vcpuN)
    with exactly that at start, so no budget given beforehand can reach them. With throttling lifted the
    kernel does not check group budgets at all; it also drops the 5% of CPU time real-time threads leave to
    others, which is why it is recorded in the manifest and undone afterwards.
    """

    def __init__(self) -> None:
        self.was = _rt_sysctl()
        self._record = cache_dir() / RT_RECORD
        if self.was is None or self.was < 0:
            self.changed = False
            return
        write_atomically(self._record, json.dumps({"was": self.was, "pid": os.getpid(),
                                                   "started": _process_start(os.getpid())}))
        RT_SYSCTL.write_text("-1\n")
        self.changed = True

    def describe(self) -> dict[str, Any]:
        return {"kernel.sched_rt_runtime_us": {"before": self.was, "during": -1 if self.changed else self.was},
                "why": "cgroup v1 RT group scheduling gives libvirt's new vCPU cgroups cpu.rt_runtime_us = 0"}

    def close(self) -> None:
        if self.changed:
            RT_SYSCTL.write_text(f"{self.was}\n")
            self._record.unlink(missing_ok=True)
            self.changed = False

    @staticmethod
    def restore_after_kill() -> str | None:
        """Undo the lift of a killed rtvirt (its record names a process that is gone); what was done."""
        record = cache_dir() / RT_RECORD
        try:
            data = json.loads(record.read_text()[:4096])
            was, pid, started = int(data["was"]), int(data["pid"]), str(data["started"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if started and _process_start(pid) == started:
            return None  # its campaign still runs
        RT_SYSCTL.write_text(f"{was}\n")
        record.unlink(missing_ok=True)
        return f"kernel.sched_rt_runtime_us = {was} (lifted by a killed campaign)"


def _rt_refusal_diagnosis(uri: str, local: bool) -> str:
    """Why libvirt could not give the vCPUs a real-time policy, and how to fix it on the host."""
    fixes = ("fix it on the host with `sysctl -w kernel.sched_rt_runtime_us=-1` (lifts RT throttling, which "
             "rtvirt does itself as root on a local URI unless rt_throttling = \"keep\"), or remove \"cpu\" "
             "from cgroup_controllers in /etc/libvirt/qemu.conf and restart libvirtd")
    mount = _v1_cpu_controller() if local else None
    if mount is None:
        return (f"libvirt ({uri}) was refused a real-time vcpusched (EPERM): where cgroup v1 RT group "
                f"scheduling is on, libvirt's new vCPU cgroups get cpu.rt_runtime_us = 0; {fixes}")
    machine = mount / "machine" / "cpu.rt_runtime_us"
    try:
        machine_value = machine.read_text().strip()[:20]
    except OSError:
        machine_value = "missing"
    return (f"libvirt ({uri}) was refused a real-time vcpusched (EPERM): cgroup v1 RT group scheduling is on "
            f"({mount}/cpu.rt_runtime_us exists; {machine} = {machine_value}) and libvirt creates each "
            f"domain's vcpuN cgroup under {mount}/machine with cpu.rt_runtime_us = 0, which forbids SCHED_FIFO/RR "
            f"there; kernel.sched_rt_runtime_us = {_rt_sysctl()}; {fixes}")


class _StreamToFile:
    """Copies a non-blocking libvirt stream (console or channel) to a file from the event loop, until the
    guest closes it."""

    def __init__(self, stream: Any, path: Path, keep: bytearray | None = None) -> None:
        self.stream, self.path, self.keep = stream, path, keep
        self.received = 0
        self.ended = ""  # why the stream ended, once it has: "end of stream" or libvirt's error
        self.ended_at = 0.0
        self._out = path.open("ab", buffering=0)
        self._lock = threading.Lock()
        self._done = threading.Event()

    def start(self) -> None:
        libvirt = _libvirt()
        events = (libvirt.VIR_STREAM_EVENT_READABLE | libvirt.VIR_STREAM_EVENT_ERROR
                  | libvirt.VIR_STREAM_EVENT_HANGUP)
        self.stream.eventAddCallback(events, self._readable, None)

    def _readable(self, stream: Any, _events: int, _opaque: object) -> None:
        libvirt = _libvirt()
        with self._lock:
            while not self._done.is_set():
                try:
                    data = stream.recv(1 << 16)
                except libvirt.libvirtError as exc:
                    self._finish(abort=True, why=_error_text(exc))
                    return
                if isinstance(data, int):  # -2: nothing more for now
                    return
                if not data:  # end of stream: the guest side closed
                    self._finish(abort=False, why="end of stream")
                    return
                self._out.write(data)
                self.received += len(data)
                if self.keep is not None and len(self.keep) < CONSOLE_LIMIT:
                    self.keep += data[:CONSOLE_LIMIT - len(self.keep)]

    def _finish(self, abort: bool, why: str) -> None:
        """Called with the lock held: unregister, close the stream and the file, wake drain()."""
        self.ended, self.ended_at = why, time.monotonic()
        with contextlib.suppress(Exception):
            self.stream.eventRemoveCallback()
        with contextlib.suppress(Exception):
            self.stream.abort() if abort else self.stream.finish()
        self._out.close()
        self._done.set()

    def pump(self) -> None:
        """Take what libvirt already holds for this stream, from the calling thread: samples keep moving
        even if the event loop falls behind (the run's poll loop calls this)."""
        self._readable(self.stream, 0, None)

    def join(self, timeout: float) -> None:
        self.pump()
        self._done.wait(timeout)

    def stop(self) -> None:
        with self._lock:
            if not self._done.is_set():
                self._finish(abort=True, why="closed by rtvirt")


class DomainProcess:
    """A running domain in the shape of an agent process: it has exited once the domain is shut off."""

    def __init__(self, env: LibvirtEnvironment) -> None:
        self._env = env
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            crashed = self._env.stopped()
            if crashed is not None:
                self._env.drain()  # every sample on disk before the run reads the stream's end
                self._returncode = 1 if crashed else 0
                if self._env.config.guest == "baremetal":  # it ends the VM by a triple fault: its status is said
                    failure = baremetal.guest_error(self._env.console_text())
                    self._returncode = failure[0] if failure else 0
        return self._returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the domain did not stop within {timeout:.0f}s")
            time.sleep(0.2)
        assert self._returncode is not None
        return self._returncode

    def error_tail(self) -> str:
        return self._env.console_text()[-300:]


class LibvirtEnvironment(Environment):
    kind = "libvirt"
    config_model = LibvirtConfig
    on_host = False
    config: LibvirtConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connection: LibvirtConnection | None = None
        self._domain: Any = None
        self._name = ""
        self._type: dict[str, str] = {}
        self._initrd_volume = ""
        self._baremetal_cmdline = ""
        self._readers: list[_StreamToFile] = []
        self._channel_reader: _StreamToFile | None = None
        self._console = bytearray()
        self._console_file = self.workdir / "console.log"
        self._launched_at = 0.0
        self._ready_at: float | None = None
        self._applied_xml = ""
        self._rt: RtThrottlingLifted | None = None
        self._versions: dict[str, str] = {}
        self._image: GuestImage | None = None

    @staticmethod
    def available() -> str | None:
        if importlib.util.find_spec("libvirt") is None:
            return "libvirt-python is not installed (run scripts/setup.sh)"
        return None

    @classmethod
    def reclaim(cls, config: EnvironmentConfig, shared: SharedResources) -> list[str]:
        assert isinstance(config, LibvirtConfig)
        libvirt = _libvirt()
        connection = _connection(shared, config.uri)
        removed = []
        me = socket.gethostname()[:64]
        for domain in connection.conn.listAllDomains(0):
            name = str(domain.name())
            if not name.startswith(DOMAIN_PREFIX):
                continue
            try:
                owner = ET.fromstring(domain.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, OWNER_NS, 0))
                host, pid, started = owner.get("host"), int(owner.get("pid", "0")), owner.get("started", "")
            except (libvirt.libvirtError, ET.ParseError, ValueError):
                continue  # not ours to judge: no owner record
            if host != me or (started and _process_start(pid) == started):
                continue  # another machine's campaign, or one still running
            _destroy_and_undefine(domain, config.uri)
            connection.delete_volume(f"{name}.initrd")
            removed.append(f"libvirt domain {name} ({config.uri})")
        # an initrd whose domain is gone (its run lost libvirtd): a domain is defined before its initrd exists,
        # so a running campaign's initrd always has its domain
        defined = {str(domain.name()) for domain in connection.conn.listAllDomains(0)}
        for volume in connection.pool().listVolumes():
            if volume.startswith(DOMAIN_PREFIX) and volume.endswith(".initrd") and \
                    volume.removesuffix(".initrd") not in defined and connection.delete_volume(volume):
                removed.append(f"libvirt volume {volume} ({config.uri})")
        if config.local and os.geteuid() == 0:
            restored = RtThrottlingLifted.restore_after_kill()
            if restored:
                removed.append(restored)
        return removed

    # placement -------------------------------------------------------------------------------------

    def _online_cpus(self) -> list[int]:
        if self.config.local:
            return sorted(os.sched_getaffinity(0))
        _, online, _ = self._conn().conn.getCPUMap(0)
        return [cpu for cpu, up in enumerate(online) if up]

    def _host_cpus(self) -> tuple[int, ...]:
        """Host CPUs for vCPU i = the i-th of these (cycling); default: the last CPU first, then downwards."""
        if self.config.cputune is not None:
            pins = {int(p.get("vcpu", "0")): parse_cpulist(p.get("cpuset", ""))[0]
                    for p in parse_cputune(self.config.cputune).findall("vcpupin")}
            if pins:
                return tuple(pins.get(i, pins[min(pins)]) for i in range(self.config.vcpus))
        allowed = sorted(self._online_cpus(), reverse=True)
        if not self.config.pin:
            return tuple(sorted(allowed))
        return tuple(self.config.cpus) if self.config.cpus else tuple(allowed[:self.config.vcpus])

    def measured_cpus(self) -> tuple[int, ...]:
        # the workload runs on vCPU 0 (other vCPUs serve helpers such as the wakeup probe's sender)
        return self._host_cpus()[:1] if self.config.pin else self._host_cpus()

    def probe_overrides(self) -> dict[str, Any]:
        return {"affinity": (0,)}

    def emulator_cpus(self) -> tuple[int, ...]:
        if self.config.emulator_cpus:
            return tuple(self.config.emulator_cpus)
        vcpu_cpus = set(self._host_cpus()[:self.config.vcpus])
        others = tuple(c for c in sorted(self._online_cpus()) if c not in vcpu_cpus)
        return others or tuple(sorted(vcpu_cpus))

    def _realtime_vcpus(self) -> bool:
        if self.config.cputune is not None:
            return any(s.get("scheduler") in ("fifo", "rr")
                       for s in parse_cputune(self.config.cputune).findall("vcpusched"))
        return self.config.vcpu_sched.policy in ("fifo", "rr")

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

    # the domain ------------------------------------------------------------------------------------

    def _conn(self) -> LibvirtConnection:
        # each domain has its own connection, closed with it: its streams never queue behind another
        # domain's on one client, and no connection (an SSH session for remote URIs) outlives its run
        if self._connection is None:
            self._connection = LibvirtConnection(self.config.uri)
        return self._connection

    def start(self) -> None:
        connection = self._conn()
        if not self._versions:
            with contextlib.suppress(Exception):
                self._versions = {"libvirt": _version(connection.conn.getLibVersion()),
                                  "hypervisor": _version(connection.conn.getVersion())}
        if not self._type:
            self._type = self._choose_type(connection)
        if (self._rt is None and self._realtime_vcpus() and self.config.rt_throttling == "lift"
                and self.config.local and os.geteuid() == 0 and _v1_cpu_controller() is not None):
            self._rt = self.shared.get("libvirt:rt-throttling", RtThrottlingLifted)

    def _choose_type(self, connection: LibvirtConnection) -> dict[str, str]:
        requested = self.config.domain_type
        if requested != "auto":
            return {"type": requested, "reason": "requested"}
        if self.config.local:
            decision = choose_accel("auto")
            return {"type": "kvm" if decision["accel"] == "kvm" else "qemu", "reason": str(decision["reason"])}
        capabilities = ET.fromstring(connection.conn.getCapabilities())
        offered = {d.get("type") for d in capabilities.iter("domain")}
        if "kvm" in offered:
            return {"type": "kvm", "reason": "the remote host offers KVM"}
        return {"type": "qemu", "reason": "the remote host offers no KVM"}

    def _domain_xml(self, kernel: str, initrd: str | None, with_output: bool) -> str:
        config = self.config
        root = ET.Element("domain", type=self._type["type"])
        ET.SubElement(root, "name").text = self._name
        ET.SubElement(ET.SubElement(root, "metadata"), f"{{{OWNER_NS}}}owner",
                      host=socket.gethostname()[:64], pid=str(os.getpid()), started=_process_start(os.getpid()))
        ET.SubElement(root, "memory", unit="MiB").text = str(config.memory)
        ET.SubElement(root, "vcpu", placement="static").text = str(config.vcpus)
        cputune = self._cputune()
        if len(cputune):
            root.append(cputune)
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
        os_element = ET.SubElement(root, "os")
        ET.SubElement(os_element, "type", arch="x86_64").text = "hvm"
        ET.SubElement(os_element, "kernel").text = kernel
        if initrd is None:  # the bare-metal guest (multiboot): the probe's argv is its command line
            ET.SubElement(os_element, "cmdline").text = self._baremetal_cmdline
        else:
            ET.SubElement(os_element, "initrd").text = initrd
            # no_timer_check: a vCPU starved under TCG fails the kernel's IO-APIC timer check and panics at boot
            ET.SubElement(os_element, "cmdline").text = "console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check"
        ET.SubElement(ET.SubElement(root, "features"), "acpi")  # the guest's poweroff ends the domain
        ET.SubElement(root, "cpu", mode="host-passthrough" if self._type["type"] == "kvm" else "maximum")
        for event in ("on_poweroff", "on_reboot", "on_crash"):
            ET.SubElement(root, event).text = "destroy"
        devices = ET.SubElement(root, "devices")
        ET.SubElement(ET.SubElement(devices, "serial", type="pty"), "target", port="0")
        ET.SubElement(ET.SubElement(devices, "console", type="pty"), "target", type="serial", port="0")
        if initrd is None:
            # the bare-metal guest's driver writes to port 0 of a virtio-console without multiport
            # (ports = 1): libvirt makes a second <console> of target virtio that virtconsole
            ET.SubElement(devices, "controller", type="virtio-serial", index="0", ports="1")
            if with_output:
                # a pty: libvirt puts the stream's end of it in raw mode, so binary records pass unchanged
                ET.SubElement(ET.SubElement(devices, "console", type="pty"), "target", type="virtio")
        else:
            ET.SubElement(devices, "controller", type="virtio-serial", index="0")
        if with_output and initrd is not None:
            channel = ET.SubElement(devices, "channel", type="unix")
            ET.SubElement(channel, "source", mode="bind")
            ET.SubElement(channel, "target", type="virtio", name=OUTPUT_PORT)
        ET.SubElement(devices, "memballoon", model="none")
        return ET.tostring(root, encoding="unicode")

    def launch(self, agent: str, args: list[str], out: Path | None) -> Launched:
        libvirt = _libvirt()
        self.start()
        connection = self._conn()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.config.hugepages and self.config.local:
            problem = hugepage_problem(self.config.memory)
            if problem:
                raise RunError(f"libvirt: {problem}")
        self._name = f"{DOMAIN_PREFIX}{self.config.label}-{uuid.uuid4().hex[:8]}"
        initrd: Path | None = None
        if self.config.guest == "baremetal":  # our own kernel (multiboot): no initrd, the probe's argv on <cmdline>
            self._baremetal_cmdline = baremetal.command_line(agent, args)
            channel = BAREMETAL_CONSOLE
            definition = self._domain_xml(connection.kernel(baremetal.kernel_path()), None, out is not None)
        else:
            image = self._image = guest_image(self.config.guest)
            argv = [f"{GUEST_AGENT_DIR}/{agent}", *args]
            if out is not None:
                argv.append(f"--out={guest_port_path(OUTPUT_PORT)}")
            initrd = image.initramfs_with_jobs(job_archive(GuestJob(argv)), self.workdir)
            self._initrd_volume = f"{self._name}.initrd"
            channel = OUTPUT_PORT
            definition = self._domain_xml(connection.kernel(image.kernel), connection.volume_path(self._initrd_volume),
                                          out is not None)
        try:
            # defined before its initrd exists, so that reclaim never sees a volume without its domain
            self._domain = connection.conn.defineXML(definition)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt ({self.config.uri}) rejected the domain: {_error_text(exc)}") from None
        self._applied_xml = str(self._domain.XMLDesc(0))[:XML_LIMIT]
        if initrd is not None:
            connection.upload(self._initrd_volume, initrd)
        try:
            self._domain.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
        except libvirt.libvirtError as exc:
            if RT_REFUSED in str(exc):
                raise RunError(_rt_refusal_diagnosis(self.config.uri, self.config.local)) from None
            if MEMLOCK_REFUSED in str(exc):
                raise RunError(
                    f"libvirt ({self.config.uri}) could not lock guest memory (memory_locked = true): raising QEMU's "
                    f"RLIMIT_MEMLOCK to {self.config.memory + MEMLOCK_OVERHEAD_MIB} MiB needs CAP_SYS_RESOURCE, "
                    "which libvirtd lacks there (a container or a restricted capability bounding set: see CapBnd "
                    "in /proc/<libvirtd pid>/status); give libvirtd that capability or set memory_locked = "
                    f"false ({_error_text(exc)})") from None
            raise RunError(f"libvirt ({self.config.uri}) could not start {self._name}: {_error_text(exc)}") from None
        self._applied_xml = str(self._domain.XMLDesc(0))[:XML_LIMIT]
        self._open_stream(None, self._console_file, self._console)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            self._channel_reader = self._open_stream(channel, out, None)
        self._domain.resume()
        self._launched_at = time.monotonic()
        return Launched(DomainProcess(self), out)

    def _open_stream(self, channel: str | None, path: Path, keep: bytearray | None) -> _StreamToFile:
        libvirt = _libvirt()
        stream = self._conn().conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        try:
            if channel == BAREMETAL_CONSOLE:
                self._domain.openConsole(channel, stream, 0)
            elif channel is None:
                self._domain.openConsole(None, stream, 0)
            else:
                self._domain.openChannel(channel, stream, 0)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt ({self.config.uri}): cannot open the {channel or 'console'} of "
                           f"{self._name}: {_error_text(exc)}") from None
        reader = _StreamToFile(stream, path, keep)
        reader.start()
        self._readers.append(reader)
        return reader

    def stopped(self) -> bool | None:
        """None while the domain runs; else whether it crashed."""
        libvirt = _libvirt()
        if self._domain is None:
            return False
        try:
            state, reason = self._domain.state(0)
        except libvirt.libvirtError as exc:
            if _domain_gone(exc):
                return False  # gone: destroyed by close()
            # the connection failed (keepalive closed it: libvirtd stopped answering): not a guest that ended
            raise RunError(f"libvirt ({self.config.uri}): lost {self._name}: {_error_text(exc)}") from None
        if state in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_CRASHED):
            return state == libvirt.VIR_DOMAIN_CRASHED or reason == libvirt.VIR_DOMAIN_SHUTOFF_CRASHED
        return None

    def drain(self) -> None:
        """Wait until the stream readers wrote everything the stopped guest sent."""
        for reader in self._readers:
            reader.join(timeout=DRAIN_TIMEOUT_S)

    def _samples_complete(self) -> bool:
        """Whether the samples the guest sent end with the agent's END record for a complete run."""
        from ..stream import read_stream  # numpy/pyarrow: not at CLI start

        if self._channel_reader is None:
            return False
        try:
            return read_stream(self._channel_reader.path).end_reason == "complete"
        except InputError:
            return False

    def _pump(self) -> None:
        for reader in self._readers:
            reader.pump()

    def console_text(self) -> str:
        return bytes(self._console).decode("utf-8", errors="replace")

    def check(self) -> str | None:
        if self._domain is None:
            return None
        self._pump()
        console = self.console_text()
        if self._ready_at is None and READY_MARK in console:
            self._ready_at = time.monotonic()
        stopped = self.stopped()
        if self._ready_at is None:
            if stopped is not None:
                said = " ".join(self.console_text()[-300:].split())
                return (f"the domain {self._name} stopped before the guest booted{' (crashed)' if stopped else ''}"
                        f"; console: {said or '(nothing)'}")
            if time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
                return f"the guest did not boot within {self.config.boot_timeout / 1e9:.0f}s"
            return None
        if stopped is not None:
            self.drain()
            if self.config.guest == "baremetal":
                exception = baremetal.failure_exception(self.console_text())
                if exception is not None:
                    raise exception  # status 2 (a parameter the guest refused) is bad input: exit 2
                return None
            failure = agent_failure(self.console_text())
            if failure and not stopped and EXIT_MARK not in self.console_text() and self._samples_complete():
                # libvirt kills QEMU as soon as the guest powers off and the console's last lines can be
                # lost with it under load; the agent's END record on the channel says it finished
                return None
            return failure
        channel = self._channel_reader
        if channel is not None and channel.ended and (channel.ended != "end of stream"
                                                      or time.monotonic() - channel.ended_at > DRAIN_TIMEOUT_S):
            # libvirt stopped relaying the channel: the guest's further samples would be lost (an end of
            # stream is normal when the agent finishes, shortly before the guest powers off)
            return f"the samples channel of {self._name} closed while the guest ran: {channel.ended}"
        return None

    @property
    def booted(self) -> bool:
        self._pump()
        if self._ready_at is None and READY_MARK in self.console_text():
            self._ready_at = time.monotonic()
        return self._ready_at is not None

    def stressor_guest(self, index: int, host_cpus: tuple[int, ...] | None, guest: str = "linux") -> Environment:
        config = LibvirtConfig.model_validate({
            "kind": "libvirt", "name": f"stress-vm-{index}", "uri": self.config.uri,
            "domain_type": self._type.get("type", self.config.domain_type),
            "pin": host_cpus is not None, "cpus": host_cpus})
        return LibvirtEnvironment(config, self.supervisor, self.workdir / f"stress-vm-{index}", self.shared)

    def describe(self) -> dict[str, Any]:
        boot_s = None if self._ready_at is None else round(self._ready_at - self._launched_at, 2)
        return {**super().describe(), "domain": self._name or None, "domain_type": self._type.get("type"),
                "domain_type_reason": self._type.get("reason"), **self._versions, "boot_seconds": boot_s,
                **guest_description(self.config.guest, self._image),
                "vcpu_cpus": list(self._host_cpus()[:self.config.vcpus]) if self.config.pin else None,
                "channel_bytes": self._channel_reader.received if self._channel_reader else None,
                "channel_end": self._channel_reader.ended or None if self._channel_reader else None,
                "rt_throttling_lifted": self._rt.describe() if self._rt is not None and self._rt.changed else None,
                "domain_xml": self._applied_xml or None}

    def warnings(self) -> list[str]:
        found = []
        if self._type.get("type") == "qemu":
            found.append(TCG_WARNING.replace("the QEMU guest", "the libvirt domain (type qemu)"))
        dropped = self._dropped_tuning()
        if dropped:
            found.append(f"libvirt dropped {', '.join(dropped)} of the requested <cputune> (see domain_xml)")
        if self._rt is not None and self._rt.changed:
            found.append(f"kernel.sched_rt_runtime_us was set to -1 (from {self._rt.was}) while real-time vCPUs "
                         "ran: cgroup v1 RT group scheduling refuses them otherwise; restored afterwards")
        return found

    def _stop_baremetal(self) -> None:
        """As baremetal.request_stop for QEMU: an NMI makes the guest write out every sample it holds and
        end its stream with reason 'signal'; it gets STOP_TIMEOUT_S to leave before the domain is destroyed."""
        libvirt = _libvirt()
        with contextlib.suppress(libvirt.libvirtError):
            self._domain.injectNMI(0)
            deadline = time.monotonic() + baremetal.STOP_TIMEOUT_S
            while self.stopped() is None and time.monotonic() < deadline:
                self._pump()
                time.sleep(0.1)
            self.drain()

    def _dropped_tuning(self) -> list[str]:
        """Elements of the requested <cputune> missing from the XML libvirt applied (e.g. out of range)."""
        try:
            applied = ET.fromstring(self._applied_xml).find("cputune")
        except ET.ParseError:  # none yet, or cut at XML_LIMIT
            return []
        have = [child.tag for child in applied] if applied is not None else []
        wanted = [child.tag for child in self._cputune()]
        return sorted({f"<{tag}>" for tag in wanted if wanted.count(tag) > have.count(tag)})

    def close(self) -> None:
        with contextlib.suppress(RunError):  # a lost connection: destroyed below, on a new one if need be
            if self._domain is not None and self.config.guest == "baremetal" and self.stopped() is None:
                self._stop_baremetal()
        # the streams are closed before the domain goes: destroyed with its console open, the stream is torn
        # down (our event loop aborts it) while we undefine the domain, a race others saw deadlock libvirt and
        # which fits a CI hang here (a stressor guest destroyed, its clean-up never finished, every later
        # connection hung); what libvirt already holds for a stream is taken first
        for reader in self._readers:
            reader.pump()
            reader.stop()
        self._readers = []
        if self._domain is not None:
            _destroy_and_undefine(self._domain, self.config.uri)
            self._domain = None
        if self._connection is not None:
            if self._initrd_volume:
                with contextlib.suppress(RunError):
                    if not self._connection.delete_volume(self._initrd_volume):
                        name = self._initrd_volume
                        _on_a_fresh_connection(self.config.uri, lambda fresh: fresh.delete_volume(name))
                self._initrd_volume = ""
            self._connection.close()
            self._connection = None
        super().close()


def _domain_gone(exc: Any) -> bool:
    """Whether a libvirtError says the domain no longer exists (not that the connection failed)."""
    return bool(exc.get_error_code() == _libvirt().VIR_ERR_NO_DOMAIN)


def _destroy_and_undefine(domain: Any, uri: str) -> None:
    """Destroy and undefine ``domain``; if its connection is lost (keepalive closed it while libvirtd did not
    answer), once more on a new connection: a domain must not outlive its run."""
    libvirt = _libvirt()

    def remove(target: Any) -> None:
        with contextlib.suppress(libvirt.libvirtError):  # an already stopped domain refuses destroy
            if target.isActive():
                target.destroy()
        target.undefine()

    try:
        remove(domain)
    except libvirt.libvirtError as exc:
        if not _domain_gone(exc):
            _on_a_fresh_connection(uri, lambda fresh: remove(fresh.conn.lookupByUUID(domain.UUID())))


def _on_a_fresh_connection(uri: str, action: Callable[[LibvirtConnection], object]) -> None:
    """``action`` on a new connection to ``uri``, the run's own having been lost; if that fails too, what is
    left is reclaimed by the next campaign or ``--resume``."""
    with contextlib.suppress(RunError, _libvirt().libvirtError):
        fresh = LibvirtConnection(uri)
        try:
            action(fresh)
        finally:
            fresh.close()


def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"
