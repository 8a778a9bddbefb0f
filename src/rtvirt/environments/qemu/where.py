"""Where QEMU runs: this machine, or a KVM host behind a transport (a KVM host over SSH, the KVM lab).

Everything the qemu kind does to the machine QEMU runs on goes through a :class:`QemuHost` and the
:class:`Workspace` of one QEMU there; the environment's lifecycle is the same for both:

- **files**: the guest's kernel and initramfs are used in place here; there they are copied once into
  ``<remote_dir>/images/`` under a name holding their content's digest (transport.install), and a run's few
  bytes of jobs follow them;
- **outputs** (the sample stream, the console, the guest's trace): here a chardev ``file`` writes the local file
  itself, so the samples are on disk even if rtvirt is killed; there a chardev ``pipe`` writes a FIFO that a
  ``cat`` started over the connection copies live into the local file (SSH's flow control holds the guest's
  writes back when the copy lags, nothing is dropped);
- **sockets** (QMP, the end-of-stream confirmation): here the socket itself, there a local socket forwarded to
  it (SshConnection.forward_unix), so that the QMP client and the confirmation are the same code;
- **QEMU's life**: here procs.Supervisor (the kernel kills QEMU if rtvirt dies); there a constant watchdog
  script whose stdin is the SSH session: when the session ends (rtvirt stopped it, was killed, or lost the
  connection), it ends QEMU. A directory named after this controller and rtvirt's pid lets a later rtvirt
  remove what a killed one left (``reclaim``);
- **placement** of QEMU's threads: here system calls (sched_setaffinity, sched_setattr, the cgroups of pinned
  SCHED_DEADLINE vCPUs); there ``taskset`` and ``chrt``, argument vectors;
- **what was in force**: KVM's parameters, the kernel, QEMU's version, whether KVM accelerates (host.kvm).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import socket
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ...errors import RunError
from ...procs import cpu_ticks, process_start_time
from ...remote.local import LocalTransport
from ...remote.transport import HostProcess, HostTransport, controller_id, file_digest, install
from ...sysaudit import LocalSystem, SystemView
from ..sched import SchedPolicy, apply_policy, thread_ids
from .accel import QEMU, choose_accel, probe_kvm_host, qemu_version, remote_accel

if TYPE_CHECKING:
    from ...procs import Supervisor
    from ...remote.agents import TargetLink

__all__ = ["LocalQemuHost", "QemuHost", "QemuProcess", "RemoteQemuHost", "ThreadPlace", "Workspace"]

# The watchdog around a remote QEMU ($1: its directory; $2, $3: the sparse disk it makes first and its size, "-"
# for none: a command of its own would cost a process start more; QEMU's argument vector follows). QEMU gets no
# stdin; the script's stdin is the SSH session, which a background reader watches: its end (rtvirt stops the
# process, is killed, or the connection goes) ends QEMU. The script reports QEMU's pid, then ends with QEMU's status.
WATCHDOG = r"""dir=$1; disk=$2; size=$3; shift 3
[ "$disk" = - ] || truncate -s "$size" -- "$disk" || exit 1
exec 3<&0
"$@" < /dev/null 3<&- &
qemu=$!
echo "$qemu" > "$dir/qemu.pid"
echo "rtvirt-pid $qemu" >&2
{ cat > /dev/null; kill -TERM "$qemu"; sleep 5; kill -KILL "$qemu"; } <&3 > /dev/null 2>&1 &
watch=$!
exec 3<&-
wait "$qemu"
status=$?
kill "$watch" 2> /dev/null
exit "$status"
"""
_PID_LINE = re.compile(rb"(?m)^rtvirt-pid (\d{1,10})\n")
# Every command is a process started by the KVM host's sshd: on a KVM lab nested under TCG each costs 0.2-1.9 s and
# a CPU of the lab while it runs, so a QEMU's set-up, placement and CPU-time readings are one command each.
# The workspace ($1: its directory; $2: mktemp's template of its sockets' short directory; $3...: the chardevs that
# are FIFO pairs): the directory, the sockets' directory (noted in the workspace for reclaim, and printed), the FIFOs.
_WORKSPACE = ('dir=$1; template=$2; shift 2; mkdir -p -- "$dir" || exit 1; socks=$(mktemp -d "$template") || exit 1; '
              'printf "%s\\n" "$socks" > "$dir/sockets" || exit 1; '
              'for c; do mkfifo -m 600 "$dir/$c.in" "$dir/$c.out" || exit 1; done; echo "$socks"')
# Place QEMU $1's threads: $2 the CPUs of every thread not named ("-": leave them), then per named thread its id,
# CPUs ("-": leave them) and policy as chrt takes it (o, f or d; "-": leave it), priority, runtime, period (ns). A
# thread that ended meanwhile (a QEMU worker) is no error. Prints how many threads were not named.
_PLACE = r"""pid=$1; others=$2; shift 2; named=" "
fail() { [ ! -e "/proc/$pid/task/$1" ] || { echo "$2" >&2; exit 1; }; }
while [ $# -ge 6 ]; do
  t=$1; cpus=$2; policy=$3; priority=$4; runtime=$5; period=$6; shift 6; named="$named$t "
  if [ "$cpus" != - ]; then err=$(taskset -p -c "$cpus" "$t" 2>&1 > /dev/null) || fail "$t" "$err"; fi
  case $policy in
    d) err=$(chrt -d --sched-runtime "$runtime" --sched-deadline "$period" --sched-period "$period" -p 0 "$t" 2>&1) ;;
    f|o) err=$(chrt -"$policy" -p "$priority" "$t" 2>&1) ;;
    *) err= ;;
  esac || fail "$t" "chrt: $err"
done
n=0
for t in $(ls "/proc/$pid/task"); do
  case $named in *" $t "*) continue ;; esac
  n=$((n + 1))
  if [ "$others" != - ]; then err=$(taskset -p -c "$others" "$t" 2>&1 > /dev/null) || fail "$t" "$err"; fi
done
echo "$n"
"""
# The CPU time of QEMU $1's threads $2... once a second while they live: the clock tick rate, then one line a
# second of their utime+stime in ticks, read with shell builtins (the fields after the comm, which may hold anything).
# A thread gone (QEMU ending: its vCPUs exit before its main thread) ends the readings, whose last sum stands: one
# without it would be short (the KVM lab's runs recorded 0.0 s, and a negative time after the boot)
_CPU_TIMES = r"""set -f; pid=$1; shift; getconf CLK_TCK
ticks() { n=$((${12} + ${13})); }
while [ -e "/proc/$pid" ]; do
  total=0
  for t; do
    { read -r line < "/proc/$pid/task/$t/stat"; } 2> /dev/null || exit 0
    ticks ${line##*) }
    total=$((total + n))
  done
  echo "$total"
  sleep 1
done
"""
# copy the FIFO $1 to stdout; with CPUs $2, on those only, and so is the sshd relaying it (this session's, which
# handles every channel of the connection): none of them may take a vCPU's pCPU while the guest streams
_FOLLOW = ('if [ -n "$2" ]; then taskset -p -c "$2" "$PPID" > /dev/null 2>&1; exec taskset -c "$2" cat -- "$1"; fi; '
           'exec cat -- "$1"')
# the written part of a sparse disk the guest fills from its start: its allocated blocks (du), one more for luck
_DISK_PREFIX = 'kib=$(du -k -- "$1" | cut -f1); dd if="$1" bs=1024 count=$((kib + 4)) status=none'
# KVM's TSC offset and scaling of each vCPU of QEMU $1 (debugfs: what trace-cmd aligns a guest's TSC with the host's by)
_TSC = ('for d in /sys/kernel/debug/kvm/"$1"-*/vcpu*; do [ -r "$d/tsc-offset" ] || continue; '
        'echo "${d##*/} $(cat "$d/tsc-offset") $(cat "$d/tsc-scaling-ratio" 2> /dev/null || echo -)"; done')
# the sockets of a remote QEMU: a unix socket's path must fit sun_path (OpenSSH's forwarding takes 107 bytes, a
# pytest directory's remote_dir made one of 108), so they live in a short directory of their own
SOCKET_DIR_TEMPLATE = "/tmp/rtvirt-sock.XXXXXXXX"
# the chardevs of a remote QEMU's outputs and clock port (environment.py names them so): their FIFO pairs are made
# with its workspace
PIPE_CHARDEVS = ("rtvirtcon", "rtvirtout", "rtvirttrace", "rtvirtclock")
_SOCKET_DIR = re.compile(r"^/tmp/rtvirt-sock\.[A-Za-z0-9]{8}$")
DRAIN_S = 10.0  # after QEMU ended: time the copies of its outputs get to deliver what they hold
_serial = itertools.count(1)


class QemuProcess:
    """QEMU wherever it runs (the AgentProcess shape, plus ``pid`` on its machine and ``wait``). ``drained`` are
    the copies of its outputs (a remote QEMU's FIFOs): its status is reported once they have delivered all (or
    DRAIN_S passed), so that whoever sees QEMU end finds every byte it wrote in the local files."""

    def __init__(self, process: HostProcess, pid: int | None, drained: list[HostProcess] | None = None) -> None:
        self.process = process
        self._pid = pid
        self._drained = drained if drained is not None else []
        self._ended_at: float | None = None

    @property
    def pid(self) -> int | None:
        if self._pid is None:  # a remote QEMU: announced by its watchdog on stderr
            match = _PID_LINE.search(bytes(getattr(self.process, "stderr_head", b"")))
            self._pid = int(match.group(1)) if match else None
        return self._pid

    @property
    def returncode(self) -> int | None:
        status = self.process.returncode
        if status is None or not self._drained:
            return status
        if self._ended_at is None:
            self._ended_at = time.monotonic()
        pending = [p for p in self._drained if p.poll() is None]
        if pending and time.monotonic() - self._ended_at < DRAIN_S:
            return None
        return status

    def poll(self) -> int | None:
        self.process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return self.returncode

    def error_tail(self) -> str:
        return _PID_LINE.sub(b"", self.process.error_tail().encode()).decode(errors="replace").strip()

    @property
    def lost(self) -> bool:
        """The connection to QEMU's machine went while QEMU ran (its watchdog then ended it)."""
        return bool(getattr(self.process, "lost", False))

    def stop(self, grace: float = 5.0) -> int | None:
        return self.process.stop(grace)


class Workspace(ABC):
    """The files, outputs and sockets of one QEMU on its machine; ``close`` removes them."""

    @abstractmethod
    def stage(self, local: Path) -> str:
        """Where QEMU finds the local file ``local`` (a kernel, a cached initramfs)."""

    @abstractmethod
    def initramfs(self, base: Path, jobs: bytes, local_dir: Path) -> str:
        """A run's initramfs: the cached ``base`` followed by its job archive."""

    @abstractmethod
    def output(self, chardev: str, local: Path) -> str:
        """A chardev option (``file,id=...`` or ``pipe,id=...``) whose bytes reach the local file ``local``."""

    @abstractmethod
    def socket(self, name: str) -> tuple[str, str]:
        """(the path QEMU listens on, the path to connect to here) of a unix socket chardev or QMP."""

    @abstractmethod
    def clock(self, chardev: str) -> tuple[str, Any]:
        """The chardev option of the guest's clock port and the host half of the exchange over it (an
        explain.clocksync exchange, started once QEMU is up): here rtvirt answers on the chardev's socket; there
        a constant script on the KVM host does, stamping with that host's clock (the one its trace is on)."""

    @abstractmethod
    def disk(self, local: Path, size: int) -> str:
        """A sparse raw disk of ``size`` bytes (the stream's copy); ``local`` is where it lives here."""

    @abstractmethod
    def fetch_disk(self, local: Path) -> Path | None:
        """The disk's written part as the local file ``local`` (None: it cannot be had)."""

    @property
    @abstractmethod
    def followers(self) -> list[HostProcess]:
        """The copies of QEMU's outputs still running (none here)."""

    @abstractmethod
    def cpu_seconds(self, pid: int, tids: list[int]) -> float | None:
        """CPU time (user + system) of those threads of QEMU ``pid`` so far; None while not known (QEMU gone)."""

    @abstractmethod
    def close(self) -> None: ...


class QemuHost(ABC):
    """The machine QEMU runs on (see the module's text)."""

    label: str
    here: bool
    transport: HostTransport

    def __init__(self) -> None:
        self._settings: dict[str, Any] | None = None
        self._audit: dict[str, Any] | None = None

    # ---- what is there (read once a campaign: each reading is many files) ----
    def settings(self) -> dict[str, Any]:
        """KVM's parameters, the kernel, whether KVM accelerates (host.kvm.kvm_settings)."""
        from ...host.kvm import kvm_settings

        if self._settings is None:
            self._settings = kvm_settings(self.system())
        return self._settings

    def audit(self) -> dict[str, Any]:
        """The machine's real-time audit (sysaudit.audit_system): kernel, CPUs, IRQs, isolation."""
        from ...sysaudit import audit_system

        if self._audit is None:
            self._audit = audit_system(self.system())
        return self._audit

    @abstractmethod
    def system(self) -> SystemView: ...

    @abstractmethod
    def accel(self, requested: str, arch: str = "x86_64") -> dict[str, Any]: ...

    @abstractmethod
    def qemu_version(self, binary: str = QEMU) -> str: ...

    @abstractmethod
    def online_cpus(self) -> tuple[int, ...]: ...

    # ---- one QEMU ----
    @abstractmethod
    def workspace(self, workdir: Path, helper_cpus: tuple[int, ...] = ()) -> Workspace:
        """A new QEMU's workspace; ``helper_cpus``: where the helpers that serve it there run (not on a vCPU's
        pCPU; empty: anywhere)."""

    @abstractmethod
    def start(self, argv: list[str], workspace: Workspace) -> QemuProcess: ...

    @abstractmethod
    def place(self, pid: int, named: dict[int, ThreadPlace], others: tuple[int, ...] | None) -> int:
        """Put QEMU ``pid``'s ``named`` threads where they go (their CPUs, then their policy) and every other thread
        of it on ``others`` (None: where it is); how many other threads there were."""

    def reclaim(self) -> list[str]:
        """Remove what a killed rtvirt left there (QEMUs, their directories); say what went."""
        return []

    def tsc_offsets(self, pid: int) -> dict[str, Any]:
        """vCPU -> KVM's TSC offset (guest TSC = host TSC x ratio + offset) and scaling ratio, from debugfs; or why
        they cannot be read."""
        said = self.transport.run(["sh", "-c", _TSC, "rtvirt-tsc", str(pid)], timeout=30).stdout
        found: dict[str, Any] = {}
        for line in said.splitlines()[:256]:
            fields = line.split()
            if len(fields) == 3 and fields[0].startswith("vcpu") and fields[1].lstrip("-").isdigit():
                found[fields[0][:12]] = {"offset": int(fields[1]), "scaling_ratio": None if fields[2] == "-"
                                         else fields[2][:24]}
        return found or {"unavailable": "KVM's debugfs is not mounted or not readable on the KVM host"}


@dataclass(frozen=True)
class ThreadPlace:
    """Where one of QEMU's threads goes: its CPUs and its policy (None: left as it is)."""

    cpus: tuple[int, ...] | None = None
    policy: SchedPolicy | None = None


# ---- this machine ------------------------------------------------------------------------------------------


class LocalWorkspace(Workspace):
    def __init__(self) -> None:
        # a unix socket path must fit in 108 bytes: run directories can be deeper than that
        self.sockets = Path(tempfile.mkdtemp(prefix="rtvirt-qmp-"))

    def stage(self, local: Path) -> str:
        return str(local)

    def initramfs(self, base: Path, jobs: bytes, local_dir: Path) -> str:
        path = local_dir / "initramfs.cpio"
        with path.open("wb") as out, base.open("rb") as source:
            shutil.copyfileobj(source, out, 1 << 20)
            out.write(jobs)
        return str(path)

    def output(self, chardev: str, local: Path) -> str:
        local.parent.mkdir(parents=True, exist_ok=True)
        return f"file,id={chardev},path={local}"

    def socket(self, name: str) -> tuple[str, str]:
        path = str(self.sockets / f"{name}.sock")
        return path, path

    def clock(self, chardev: str) -> tuple[str, Any]:
        from ...explain.clocksync import ClockExchange

        path, _ = self.socket("clock")

        def connect() -> socket.socket:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.connect(path)
            return connection

        return f"socket,id={chardev},path={path},server=on,wait=off", ClockExchange(connect)

    def disk(self, local: Path, size: int) -> str:
        with local.open("wb") as disk:
            disk.truncate(size)
        return str(local)

    def fetch_disk(self, local: Path) -> Path | None:
        return local if local.exists() else None

    @property
    def followers(self) -> list[HostProcess]:
        return []

    def cpu_seconds(self, pid: int, tids: list[int]) -> float | None:
        try:
            ticks = sum(cpu_ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text()) for tid in tids)
        except OSError:  # QEMU has ended: keep the last reading
            return None
        return ticks / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        shutil.rmtree(self.sockets, ignore_errors=True)


class LocalQemuHost(QemuHost):
    """This machine (today's behaviour: a calibration boot decides KVM or TCG)."""

    label = "this machine"
    here = True

    def __init__(self, supervisor: Supervisor) -> None:
        super().__init__()
        self.transport = LocalTransport(supervisor, "qemu")

    def system(self) -> SystemView:
        return LocalSystem()

    def accel(self, requested: str, arch: str = "x86_64") -> dict[str, Any]:
        return choose_accel(requested, arch)

    def qemu_version(self, binary: str = QEMU) -> str:
        return qemu_version(binary)

    def online_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(os.sched_getaffinity(0)))

    def workspace(self, workdir: Path, helper_cpus: tuple[int, ...] = ()) -> Workspace:
        return LocalWorkspace()

    def start(self, argv: list[str], workspace: Workspace) -> QemuProcess:
        process = cast(LocalTransport, self.transport).spawn(argv, None)
        return QemuProcess(process, process.pid)

    def place(self, pid: int, named: dict[int, ThreadPlace], others: tuple[int, ...] | None) -> int:
        rest = [tid for tid in thread_ids(pid) if tid not in named]
        for tid, where in named.items():
            if where.cpus is not None:
                _pin(tid, where.cpus)
            if where.policy is not None:
                apply_policy(tid, where.policy)
        for tid in rest if others is not None else ():
            _pin(tid, others)  # type: ignore[arg-type]
        return len(rest)


def _cpus(cpus: tuple[int, ...] | None) -> str:
    """CPUs as taskset's list takes them ("-": none given)."""
    return "-" if cpus is None else ",".join(map(str, cpus))


def _pin(tid: int, cpus: tuple[int, ...]) -> None:
    with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile (a QEMU worker)
        os.sched_setaffinity(tid, set(cpus))


# ---- a KVM host over a transport ---------------------------------------------------------------------------


class RemoteWorkspace(Workspace):
    """``<remote_dir>/qemu/<controller>-<pid>-<start>-<n>/`` on the KVM host: FIFOs, the run's initramfs, the
    stream copy's disk, QEMU's pid, and (in ``sockets``) the path of its sockets' short directory."""

    def __init__(self, host: RemoteQemuHost, helper_cpus: tuple[int, ...]) -> None:
        self.host = host
        self.helper_cpus = ",".join(map(str, helper_cpus))
        self.transport = host.transport
        self.directory = f"{host.qemu_root}/{host.owner}-{next(_serial)}"
        self.sockets = self.transport.run(["sh", "-c", _WORKSPACE, "rtvirt-workspace", self.directory,
                                           SOCKET_DIR_TEMPLATE, *PIPE_CHARDEVS], timeout=60).check(
            f"qemu on {host.label}: making its directory {self.directory}").stdout.strip()
        if not _SOCKET_DIR.match(self.sockets):
            raise RunError(f"qemu on {host.label}: mktemp made {self.sockets[:100]!r}")
        self._followers: list[HostProcess] = []
        self._disk: tuple[str, Path, int] | None = None  # (there, here, bytes): made as QEMU starts
        self._cpu_times: HostProcess | None = None
        self._cpu_lines = b""
        self._clock_ticks: int | None = None
        self._cpu_seconds: float | None = None

    def stage(self, local: Path) -> str:
        return self.host.stage(local)

    def initramfs(self, base: Path, jobs: bytes, local_dir: Path) -> str:
        staged = self.stage(base)
        path = f"{self.directory}/initramfs.cpio"
        self.transport.run(["sh", "-c", 'cat -- "$1" - > "$2"', "rtvirt-initrd", staged, path], timeout=120,
                           input=jobs).check(f"qemu on {self.host.label}: writing the initramfs")
        return path

    def _fifos(self, chardev: str) -> str:
        """The stem of ``chardev``'s FIFO pair (made with the workspace, or now)."""
        stem = f"{self.directory}/{chardev}"
        if chardev not in PIPE_CHARDEVS:
            self.transport.run(["mkfifo", "-m", "600", f"{stem}.in", f"{stem}.out"]).check(
                f"qemu on {self.host.label}: mkfifo {stem}")
        return stem

    def output(self, chardev: str, local: Path) -> str:
        stem = self._fifos(chardev)
        local.parent.mkdir(parents=True, exist_ok=True)
        self._followers.append(self.transport.spawn(["sh", "-c", _FOLLOW, "rtvirt-follow", f"{stem}.out",
                                                     self.helper_cpus], local))
        return f"pipe,id={chardev},path={stem}"

    def socket(self, name: str) -> tuple[str, str]:
        remote = f"{self.sockets}/{name}.sock"
        return remote, self.transport.forward_unix(remote)

    def clock(self, chardev: str) -> tuple[str, Any]:
        from ...explain.clocksync import ScriptedClockExchange

        stem = self._fifos(chardev)
        return f"pipe,id={chardev},path={stem}", ScriptedClockExchange(self.transport, stem)

    def disk(self, local: Path, size: int) -> str:
        """Made by QEMU's watchdog as it starts (RemoteQemuHost.start)."""
        remote = f"{self.directory}/{local.name}"
        self._disk = (remote, local, size)
        return remote

    @property
    def disk_to_make(self) -> list[str]:
        """The watchdog's arguments of the disk it makes: its path and size, or "-" twice."""
        return [self._disk[0], str(self._disk[2])] if self._disk is not None else ["-", "-"]

    def fetch_disk(self, local: Path) -> Path | None:
        disk = self._disk
        if disk is None:
            return None
        try:
            connection = self.host.reconnected()
            fetched = connection.spawn(["sh", "-c", _DISK_PREFIX, "rtvirt-disk", disk[0]], local)
            fetched.stop(grace=120.0)  # its stdout ends when dd has written all: stop only waits for that
        except RunError:
            return None
        return local if local.exists() and local.stat().st_size else None

    @property
    def followers(self) -> list[HostProcess]:
        return self._followers

    def cpu_seconds(self, pid: int, tids: list[int]) -> float | None:
        """The last reading of a script that reads them there once a second (a command per reading would cost the
        KVM host a process start each time)."""
        if self._cpu_times is None:
            self._cpu_times = self.transport.spawn(["sh", "-c", _CPU_TIMES, "rtvirt-cpu-times", str(pid),
                                                    *map(str, tids)], None, on_data=self._cpu_read)
        return self._cpu_seconds

    def _cpu_read(self, data: bytes) -> None:
        """Lines of the CPU-time script: the tick rate, then sums of ticks (on the connection's event loop)."""
        *lines, self._cpu_lines = (self._cpu_lines + data).split(b"\n")
        self._cpu_lines = self._cpu_lines[-64:]
        for line in lines:
            if not line.strip().isdigit():
                continue
            if self._clock_ticks is None:
                self._clock_ticks = int(line) or 100
            else:
                self._cpu_seconds = int(line) / self._clock_ticks

    def close(self) -> None:
        if self._cpu_times is not None:
            self._cpu_times.stop(grace=2.0)
            self._cpu_times = None
        for follower in self._followers:
            follower.stop(grace=2.0)
        self._followers.clear()
        with contextlib.suppress(RunError):
            self.host.reconnected().run(["rm", "-rf", "--", self.directory, self.sockets], timeout=60)


class RemoteQemuHost(QemuHost):
    """A KVM host reached over SSH (the KVM lab is one): one connection per campaign, remade after it drops."""

    here = False

    def __init__(self, link: TargetLink) -> None:
        super().__init__()
        self.link = link
        self.label = link.target.label
        self.remote_dir = link.remote_dir
        self.qemu_root = f"{self.remote_dir}/qemu"
        self.owner = f"{controller_id()}-{os.getpid()}-{process_start_time(os.getpid())}"
        self._probed: dict[str, dict[str, Any]] = {}
        self._online: tuple[int, ...] | None = None
        # the copies there known to exist, by the local file's (device, inode, size): rtvirt's cache writes an image
        # by renaming a whole new file into place, so within a campaign these name one content
        self._staged: dict[tuple[int, int, int], str] = {}

    @property
    def transport(self) -> HostTransport:  # type: ignore[override]
        return self.link.connection()

    def reconnected(self) -> HostTransport:
        """The connection, remade if it dropped (teardown after a lost connection)."""
        return self.link.connection()

    def _probe(self, binary: str = QEMU) -> dict[str, Any]:
        """What probe_kvm_host says of this host for QEMU ``binary`` (asked once per binary)."""
        if binary not in self._probed:
            self._probed[binary] = probe_kvm_host(self.transport, binary)
        return self._probed[binary]

    def system(self) -> SystemView:
        from ...remote.system import RemoteSystem

        return RemoteSystem(self.transport)

    def accel(self, requested: str, arch: str = "x86_64") -> dict[str, Any]:
        from ..baremetal import qemu_binary

        binary = qemu_binary(arch)
        if self._probe(binary)["qemu"] is None:
            package = "qemu-system-arm" if arch == "aarch64" else "qemu-system-x86"
            raise RunError(f"qemu: {self.label} has no {binary} (Debian: apt-get install {package})")
        return remote_accel(self.label, requested, self._probe(binary), self.settings(), arch)

    def qemu_version(self, binary: str = QEMU) -> str:
        return str(self._probe(binary)["qemu"] or "missing")

    def online_cpus(self) -> tuple[int, ...]:
        if self._online is None:
            self._online = tuple(self.system().cpus())
        return self._online

    def workspace(self, workdir: Path, helper_cpus: tuple[int, ...] = ()) -> Workspace:
        return RemoteWorkspace(self, helper_cpus)

    def start(self, argv: list[str], workspace: Workspace) -> QemuProcess:
        assert isinstance(workspace, RemoteWorkspace)
        process = self.transport.spawn(["sh", "-c", WATCHDOG, "rtvirt-qemu", workspace.directory,
                                        *workspace.disk_to_make, *argv], None)
        started = QemuProcess(process, None, workspace.followers)
        deadline = time.monotonic() + 30
        while started.pid is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RunError(f"qemu did not start on {self.label}: {started.error_tail()[-300:] or 'no message'}")
            time.sleep(0.02)
        return started

    def stage(self, local: Path) -> str:
        """The copy there of the local file ``local`` (an image), named by its content; copied on first use, and
        looked for and hashed once per campaign. Known by the file's identity, not its mtime: a cached image's
        every use touches it (fileio.mark_used), each look is a command (0.1-0.2 s in a KVM lab under TCG), and
        hashing a 62 MB kernel took 75-86 ms here."""
        status = local.stat()
        identity = (status.st_dev, status.st_ino, status.st_size)
        if identity not in self._staged:
            remote = f"{self.remote_dir}/images/{file_digest(local)}-{local.name[:64]}"
            install(self.transport, local, remote)
            self._staged[identity] = remote
        return self._staged[identity]

    def place(self, pid: int, named: dict[int, ThreadPlace], others: tuple[int, ...] | None) -> int:
        argv = ["sh", "-c", _PLACE, "rtvirt-place", str(pid), _cpus(others)]
        for tid, where in named.items():
            policy = where.policy
            if policy is None:
                argv += [str(tid), _cpus(where.cpus), "-", "0", "-", "-"]
            elif policy.policy == "deadline":
                argv += [str(tid), _cpus(where.cpus), "d", "0", str(policy.runtime), str(policy.period)]
            else:
                priority = policy.priority if policy.policy == "fifo" else 0
                argv += [str(tid), _cpus(where.cpus), "f" if policy.policy == "fifo" else "o", str(priority), "-", "-"]
        said = self.transport.run(argv, timeout=60).check(f"qemu on {self.label}: placing QEMU's threads")
        count = said.stdout.strip()
        return int(count) if count.isdigit() else 0

    def reclaim(self) -> list[str]:
        """QEMUs whose rtvirt on this controller died (its watchdog should have ended them: this is the second
        net) and their directories."""
        listed = self.transport.run(["ls", "-1", "--", self.qemu_root], timeout=30)
        removed = []
        pattern = re.compile(rf"^{controller_id()}-(\d+)-(\d+)-\d+$")
        for name in listed.stdout.split()[:256]:
            match = pattern.match(name)
            if match is None or process_start_time(int(match[1])) == match[2]:
                continue  # another controller's, or its rtvirt lives
            directory = f"{self.qemu_root}/{name}"
            sockets = self.transport.run(["cat", f"{directory}/sockets"], timeout=30).stdout.strip()
            if _SOCKET_DIR.match(sockets):
                self.transport.run(["rm", "-rf", "--", sockets], timeout=60)
            pid = self.transport.run(["cat", f"{directory}/qemu.pid"], timeout=30).stdout.strip()
            if pid.isdigit():
                command = self.transport.run(["cat", f"/proc/{pid}/cmdline"], timeout=30).stdout
                if directory in command:  # that pid is still our QEMU, not a reused number
                    self.transport.run(["kill", "-KILL", pid], timeout=30)
                    removed.append(f"QEMU pid {pid} left on {self.label}")
            self.transport.run(["rm", "-rf", "--", directory], timeout=60)
            removed.append(f"QEMU directory {directory} on {self.label}: removed")
        return removed
