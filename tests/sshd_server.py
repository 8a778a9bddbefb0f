"""A real OpenSSH server for tests: Debian's /usr/sbin/sshd on 127.0.0.1:<free port>, in a temp directory.

It gets a throwaway host key and a throwaway client key, its own sshd_config (key login only, as the
current user, root included) and a known_hosts file that trusts its host key. ``stop()`` kills the server
and every session process it forked, and removes the directory. Usable from any test module::

    with SshServer() as server:
        target = server.target()          # an rtvirt.remote.SshTarget for it
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rtvirt.environments.lab_machine import free_port

SSHD = "/usr/sbin/sshd"

CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {dir}/host_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowAgentForwarding no
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
MaxStartups 50
MaxSessions 50
LogLevel ERROR
# Debian's bash sources ~/.bashrc for a command run by sshd only in a top-level shell (SHLVL < 2): root's
# .bashrc here starts pyenv, a few hundred ms per remote command under load. The test targets' shell is
# still the login shell every target uses; it only skips that rc file.
SetEnv SHLVL=1
"""


def listening(port: int, within: float = 0.0, alive: Callable[[], bool] = lambda: True) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``, asked until ``within`` s have passed while
    ``alive()`` holds (the process that should listen there still runs); the suite's one port check."""
    deadline = time.monotonic() + within
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        if time.monotonic() >= deadline or not alive():
            return False
        time.sleep(0.05)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rtvirt-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text().strip()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first listed before their own children)."""
    result, queue = [], [pid]
    while queue:
        for child in _children(queue.pop()):
            result.append(child)
            queue.append(child)
    return result


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


REMOTE_BIN = "/var/tmp/rtvirt/bin-"


def our_agents_running() -> list[str]:
    """Command lines of agents started from our target-side bin directories (the target: this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if cmdline.startswith(REMOTE_BIN):
                found.append(f"{entry.name} {cmdline}")
    return found


class SshServer:
    """One sshd on a free loopback port; a context manager."""

    def __init__(self) -> None:
        if not os.access(SSHD, os.X_OK):
            raise RuntimeError(f"{SSHD} is missing: scripts/setup.sh installs openssh-server")
        self.dir = Path(tempfile.mkdtemp(prefix="rtvirt-sshd-"))
        self.dir.chmod(0o700)
        self.user = getpass.getuser()
        self.host_key_line = _keygen(self.dir / "host_key")
        self.client_key = self.dir / "client_key"
        (self.dir / "authorized_keys").write_text(_keygen(self.client_key) + "\n")
        self.port = 0
        self.known_hosts = self.dir / "known_hosts"
        self.proc: subprocess.Popen[bytes] | None = None
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory

    def _spawn(self) -> bool:
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=(self.dir / "sshd.log").open("ab"), start_new_session=True)
        return self._wait_listening()

    def start(self) -> SshServer:
        for _attempt in range(5):
            self.port = free_port()
            (self.dir / "sshd_config").write_text(CONFIG.format(port=self.port, dir=self.dir))
            if self._spawn():
                algo, key = self.host_key_line.split()[:2]
                self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {algo} {key}\n")
                return self
            self._kill_server()
        raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()[-500:]}")

    def _wait_listening(self) -> bool:
        proc = self.proc
        assert proc is not None
        return listening(self.port, within=10, alive=lambda: proc.poll() is None)

    def target(self, **fields: object):  # -> rtvirt.remote.SshTarget
        from rtvirt.remote import SshTarget

        values: dict[str, object] = {"host": "127.0.0.1", "port": self.port, "user": self.user,
                                     "identity_file": self.client_key, "known_hosts": self.known_hosts}
        values.update(fields)
        return SshTarget.model_validate(values)

    def ssh_config(self, alias: str) -> Path:
        """An OpenSSH client config naming this server ``alias`` (HostName, Port, User, key, known_hosts)."""
        path = self.dir / "ssh_config"
        path.write_text(f"Host {alias}\n  HostName 127.0.0.1\n  Port {self.port}\n  User {self.user}\n"
                        f"  IdentityFile {self.client_key}\n  UserKnownHostsFile {self.known_hosts}\n")
        return path

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (not the listener, not the commands they run)."""
        if self.proc is None:
            return []
        return [pid for pid in descendants(self.proc.pid) if process_name(pid).startswith("sshd")]

    def kill_sessions(self) -> int:
        """SIGKILL every session process: the connections drop as if the network had gone."""
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def down(self) -> None:
        """SIGKILL the server and every session and command under it, as a target going down for a reboot
        (the port and keys stay for :meth:`up`)."""
        self._kill_server()

    def up(self) -> None:
        """Start again on the same port, with the same host key: the target is back."""
        if not self._spawn():
            raise RuntimeError(f"sshd did not come back: {(self.dir / 'sshd.log').read_text()[-500:]}")

    def _kill_server(self) -> None:
        if self.proc is None:
            return
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        self._kill_server()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SshServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
