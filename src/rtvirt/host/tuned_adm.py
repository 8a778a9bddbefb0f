"""``tuned-adm`` with its effect checked on tuned's daemon.

tuned-adm asks the daemon over D-Bus, and when a call gets no answer within its 40 s it writes /etc/tuned's files
itself, prints the D-Bus error and exits 0, while the daemon keeps the profile it runs. Seen under CI's load in a
TCG guest (tests/test_host_tuned.py): ``tuned-adm auto_profile`` first asks the daemon for its recommendation,
which took 39 s there, so ``restore`` reported tuned's selection put back while the daemon still ran the realtime
profile. So after each switch rtvirt asks the daemon itself (dbus-send, which tuned's D-Bus needs anyway) which
profile it runs, and tries again when it is not the one asked for."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess

__all__ = ["TUNED_PID_FILE", "daemon_profile", "daemon_runs", "run_tuned_adm", "tuned_daemon_running"]

TUNED_PID_FILE = "/run/tuned/tuned.pid"  # tuned's daemon writes it, in the foreground too
ATTEMPTS = 3
REPLY_TIMEOUT_S = 120  # the daemon answers between its profile switches, which take minutes in a loaded guest


def tuned_daemon_running(pid_file: str = TUNED_PID_FILE) -> bool:
    """Whether tuned's daemon runs: without it ``tuned-adm profile`` only presets a profile for the daemon's next
    start and asks ``service tuned restart`` to do it (which fails without an init system: nothing is applied)."""
    try:
        with open(pid_file) as f:
            os.kill(int(f.read().strip()), 0)
    except ValueError:
        return False
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def daemon_profile() -> str | None:
    """The profile tuned's daemon runs as it says on D-Bus ("" for none, a post-loaded profile last), or None when
    no daemon answered."""
    done = subprocess.run(["dbus-send", "--system", "--print-reply", f"--reply-timeout={REPLY_TIMEOUT_S * 1000}",
                           "--dest=com.redhat.tuned", "/Tuned", "com.redhat.tuned.control.active_profile"],
                          capture_output=True, text=True, timeout=REPLY_TIMEOUT_S + 30)
    found = re.search(r'^\s*string "(.*)"$', done.stdout, re.MULTILINE)
    return found.group(1) if done.returncode == 0 and found else None


def daemon_runs(active: str, wanted: str) -> bool:
    """Whether the daemon's ``active`` profiles are ``wanted`` ("" for none), a post-loaded profile aside."""
    names = wanted.split()
    return active.split()[:len(names)] == names and bool(names or not active)


def run_tuned_adm(argv: list[str], wanted: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a tuned-adm command) until tuned's daemon runs ``wanted`` ("" for none), ``ATTEMPTS`` times at
    most; a failed run is returned as it is. Without a daemon (or dbus-send) tuned-adm's own word is taken."""
    for _ in range(ATTEMPTS):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not shutil.which("dbus-send") or not tuned_daemon_running():
            return done
        active = daemon_profile()
        if active is not None and daemon_runs(active, wanted):
            return done
    said = "did not answer on D-Bus" if active is None else f"runs {active[:100]!r}"
    return subprocess.CompletedProcess(argv, 1, done.stdout, f"after {ATTEMPTS} runs of {' '.join(argv)}, tuned's "
                                       f"daemon {said}, not {wanted!r}: {done.stderr.strip()[-200:]}")
