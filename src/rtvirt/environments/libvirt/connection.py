"""Connections to libvirtd through libvirt-python (one per domain, one for reclaim), bounded in time, with
the storage pool that carries guest images to its host."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ...errors import RunError
from ..base import SharedResources

DOMAIN_PREFIX = "rtvirt-"
POOL_NAME = "rtvirt"
POOL_PATH = "/var/lib/libvirt/images/rtvirt"
CONNECT_TIMEOUT_S = 60.0  # time a libvirtd (and an SSH transport to it) gets to answer a new connection
# every connection pings libvirtd every KEEPALIVE_INTERVAL_S and is closed after KEEPALIVE_COUNT unanswered
# pings: a daemon that stopped serving (stopped, shutting down, an SSH session stalled) fails our calls
# within about half a minute instead of blocking them in libvirt's C code, where no signal reaches Python
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 6
# A KVM lab is nested under TCG on a shared machine: its libvirtd, sshd and the user-mode network between them all
# run emulated, and at a load of 10-20 on 2 cores they can stay silent past half a minute while the lab's KVM boots
# or tears down a guest (a campaign's connection to it was closed under a run so). A lab that really died is seen
# by its own watch (KvmLab.alive), so its connections wait longer before they call libvirtd deaf.
LAB_KEEPALIVE_COUNT = 120


# the fixed libvirt client library scripts/setup.sh puts in the venv (see import_libvirt)
_CLIENT_DIR = Path(sys.prefix) / "lib" / "rtvirt-libvirt"

_EVENT_LOOP_LOCK = threading.Lock()
_event_loop: threading.Thread | None = None


def import_libvirt() -> Any | None:
    """The libvirt module (None without libvirt-python), bound to the client library set-up put in the venv when
    there is one: Debian 12's libvirt 9 client crashes threaded programs now and then (CVE-2024-4418, fixed in
    10.3), so scripts/setup.sh unpacks a fixed one there. Loaded before libvirt-python's extension, it is the
    libvirt.so.0 that extension binds to (the dynamic linker reuses a library already loaded under that name)."""
    _load_client_library()
    try:
        import libvirt
    except ImportError:
        return None
    return libvirt


@functools.cache
def _load_client_library() -> None:
    """Load the venv's libvirt client libraries, once per process (every libvirt call site, the event loop's
    stream callbacks among them, asks for the module)."""
    if _CLIENT_DIR.is_dir():
        for name in ("libvirt.so.0", "libvirt-qemu.so.0"):
            with contextlib.suppress(OSError):  # unloadable (another distribution's): the system's is used
                ctypes.CDLL(str(_CLIENT_DIR / name), mode=ctypes.RTLD_GLOBAL)


def _libvirt() -> Any:
    """The libvirt module, imported on first use (the CLI must start fast), with its stderr printer off and
    its event loop running.

    Console and channel streams are read from that loop (non-blocking), not by threads blocked in
    virStreamRecv: with a blocking reader on a connection, libvirt 9's client can leave another thread's
    call (virDomainGetXMLDesc while a stressor guest's console was being read) waiting for its reply forever.
    """
    libvirt = import_libvirt()
    if libvirt is None:
        raise RunError("libvirt: the libvirt-python package is missing (run scripts/setup.sh)")
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

    def __init__(self, uri: str, lab: bool = False, place: str | None = None) -> None:
        libvirt = _libvirt()
        self.uri = uri
        self.place = place or uri  # for messages: a forwarded daemon's host and socket, not the forward's path
        self._keepalive_count = LAB_KEEPALIVE_COUNT if lab else KEEPALIVE_COUNT
        self.lock = threading.Lock()
        self._kernels: dict[str, str] = {}
        try:
            self.conn = _open_bounded(libvirt, uri, CONNECT_TIMEOUT_S)
        except libvirt.libvirtError as exc:
            raise RunError(f"libvirt: cannot connect to {self.place}: {_error_text(exc)} (libvirtd must run there: "
                           "`systemctl start libvirtd`, or without systemd `virtlogd -d && libvirtd -d`)") from None
        with contextlib.suppress(libvirt.libvirtError):  # drivers without keepalive (test://) run no daemon
            self.conn.setKeepAlive(KEEPALIVE_INTERVAL_S, self._keepalive_count)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def failure(self, what: str, exc: Exception) -> RunError:
        """The error for ``what`` having failed with ``exc``: when the connection itself has gone (libvirt then
        says only "client socket is closed"), that it was lost and why a connection closes."""
        with contextlib.suppress(Exception):
            if self.conn.isAlive():
                return RunError(f"libvirt ({self.place}): {what}: {_error_text(exc)}")
        return RunError(f"libvirt: the connection to libvirtd at {self.place} was lost ({what}: {_error_text(exc)}); "
                        f"libvirt closes a connection when libvirtd does not answer its keepalive for "
                        f"{KEEPALIVE_INTERVAL_S * self._keepalive_count} s (stopped, hung or starved of CPU) or when "
                        "its transport (the SSH session) ends")

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
                    raise self.failure(f"cannot create the storage pool {POOL_NAME} at {POOL_PATH}", exc) from None
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
            raise self.failure(f"uploading {source.name} failed", exc) from None
        return str(volume.path())

    def sparse_volume(self, name: str, capacity: int) -> str:
        """A new empty raw volume ``name`` of ``capacity`` bytes that takes no room until written; its path."""
        libvirt = _libvirt()
        volume_xml = ET.Element("volume")
        ET.SubElement(volume_xml, "name").text = name
        ET.SubElement(volume_xml, "capacity", unit="bytes").text = str(capacity)
        ET.SubElement(volume_xml, "allocation", unit="bytes").text = "0"
        ET.SubElement(ET.SubElement(volume_xml, "target"), "format", type="raw")
        try:
            return str(self.pool().createXML(ET.tostring(volume_xml, encoding="unicode"), 0).path())
        except libvirt.libvirtError as exc:
            raise self.failure(f"cannot create the volume {name}", exc) from None

    def download_written_part(self, name: str, local: Path, chunk: int = 4 << 20) -> None:
        """Copy volume ``name`` into ``local`` up to the first chunk of zeros (what a guest wrote from its
        start: a stream's copy), without reading the rest of a large sparse volume."""
        libvirt = _libvirt()
        try:
            volume = self.pool().storageVolLookupByName(name)
            capacity = int(volume.info()[1])
            with local.open("wb") as out:
                for offset in range(0, capacity, chunk):
                    stream = self.conn.newStream(0)
                    volume.download(stream, offset, min(chunk, capacity - offset), 0)
                    parts: list[bytes] = []
                    stream.recvAll(lambda _stream, data, chunks: chunks.append(data), parts)
                    stream.finish()
                    data = b"".join(parts)
                    out.write(data)
                    if not data.strip(b"\0") or len(data) < chunk:
                        return
        except libvirt.libvirtError as exc:
            raise self.failure(f"cannot read the volume {name}", exc) from None

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

def _connection(shared: SharedResources, uri: str, place: str | None = None) -> LibvirtConnection:
    return shared.get(f"libvirt:{uri}", lambda: LibvirtConnection(uri, place=place))

def _domain_gone(exc: Any) -> bool:
    """Whether a libvirtError says the domain no longer exists (not that the connection failed)."""
    return bool(exc.get_error_code() == _libvirt().VIR_ERR_NO_DOMAIN)

def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"
