"""A lab machine: a QEMU guest rtvirt boots to host a real hypervisor where none is at hand (the Xen lab, the
KVM lab), reached over SSH like any other host.

What every lab shares lives here: a directory of its own under the cache (``$RTVIRT_CACHE/<root>/lab-*``) with
its owner's pid, QEMU's pid, its serial console and a fresh host key and client key; QEMU started through the
campaign's supervisor (it dies with rtvirt, PR_SET_PDEATHSIG); a user-mode network whose only forward is the
lab's sshd on 127.0.0.1; the ready mark awaited on the console; then an SSH connection with the host key pinned
in a known_hosts file written before the boot, never the user's ``~/.ssh/config``. ``reclaim_labs`` removes
labs whose rtvirt died (kill -9) and kills their QEMU should it have survived. A boot that fails leaves its
console in ``<root>/failed-boots`` (the last ``KEPT_FAILED_BOOTS``), named in the reason the boot failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar

from ..errors import RunError
from ..procs import Supervisor
from .guest_image import cache_dir
from .lab_cpus import KernelSymbols, cpu_report
from .tcg_clock import clock_failure

if TYPE_CHECKING:
    from ..remote import SshConnection, SshTarget
    from .base import SharedResources

__all__ = ["CPU_DUMP_MARK", "HEARTBEAT_MARK", "HEARTBEAT_S", "MAX_REBOOTS", "LabKeys", "LabMachine", "free_port",
           "open_lab", "reclaim_labs", "run_step", "sshd_config"]

T = TypeVar("T")
L = TypeVar("L", bound="LabMachine")


OWNER_FILE = "owner.pid"
QEMU_PID_FILE = "qemu.pid"
CONSOLE_LIMIT = 1 << 20  # bytes of the console's end read back (it is untrusted and can grow)
SSH_RETRY_S = 60.0  # time the lab's sshd gets to accept a connection after the ready mark
# time a lab's sshd gets to send its banner when a run in the lab failed: a stalled lab kernel sends none while
# its QEMU keeps a CPU of this machine busy (seen: a KVM lab stuck starting a domain, 82 % of a CPU, no banner)
BANNER_TIMEOUT_S = 30.0
WATCH_EVERY_S = 30.0  # between banner checks while a call into the lab blocks (two silent checks stop the lab)
CPU_DUMP = "cpus.txt"  # the registers of the lab's CPUs, as QEMU dumped them when the lab hung (hang_report)
CPU_DUMP_MARK = "--- rtvirt: the lab's CPUs as its QEMU saw them when it hung ---"
CONSOLE_SOCKET = "console.sock"  # the serial console's input (a hypervisor's debug keys), in the lab's directory
QMP_SOCKET = "qmp.sock"  # QEMU's monitor, which a hang's report asks where the lab's CPUs are (monitor_args)
SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, its NUL excluded)
STOPPED_LIMIT = 1000  # characters kept of why a boot stopped (a hang's report names every CPU, twice for Xen)
FAILED_BOOTS = "failed-boots"  # where, under a lab kind's root, the consoles of boots that failed are kept
KEPT_FAILED_BOOTS = 10  # of them, the newest (a campaign boots a lab at most MAX_REBOOTS + 1 times)
MAX_REBOOTS = 2  # boots of a campaign's lab after the first, each once the one before stopped under a run
# the panics a kernel's stall detectors end a hang with (softlockup_panic, panic_on_rcu_stall, set in the KVM lab):
# a boot that ends so hung, under load, and is booted again as one that said nothing
STALL_PANICS = ("softlockup: hung tasks", "RCU Stall")
# what a lab's init prints on its console every HEARTBEAT_S seconds: its uptime and load average
HEARTBEAT_MARK, HEARTBEAT_S = "RTVIRT-LAB-ALIVE", 10


@dataclass(frozen=True)
class LabKeys:
    """The lab's own host key (pinned in known_hosts before the boot) and the client key it authorises."""

    host_key: Path
    host_public: str
    client_key: Path
    client_public: str


def _keypair(path: Path, comment: str) -> str:
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RunError(f"lab: ssh-keygen failed ({exc}); apt-get install openssh-client") from None
    return path.with_suffix(".pub").read_text().strip()


def sshd_config(environment: str) -> str:
    """The configuration of a lab's sshd: root by key only, the lab's own host key, many sessions at once (a
    campaign's runs each open channels), and ``environment`` (``NAME=value ...``) set for every command."""
    return f"""Port 22
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
SetEnv {environment}
"""


def run_step(argv: list[str], cwd: Path, what: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run one step of building what a lab boots; its stdout. A failure says ``what`` failed and how."""
    try:
        result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunError(f"{what} failed: {exc}") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:] or ["no output"]
        raise RunError(f"{what} failed: {' | '.join(line[:200] for line in tail)}")
    return result.stdout


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now (QEMU's user network forwards it to the lab's sshd)."""
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


def reclaim_labs(root_name: str, what: str) -> list[str]:
    """Kill the QEMUs of labs under ``root_name`` whose rtvirt died (should PDEATHSIG have missed one) and remove
    their directories; what went, each named ``what`` (e.g. "Xen lab")."""
    removed: list[str] = []
    root = cache_dir() / root_name
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
                removed.append(f"stray {what} QEMU (pid {qemu})")
        shutil.rmtree(lab, ignore_errors=True)
    return removed


class LabHung(RunError):
    """A lab that did not come up within its boot timeout, its QEMU still running (what it said of itself in the
    message): a boot a campaign tries again, where a lab that failed in a way it names is not."""


class LabMachine:
    """One boot of a lab machine in QEMU: ``boot`` in a subclass builds what it boots and calls ``start``,
    ``await_ready`` and ``connect``; ``connection`` then drives the lab over SSH; ``close`` stops QEMU and
    removes the lab's directory."""

    what: ClassVar[str] = "lab"  # how messages name it ("xen lab", "kvm lab")
    title: ClassVar[str] = "lab"  # how a sentence names it ("the KVM lab stopped")
    console_kept: ClassVar[str] = "lab-console.log"  # a lab's console, kept in the run it stopped under
    heartbeat: ClassVar[bool] = False  # its init prints HEARTBEAT_MARK lines on its console
    root_name: ClassVar[str] = "lab"  # its labs' directory under the cache
    ready_mark: ClassVar[str] = "RTVIRT-LAB-READY"  # what the lab's init prints once its sshd runs

    def __init__(self, supervisor: Supervisor, boot_timeout_ns: int, earlier: list[str] | None = None) -> None:
        self.supervisor = supervisor
        self.earlier = list(earlier or [])  # why the campaign's earlier boots of this lab stopped (open_lab)
        self.boot_timeout_s = boot_timeout_ns / 1e9
        self.boot_seconds: float | None = None
        self.emulator: str | None = None  # the first line of its QEMU's --version
        self._proc: subprocess.Popen[bytes] | None = None
        self._connection: SshConnection | None = None
        self._target: SshTarget | None = None
        self._started = 0.0
        self._ssh_port = 0
        self._unanswering: str | None = None  # why rtvirt stopped the lab, once it stopped answering
        self.symbols = KernelSymbols()  # what names the addresses of a hang's report (the KVM lab's kernel)
        root = cache_dir() / self.root_name
        root.mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="lab-", dir=root))
        self.console = self.directory / "console.log"
        (self.directory / OWNER_FILE).write_text(str(os.getpid()))

    def keys(self) -> LabKeys:
        """A fresh host key and client key for this lab, in its directory."""
        host, client = self.directory / "host_ed25519", self.directory / "client_ed25519"
        host_public = " ".join(_keypair(host, f"rtvirt-{self.root_name}").split()[:2])
        return LabKeys(host, host_public, client, _keypair(client, f"rtvirt-{self.root_name}"))

    def boot(self) -> LabMachine:
        """Build what the lab boots, start QEMU, wait for it and connect (each kind's own)."""
        raise NotImplementedError

    def start(self, argv: list[str], ssh_port: int) -> None:
        """Start the lab's QEMU (``argv``): its serial console must go to ``self.console``, its sshd forwarded
        from 127.0.0.1:``ssh_port``."""
        from .qemu.accel import qemu_version

        # the emulator's own version, for every run's record: the lab's stalls are faults of its emulation
        self.emulator = qemu_version(argv[0])
        self._started, self._ssh_port = time.monotonic(), ssh_port
        self._proc = self.supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        (self.directory / QEMU_PID_FILE).write_text(str(self._proc.pid))

    def _socket(self, name: str) -> Path | None:
        """The Unix socket ``name`` in the lab's directory, or None where its path is longer than a socket's or the
        directory's holds a comma (QEMU's option syntax: a comma would start an option)."""
        sock = self.directory / name
        return None if len(os.fsencode(sock)) > SOCKET_PATH_MAX or "," in str(self.directory) else sock

    def serial_args(self) -> list[str]:
        """QEMU's arguments for the lab's serial console: logged to ``self.console`` and, where a socket fits in the
        lab's directory, open for input on a socket beside it (``type_on_console``)."""
        sock = self._socket(CONSOLE_SOCKET)
        if sock is None:
            return ["-serial", f"file:{self.console}"]
        return ["-chardev", f"socket,id=console,path={sock},server=on,wait=off,logfile={self.console}",
                "-serial", "chardev:console"]

    def monitor_args(self) -> list[str]:
        """QEMU's arguments for CPU threads named after their CPU ("CPU 0/TCG") and, where a socket fits in the
        lab's directory, a QMP socket there, which a hang's report asks (``hang_report``; without it, empty)."""
        named = ["-name", "rtvirt-lab,debug-threads=on"]
        sock = self._socket(QMP_SOCKET)
        return named if sock is None else [*named, "-qmp", f"unix:{sock},server=on,wait=off"]

    def type_on_console(self, keys: list[bytes], answer_within: float) -> bool:
        """Type each of ``keys`` on the lab's serial console, ``answer_within`` s apart, reading meanwhile what it
        prints (a connected reader that stops reading would hold QEMU's serial back); that output is in the
        console's log too. False when the console takes no input (no socket, QEMU gone)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.2)
                sock.connect(str(self.directory / CONSOLE_SOCKET))
                for key in keys:
                    sock.sendall(key)
                    until = time.monotonic() + answer_within
                    while time.monotonic() < until:
                        with contextlib.suppress(TimeoutError):
                            if not sock.recv(1 << 16):
                                return True
            return True
        except OSError:
            return False

    def hang_report(self) -> str:
        """What the lab can still say of itself once it hangs (its boot, or later), as a sentence ending in "; ",
        or "": where QEMU saw its CPUs (their registers kept beside its console, ``keep_console``); the Xen lab
        presses Xen's debug keys too."""
        if self._proc is None or self._proc.poll() is not None:
            return ""
        said, dump = cpu_report(self.directory / QMP_SOCKET, self._proc.pid, self.symbols)
        if dump:  # (the clause too: a run's bounded reason may cut it)
            with (self.directory / CPU_DUMP).open("a") as out:
                out.write(f"{said}\n{dump}\n")
        return said

    def console_size(self) -> int:
        return self.console.stat().st_size if self.console.exists() else 0

    def console_since(self, offset: int, limit: int = CONSOLE_LIMIT) -> str:
        """What the console printed after ``offset`` (at most ``limit`` bytes of it)."""
        if not self.console.exists():
            return ""
        with self.console.open("rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", errors="replace")

    def await_ready(self) -> None:
        """Until the lab's init prints the ready mark; QEMU's end, a failure the console shows or the boot
        timeout is an error naming what the console said last."""
        assert self._proc is not None
        deadline = self._started + self.boot_timeout_s
        while self.ready_mark not in self.console_text():
            exited = self._proc.poll() is not None
            # (read after QEMU's end: a lab kernel's panic ends its QEMU at once, as panic=-1 under -no-reboot
            # does; a CI run's KVM lab had so exited, 77 s into its boot, when this loop next read its console)
            failure = self.failure()
            if failure is not None:
                raise (LabHung if any(stall in failure for stall in STALL_PANICS) else RunError)(
                    f"{self.what}: {failure}")
            if exited:
                error = self._proc.stderr.read(2000).decode(errors="replace") if self._proc.stderr else ""
                raise RunError(f"{self.what}: QEMU exited while the lab booted: "
                               f"{error.strip()[-300:] or 'no message'}; console: {self.console_tail()}")
            if time.monotonic() > deadline:
                tail = self.console_tail()  # (before the hang report adds to the console)
                raise LabHung(f"{self.what}: the lab did not come up within {self.boot_timeout_s:.0f}s; "
                              f"{self.hang_report()}console: {tail}")
            time.sleep(0.2)
        clock = clock_failure(self.console_text(), time.monotonic() - self._started, self.ready_mark)
        if clock is not None:
            raise RunError(f"{self.what}: {clock}")

    def connect(self, keys: LabKeys) -> None:
        """SSH to the lab as root with its host key pinned, retrying for a minute while its sshd comes up."""
        from ..remote import SshTarget, connect

        assert self._proc is not None
        port = self._ssh_port
        known_hosts = self.directory / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {keys.host_public}\n")
        (self.directory / "ssh_config").write_text("")  # never the user's ~/.ssh/config
        self._target = SshTarget(host="127.0.0.1", port=port, user="root", identity_file=keys.client_key,
                                 known_hosts=known_hosts, ssh_config=self.directory / "ssh_config",
                                 connect_timeout=60, proxy_jump=None)
        attempt_deadline = time.monotonic() + SSH_RETRY_S
        while True:
            try:
                self._connection = connect(self._target)
                break
            except RunError:
                if time.monotonic() > attempt_deadline or self._proc.poll() is not None:
                    raise
                time.sleep(1.0)
        self.boot_seconds = round(time.monotonic() - self._started, 1)

    def boot_record(self) -> dict[str, object]:
        """What a run's manifest says of this boot: the QEMU that emulates the lab, its place in its campaign."""
        return {"emulator": self.emulator, "boot_of_campaign": len(self.earlier) + 1,
                "earlier_boots_stopped": self.earlier}

    @property
    def ssh_target(self) -> SshTarget:
        """How to reach the lab's sshd (127.0.0.1, its port, root, the lab's client key, its pinned host key)."""
        if self._target is None:
            raise RunError(f"{self.what}: not booted")
        return self._target

    @property
    def connection(self) -> SshConnection:
        if self._connection is None:
            raise RunError(f"{self.what}: not booted")
        return self._connection

    def failure(self) -> str | None:
        """What the console says went wrong in the lab (a hypervisor's panic), None if nothing did."""
        return None

    def alive(self) -> bool:
        return (self._unanswering is None and self._proc is not None and self._proc.poll() is None
                and self.failure() is None)

    @property
    def ssh_port(self) -> int:
        """The port on 127.0.0.1 that QEMU forwards to the lab's sshd."""
        return self._ssh_port

    def answers(self, timeout: float = BANNER_TIMEOUT_S) -> bool:
        """Whether the lab's sshd sends its banner within ``timeout``: QEMU accepts the forwarded connection
        itself, so a lab whose kernel stalled still accepts, but says nothing."""
        try:
            with socket.create_connection(("127.0.0.1", self._ssh_port), timeout=timeout) as sock:
                sock.settimeout(timeout)
                return sock.recv(4) == b"SSH-"
        except OSError:
            return False

    @contextlib.contextmanager
    def watched(self, doing: str, every: float = WATCH_EVERY_S, timeout: float = BANNER_TIMEOUT_S) -> Iterator[None]:
        """While ``doing`` (a call into the lab that can block for minutes: libvirt's gives up after its keepalive,
        10 minutes in a lab), the lab's banner is checked every ``every`` s; a lab silent twice in a row is stopped,
        so the blocked call fails at once (its connection closes) and names the lab rather than a timeout."""
        done = threading.Event()

        def watch() -> None:
            silent = 0
            while not done.wait(every):
                silent = 0 if self.answers(timeout) else silent + 1
                if silent >= 2 and not done.is_set():
                    self._stop_silent(f"{doing} blocked", timeout)
                    return

        threading.Thread(target=watch, name=f"{self.what} watch", daemon=True).start()
        try:
            yield
        finally:
            done.set()  # (a check under way ends within its timeout and then stops nothing)

    def stop_if_unanswering(self, after: str, timeout: float = BANNER_TIMEOUT_S) -> bool:
        """Stop the lab when it no longer answers (``after``: what failed in it), so that it takes no more CPU
        from the campaign's later runs; they fail at once, naming why. Whether it was stopped."""
        if self._proc is None or self.answers(timeout):
            return False
        self._stop_silent(after, timeout)
        return True

    def _stop_silent(self, after: str, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        self._unanswering = (f"it stopped answering (no SSH banner within {timeout:.0f} s) after {after}; "
                             f"{self.heartbeat_said()}{self.hang_report()}"
                             "rtvirt stopped it so that it takes no CPU from later runs")
        self.supervisor.stop(proc, grace=2.0)

    def lost(self, failure: str, workdir: Path, timeout: float = BANNER_TIMEOUT_S) -> str | None:
        """Asked once a run in the lab failed (``failure``: why): why the lab stopped, when it died under the run
        or stopped answering (it is stopped then), else None. Either way the lab's console is kept in the run's
        ``workdir``: what the lab's kernel (and Xen) said while the run failed in it, which a lab that goes on
        running overwrites and a lab that stopped takes along with its directory."""
        stopped = self.died() or self.stop_if_unanswering(f"a run in it failed: {failure[:300]}", timeout)
        self.keep_console(workdir / self.console_kept)
        return f"the {self.title} stopped: {self.why_stopped()}" if stopped else None

    def heartbeat_said(self) -> str:
        """What the console's heartbeat says of a lab that stopped answering (a kernel that still ran, the network
        or sshd stalled; or a kernel silent too), as a clause ending in "; "; "" for a lab without one."""
        if not self.heartbeat:
            return ""
        beats = [line.split()[1:] for line in self.console_text(1 << 16).splitlines()
                 if line.startswith(HEARTBEAT_MARK)]
        if not beats:
            return "no heartbeat on its console; "
        try:
            uptime, load = float(beats[-1][0]), " ".join(f"{float(value):.2f}" for value in beats[-1][2:5])
        except (IndexError, ValueError):  # (repr: the console is the lab's, untrusted)
            return f"its last heartbeat is unreadable: {' '.join(beats[-1])[:100]!r}; "
        # when QEMU last wrote the console, on this machine's clock: the lab's own clock falls behind under load
        # (seen: 656 s of uptime 35 minutes after its boot), so its uptime cannot say how long ago that was
        ago = time.time() - self.console.stat().st_mtime
        state = "its kernel still ran" if ago < 3 * HEARTBEAT_S else "its kernel fell silent too"
        return (f"{state} (its console last written {max(ago, 0):.0f} s ago; last heartbeat at {uptime:.0f} s of "
                f"its uptime, load {load}); ")

    def died(self, grace: float = 3.0) -> bool:
        """Whether the lab is dead or dies within ``grace`` seconds: asked when something in it just failed (a
        killed QEMU closes its sockets before it is reaped, and under load the two can be far apart)."""
        deadline = time.monotonic() + grace
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def why_stopped(self) -> str:
        """Why a lab that is not alive stopped: its failure, QEMU's exit, or the console's last lines."""
        failure = self._unanswering or self.failure()
        if failure is not None:
            return failure
        status = self._proc.poll() if self._proc is not None else None
        said = f"QEMU exited with status {status}; " if status is not None else ""
        return f"{said}console: {self.console_tail()}"

    def console_text(self, limit: int = CONSOLE_LIMIT) -> str:
        """The last ``limit`` bytes of the lab's serial console."""
        return self.console_since(max(0, self.console_size() - limit), limit)

    def keep_console(self, dest: Path) -> None:
        """Copy the console's last CONSOLE_LIMIT bytes to ``dest`` (the lab's own directory goes with it), and the
        registers of a hang's report after it."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        dump = self.directory / CPU_DUMP
        registers = dump.read_text(errors="replace")[-CONSOLE_LIMIT:] if dump.exists() else ""
        dest.write_text(self.console_text() + (f"\n{CPU_DUMP_MARK}\n{registers}" if registers else ""))

    def keep_failed_boot(self) -> Path:
        """Keep the console of this lab's failed boot beside the kind's labs (its directory goes once it is closed,
        and the boot belongs to no run yet), the newest KEPT_FAILED_BOOTS of them; where it went."""
        kept = self.directory.parent / FAILED_BOOTS
        now = time.time_ns()  # (named by when, to the ns: the names sort oldest first)
        when = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now // 10**9))}.{now % 10**9:09d}Z"
        dest = kept / f"{when}-{self.directory.name}.log"
        self.keep_console(dest)
        for old in sorted(kept.glob("*.log"))[:-KEPT_FAILED_BOOTS]:
            old.unlink(missing_ok=True)
        return dest

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


def booted(lab: L) -> L:
    """``lab`` booted; closed (QEMU stopped, its directory gone) when its boot fails or is interrupted. The console
    of a boot that failed is kept (``keep_failed_boot``), its place named in the reason after what failed (a
    campaign's record of its boots keeps STOPPED_LIMIT characters of it)."""
    try:
        lab.boot()
    except RunError as exc:
        try:
            where = f" (the boot's console: {lab.keep_failed_boot()})"
        except OSError as error:
            where = f" (its console could not be kept: {error.strerror})"
        finally:
            lab.close()
        kind = LabHung if isinstance(exc, LabHung) else RunError  # (a hang stays one: the lab is booted again)
        # where the console went, right after what failed (before the details a run's bounded reason may cut)
        what, semicolon, details = str(exc).partition("; ")
        raise kind((what + where + semicolon + details)[:STOPPED_LIMIT]) from exc
    except BaseException:
        lab.close()
        raise
    return lab


def open_lab(shared: SharedResources, key: str, boot: Callable[[list[str]], T],
             lab_of: Callable[[T], LabMachine]) -> T:
    """The campaign's boot of the lab ``key`` names (``boot(why earlier boots stopped)``; ``lab_of`` finds the
    lab in what it made), made on first use, and made again (up to MAX_REBOOTS times) once it stopped under a
    run or its boot hung (a stall panic included): the campaign's later runs go on in a fresh lab. A boot that
    failed otherwise (QEMU's exit, another panic: a reason named) is not tried again by every later run of the
    campaign: each of them fails with its reason at once."""
    failed: dict[str, str] = shared.get(f"{key}:failed", dict)
    if "why" in failed:
        raise RunError(failed["why"])
    stopped: list[str] = shared.get(f"{key}:stopped", list)  # why each earlier boot of the campaign stopped

    def usable(made: T) -> bool:
        lab = lab_of(made)
        if lab.alive():
            return True
        stopped.append(lab.why_stopped()[:STOPPED_LIMIT])
        return False

    def make() -> T:
        while len(stopped) <= MAX_REBOOTS:
            try:
                return boot(list(stopped))
            except LabHung as exc:  # (seen once in CI: a Xen lab whose dom0 said nothing for 240 s)
                stopped.append(str(exc)[:STOPPED_LIMIT])
            except RunError as exc:
                failed["why"] = str(exc)
                raise
        failed["why"] = (f"the lab stopped {len(stopped)} times in this campaign and is not booted again; "
                         f"the last time: {stopped[-1]}")
        raise RunError(failed["why"])
    return shared.get(key, make, usable)
