"""A lab machine that stops answering is stopped (environments.lab_machine): a KVM lab whose kernel stalled while
starting a domain kept libvirt's call blocked for 10 minutes and 82 % of a CPU of this machine busy for the rest of a
campaign, and every later run paid for it. The check is sshd's banner on the lab's forwarded port: QEMU accepts that
connection itself, so a stalled lab accepts and says nothing. Both sides for real: an sshd as the lab's process
answers; a QEMU with nothing booted behind its forward does not, and is stopped, naming why, after a failed run or
while a call into it blocks (which it then releases)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_server import CONFIG, SSHD, SshServer, listening

from rtvirt.environments.lab_machine import LabMachine, free_port
from rtvirt.procs import Supervisor

QEMU = shutil.which("qemu-system-x86_64")


def _listening(port: int, timeout: float = 30.0) -> None:
    assert listening(port, within=timeout), f"nothing listens on 127.0.0.1:{port} after {timeout} s"


@pytest.fixture
def answering() -> Iterator[LabMachine]:
    """A lab whose process is a real sshd (its keys and config made as the suite's sshd makes them)."""
    if not os.access(SSHD, os.X_OK):
        pytest.fail(f"{SSHD} is missing: scripts/setup.sh installs openssh-server")
    keys = SshServer()  # its host key, client key and config directory; its sshd is the lab's process here
    port = free_port()
    (keys.dir / "sshd_config").write_text(CONFIG.format(port=port, dir=keys.dir))
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        try:
            lab.start([SSHD, "-D", "-e", "-f", str(keys.dir / "sshd_config")], port)
            _listening(port)
            yield lab
        finally:
            lab.close()
            shutil.rmtree(keys.dir, ignore_errors=True)


@pytest.fixture
def silent() -> Iterator[tuple[LabMachine, int]]:
    """A lab whose QEMU forwards its port to a guest that booted nothing, and that QEMU's pid."""
    assert QEMU is not None, "qemu-system-x86_64 is missing (scripts/setup.sh installs it)"
    port = free_port()
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        try:
            lab.start([QEMU, "-accel", "tcg", "-display", "none", "-nodefaults", "-no-reboot",
                       "-serial", f"file:{lab.console}", "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                       "-device", "virtio-net-pci,netdev=n0,romfile="], port)
            _listening(port)
            yield lab, int((lab.directory / "qemu.pid").read_text())
        finally:
            lab.close()
        assert not lab.directory.exists()


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether QEMU ``pid`` exits within ``within`` s (the watch stops it on a thread of its own)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if "zombie" in Path(f"/proc/{pid}/status").read_text().lower():
                return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_a_lab_whose_sshd_answers_is_left_running(answering: LabMachine) -> None:
    assert answering.answers(timeout=10)
    assert not answering.stop_if_unanswering("a run in it failed: test", timeout=10)
    with answering.watched("a call", every=0.5, timeout=10):
        time.sleep(3)
    assert answering.alive()


def test_a_lab_that_accepts_but_never_answers_is_stopped_and_says_why(silent: tuple[LabMachine, int]) -> None:
    lab, pid = silent
    assert lab.alive() and not lab.answers(timeout=3)
    assert lab.stop_if_unanswering("a run in it failed: domain start timed out", timeout=3)
    assert not lab.alive() and _gone(pid)
    assert lab.why_stopped().startswith("it stopped answering (no SSH banner within 3 s) after a run in it failed: "
                                        "domain start timed out; rtvirt stopped it"), lab.why_stopped()


def test_a_call_blocked_on_a_silent_lab_is_released_when_the_watch_stops_it(silent: tuple[LabMachine, int]) -> None:
    lab, pid = silent
    started = time.monotonic()
    with lab.watched("starting a domain", every=1, timeout=1), \
            socket.create_connection(("127.0.0.1", lab.ssh_port)) as call:
        call.settimeout(60)  # a call through the lab's forward, as libvirt's is: waits for an answer
        try:
            answer = call.recv(1)
        except ConnectionResetError:
            answer = b""
        assert answer == b""  # the connection closed under it once QEMU was stopped
    assert time.monotonic() - started < 30 and not lab.alive() and _gone(pid)
    assert lab.why_stopped().startswith("it stopped answering (no SSH banner within 1 s) after starting a domain "
                                        "blocked"), lab.why_stopped()
