"""A lab machine that stops answering is stopped (environments.lab_machine): a KVM lab whose kernel stalled while
starting a domain kept libvirt's call blocked for 10 minutes and 82 % of a CPU of this machine busy for the rest of a
campaign, and every later run paid for it. The check is sshd's banner on the lab's forwarded port: QEMU accepts that
connection itself, so a stalled lab accepts and says nothing. Both sides for real: an sshd as the lab's process
answers; a QEMU with nothing booted behind its forward does not, and is stopped, naming why, after a failed run or
while a call into it blocks (which it then releases). A campaign boots a lab that stopped under a run again for its
later runs, a bounded number of times (open_lab)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from sshd_server import CONFIG, SSHD, SshServer, listening

from rtvirt.environments.base import SharedResources
from rtvirt.environments.guest_image import cache_dir
from rtvirt.environments.lab_machine import (
    FAILED_BOOTS,
    KEPT_FAILED_BOOTS,
    MAX_REBOOTS,
    LabMachine,
    booted,
    free_port,
    open_lab,
)
from rtvirt.environments.qemu.accel import qemu_version
from rtvirt.errors import RunError
from rtvirt.procs import Supervisor, process_state

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


def _start_silent(supervisor: Supervisor, earlier: list[str] | None = None,
                  kind: type[LabMachine] = LabMachine) -> LabMachine:
    """A lab whose QEMU forwards its port to a guest that booted nothing."""
    assert QEMU is not None, "qemu-system-x86_64 is missing (scripts/setup.sh installs it)"
    port = free_port()
    lab = kind(supervisor, 60 * 10**9, earlier)
    try:
        lab.start([QEMU, "-accel", "tcg", "-display", "none", "-nodefaults", "-no-reboot",
                   "-serial", f"file:{lab.console}", "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:22",
                   "-device", "virtio-net-pci,netdev=n0,romfile="], port)
        _listening(port)
        _console_opened(lab)
    except BaseException:
        lab.close()
        raise
    return lab


def _console_opened(lab: LabMachine, timeout: float = 30.0) -> None:
    """Wait until QEMU holds the lab's console file open: QEMU opens (and truncates) it after its network
    backends, so its forwarded port listening does not say a test may write the console yet (a CI run's test
    wrote it in between and read it back empty)."""
    fds, deadline = Path(f"/proc/{(lab.directory / 'qemu.pid').read_text()}/fd"), time.monotonic() + timeout
    while not _holds_open(fds, lab.console):
        assert time.monotonic() < deadline, f"QEMU did not open {lab.console} within {timeout} s"
        time.sleep(0.05)


def _holds_open(fds: Path, path: Path) -> bool:
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # (an fd closed since the listing)
            if os.readlink(fd) == str(path):
                return True
    return False


@pytest.fixture
def silent() -> Iterator[tuple[LabMachine, int]]:
    """A silent lab (_start_silent), and its QEMU's pid."""
    with Supervisor() as supervisor:
        lab = _start_silent(supervisor)
        try:
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
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, its status was read
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_a_lab_whose_sshd_answers_is_left_running(answering: LabMachine, tmp_path: Path) -> None:
    assert answering.answers(timeout=10)
    assert not answering.stop_if_unanswering("a run in it failed: test", timeout=10)
    # a run that failed in it keeps what the lab's console said by then (a domU that went silent in a Xen lab, seen
    # in a suite of 2026-12-01, left only its own console, which stopped after its first lines)
    answering.console.write_text("dom0 said this\n")
    assert answering.lost("the run did not end", tmp_path / "run", timeout=10) is None
    assert (tmp_path / "run" / answering.console_kept).read_text() == "dom0 said this\n"
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


class _BeatingLab(LabMachine):
    heartbeat = True


@pytest.mark.parametrize(("beat_ago", "said"), [(None, "no heartbeat on its console"),
                                                (2.0, "its kernel still ran"), (45.0, "its kernel fell silent too")])
def test_a_silent_lab_says_what_its_heartbeat_said(beat_ago: float | None, said: str) -> None:
    with Supervisor() as supervisor:
        lab = _start_silent(supervisor)
        lab.__class__ = _BeatingLab  # the same machine, as if its init printed heartbeats
        try:
            uptime = 100  # (the lab's clock: it falls behind this machine's under load, so it is not compared)
            if beat_ago is not None:  # what the KVM lab's init prints (kvmlab/image.py ROOT_INIT), beat_ago s ago
                with lab.console.open("a") as console:
                    console.write(f"RTVIRT-KVM-LAB-READY 18.24 13.95\nRTVIRT-LAB-ALIVE {uptime - 10:.2f} 20.00 1.00 "
                                  f"1.00 1.00 1/99 42 \nRTVIRT-LAB-ALIVE {uptime:.2f} 30.00 3.10 2.05 1.00 2/99 43 \n")
                written = time.time() - beat_ago
                os.utime(lab.console, (written, written))
            asked = time.monotonic()
            assert lab.stop_if_unanswering("a run in it failed: test", timeout=2)
            why = lab.why_stopped()
            found = re.search(r"after a run in it failed: test; (?P<said>[a-z ]+)(?: \(its console last written "
                              r"(?P<ago>\d+) s ago; last heartbeat at (?P<up>\d+) s of its uptime, load "
                              r"(?P<load>[\d. ]+)\))?; rtvirt stopped it", why)
            assert found is not None and found["said"] == said, why
            if beat_ago is not None:  # the heartbeat's age as it was when the banner was asked for, give or take
                assert int(found["up"]) == round(uptime) and found["load"] == "3.10 2.05 1.00", why
                assert beat_ago - 1 <= int(found["ago"]) <= beat_ago + (time.monotonic() - asked) + 1, why
        finally:
            lab.close()


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


def test_a_campaign_boots_a_lab_that_stopped_again_a_bounded_number_of_times(tmp_path: Path) -> None:
    with SharedResources() as shared:
        boots: list[LabMachine] = []

        def boot(earlier: list[str]) -> LabMachine:
            boots.append(_start_silent(shared.supervisor, earlier))
            return boots[-1]

        def lab() -> LabMachine:
            return open_lab(shared, "lab:test", boot, lambda made: made)

        stopped: list[str] = []
        first = lab()
        assert lab() is first and len(boots) == 1  # the campaign's runs share one boot while it runs
        for stop in range(MAX_REBOOTS + 1):
            running = lab()
            (console := running.console).write_text(f"console of boot {stop + 1}\n")
            # a run in it failed and it does not answer: it is stopped, its console kept in the run's work dir
            lost = running.lost("domain start timed out", tmp_path / f"run{stop}", timeout=2)
            assert lost is not None and lost.startswith("the lab stopped: it stopped answering"), lost
            assert (tmp_path / f"run{stop}" / "lab-console.log").read_text() == f"console of boot {stop + 1}\n"
            stopped.append(running.why_stopped())
            if stop < MAX_REBOOTS:
                again = lab()  # the next run gets a fresh boot, which knows why the earlier ones stopped
                assert again is not running and again.alive() and not console.exists()
                assert again.boot_record() == {"emulator": qemu_version(), "boot_of_campaign": stop + 2,
                                               "earlier_boots_stopped": stopped}
        with pytest.raises(RunError, match=f"the lab stopped {MAX_REBOOTS + 1} times in this campaign and is not "
                                           "booted again; the last time: it stopped answering"):
            lab()
        with pytest.raises(RunError, match="is not booted again"):  # every later run at once, without a boot
            lab()
        assert len(boots) == MAX_REBOOTS + 1
    assert all(not made.directory.exists() for made in boots)


def _kill_and_wait(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL ``pid`` (a child of this process) and wait until it has exited."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while process_state(pid) not in ("Z", None):  # (a zombie not yet reaped, or reaped)
        assert time.monotonic() < deadline, f"{pid} did not end within {timeout} s"
        time.sleep(0.05)


def _await_a_boot_that_fails(lab: LabMachine, if_up: str) -> NoReturn:
    """Boot ``lab`` as a kind's boot does (``booted``), its boot being the wait to come up, which it must not
    (await_ready raises why): it is closed, its console kept."""
    lab.boot = lab.await_ready  # type: ignore[method-assign,assignment]
    booted(lab)
    raise AssertionError(if_up)


def _kept_consoles(reasons: list[str]) -> tuple[list[str], list[str]]:
    """Each of a campaign's reasons why a boot stopped without the kept console it names after what failed, and
    that console's text (the file is checked to be where the lab kinds keep them)."""
    bare, consoles = [], []
    for reason in reasons:
        match = re.search(r" \(the boot's console: (/[^)]+)\)(;|$)", reason)
        assert match is not None and ";" not in reason[:match.start()], reason
        kept = Path(match.group(1))
        assert kept.parent == cache_dir() / "lab" / FAILED_BOOTS, kept
        bare.append(reason[:match.start()] + reason[match.end(1) + 1:])
        consoles.append(kept.read_text())
    return bare, consoles


def test_a_boot_that_hangs_is_booted_again_and_one_that_fails_naming_why_is_not() -> None:
    with SharedResources() as shared:
        hung: list[LabMachine] = []

        def boot_hanging_twice(earlier: list[str]) -> LabMachine:
            lab = _start_silent(shared.supervisor, earlier)
            lab.boot_timeout_s = 1.0  # nothing on its console: it does not come up
            if len(hung) == 2:
                return lab  # the third boot is taken as up
            hung.append(lab)
            _await_a_boot_that_fails(lab, "a silent lab came up")

        third = open_lab(shared, "lab:hangs", boot_hanging_twice, lambda made: made)
        assert third.alive() and len(hung) == 2 and all(not lab.directory.exists() for lab in hung)
        record = third.boot_record()
        assert record["boot_of_campaign"] == 3
        reasons, consoles = _kept_consoles(record["earlier_boots_stopped"])  # type: ignore[arg-type]
        assert reasons == ["lab: the lab did not come up within 1s; console: empty"] * 2 and consoles == [""] * 2

        # a boot that a stall detector's panic ended hung too (the KVM lab's RCU-stall panic while it booted beside
        # other nested labs, in a suite of 2026-12-01): booted again, not given up as a named failure
        class Stalled(LabMachine):
            def failure(self) -> str:
                return "the lab's kernel panicked: Kernel panic - not syncing: RCU Stall"

        stalled: list[LabMachine] = []

        def boot_stalling_once(earlier: list[str]) -> LabMachine:
            if stalled:
                return _start_silent(shared.supervisor, earlier)
            stalled.append(lab := _start_silent(shared.supervisor, earlier, Stalled))
            _await_a_boot_that_fails(lab, "a lab whose kernel panicked came up")

        again = open_lab(shared, "lab:stalls", boot_stalling_once, lambda made: made)
        assert again.alive() and again.boot_record()["boot_of_campaign"] == 2
        assert _kept_consoles(again.boot_record()["earlier_boots_stopped"])[0] == [  # type: ignore[arg-type]
            "lab: the lab's kernel panicked: Kernel panic - not syncing: RCU Stall"]

        # the same when the panic ended the lab's QEMU at once (the KVM lab's kernel runs with panic=-1 and its QEMU
        # with -no-reboot): a CI run's KVM lab had so exited 77 s into its boot, and was given up as a failure
        class Panicking(LabMachine):
            def failure(self) -> str | None:
                text = self.console_text()
                return f"the lab's kernel panicked: {text.strip()}" if "Kernel panic" in text else None

        panicked: list[LabMachine] = []

        def boot_panicking_once(earlier: list[str]) -> LabMachine:
            if panicked:
                return _start_silent(shared.supervisor, earlier)
            panicked.append(lab := _start_silent(shared.supervisor, earlier, Panicking))
            with lab.console.open("a") as console:
                console.write("Kernel panic - not syncing: RCU Stall\n")
            _kill_and_wait(int((lab.directory / "qemu.pid").read_text()))
            _await_a_boot_that_fails(lab, "a lab whose QEMU ended came up")

        after = open_lab(shared, "lab:panics", boot_panicking_once, lambda made: made)
        assert after.alive() and after.boot_record()["boot_of_campaign"] == 2
        # its console is kept, to the panic's line, though the lab's directory went with its QEMU
        reasons, consoles = _kept_consoles(after.boot_record()["earlier_boots_stopped"])  # type: ignore[arg-type]
        assert reasons == ["lab: the lab's kernel panicked: Kernel panic - not syncing: RCU Stall"]
        assert consoles == ["Kernel panic - not syncing: RCU Stall\n"]

        failing: list[LabMachine] = []

        def boot_failing(earlier: list[str]) -> LabMachine:
            assert QEMU is not None
            failing.append(lab := LabMachine(shared.supervisor, 60 * 10**9, earlier))
            try:
                lab.start([QEMU, "-no-such-option"], free_port())
                lab.await_ready()
            finally:
                lab.close()
            raise AssertionError("QEMU ran with an option it does not have")

        for _ in range(2):  # the second run of the campaign fails at once, with the same reason
            with pytest.raises(RunError, match="lab: QEMU exited while the lab booted: .*no-such-option"):
                open_lab(shared, "lab:fails", boot_failing, lambda made: made)
        assert len(failing) == 1


def test_the_consoles_of_failed_boots_are_kept_newest_first_and_bounded() -> None:
    kept: list[Path] = []
    with Supervisor() as supervisor:
        for n in range(KEPT_FAILED_BOOTS + 2):
            lab = LabMachine(supervisor, 10**9)
            lab.console.write_text(f"boot {n}\n")
            kept.append(lab.keep_failed_boot())
            lab.close()
    assert [path.read_text() for path in kept[2:]] == [f"boot {n}\n" for n in range(2, KEPT_FAILED_BOOTS + 2)]
    assert not kept[0].exists() and not kept[1].exists()  # (the oldest went; other tests' boots may be there too)
