"""A lab machine that stops answering is stopped (environments.lab_machine): a KVM lab whose kernel stalled while
starting a domain kept 82 % of a CPU of this machine busy for the rest of a campaign, and every later run paid for
it. The check is sshd's banner on the lab's forwarded port: QEMU accepts that connection itself, so a stalled lab
accepts and says nothing. Both sides for real: an sshd as the lab's process answers; a QEMU with nothing booted
behind its forward does not, and is stopped, naming why."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from sshd_server import CONFIG, SSHD, SshServer

from rtvirt.environments.lab_machine import LabMachine, free_port
from rtvirt.procs import Supervisor

QEMU = shutil.which("qemu-system-x86_64")


def _listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.mark.skipif(not os.access(SSHD, os.X_OK), reason="sshd is missing (scripts/setup.sh installs openssh-server)")
def test_a_lab_whose_sshd_answers_is_left_running() -> None:
    keys = SshServer()  # its host key, client key and config directory; its sshd is the lab's process here
    port = free_port()
    (keys.dir / "sshd_config").write_text(CONFIG.format(port=port, dir=keys.dir))
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        try:
            lab.start([SSHD, "-D", "-e", "-f", str(keys.dir / "sshd_config")], port)
            _listening(port)
            assert lab.answers(timeout=10)
            assert not lab.stop_if_unanswering("a run in it failed: test", timeout=10)
            assert lab.alive()
        finally:
            lab.close()
            shutil.rmtree(keys.dir, ignore_errors=True)


@pytest.mark.skipif(QEMU is None, reason="qemu-system-x86_64 is missing (scripts/setup.sh installs it)")
def test_a_lab_that_accepts_but_never_answers_is_stopped_and_says_why() -> None:
    port = free_port()
    with Supervisor() as supervisor:
        lab = LabMachine(supervisor, 60 * 10**9)
        try:
            # QEMU forwards the port to a guest that booted nothing: connections are accepted, never answered
            lab.start([str(QEMU), "-accel", "tcg", "-display", "none", "-nodefaults", "-no-reboot",
                       "-serial", f"file:{lab.console}", "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                       "-device", "virtio-net-pci,netdev=n0,romfile="], port)
            _listening(port)
            (pid,) = [int(Path(lab.directory / "qemu.pid").read_text())]
            assert lab.alive() and not lab.answers(timeout=3)
            assert lab.stop_if_unanswering("a run in it failed: domain start timed out", timeout=3)
            assert not lab.alive()
            assert lab.why_stopped().startswith("it stopped answering (no SSH banner within 3 s) after a run in it "
                                                "failed: domain start timed out; rtvirt stopped it"), lab.why_stopped()
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        finally:
            lab.close()
        assert not lab.directory.exists()
