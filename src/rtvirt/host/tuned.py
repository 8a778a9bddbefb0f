"""tuned, where it runs: ``rtvirt host tune`` applies tuned's profile of the same purpose instead of repeating it,
and ``restore`` puts back tuned's selection as found and every setting that profile writes.

Seen with Debian 12's tuned 2.20 in a guest (tests/test_host_tuned.py): ``tuned-adm profile`` waits until the
daemon has applied the profile; the daemon starts with the profile it recommends ("auto" mode, e.g.
``virtual-guest``), which ``tuned-adm profile NAME`` would turn into a manual choice, so an auto selection is put
back with ``tuned-adm auto_profile``; and tuned's own rollback leaves some sysfs files as its profile wrote them
(``ignore_ce``, and ``writeback``'s workqueue cpumask, which the realtime profile lists under two paths: the second
records the first one's value as the original). So rtvirt records, before tuned applies anything, every file the
profile (and the profiles it includes) writes, and writes back those tuned did not restore.
"""

from __future__ import annotations

import configparser
import glob
import os
import re
import shutil
import subprocess
from typing import Any

from .checks.base import Step
from .ledger import Ledger, read_raw
from .profiles import Profile
from .tuned_adm import run_tuned_adm, tuned_daemon_running

__all__ = ["apply_tuned_profile", "tuned_daemon_running", "isolated_cores_set", "tuned_selection",
           "tuned_profile_files"]

TUNED_CONFIG_DIR = "/etc/tuned"
TUNED_PROFILE_DIRS = ("/etc/tuned", "/usr/lib/tuned")  # a profile of /etc/tuned overrides the shipped one
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def isolated_cores_set(variables: str, cpus: tuple[int, ...]) -> str:
    """A tuned realtime profile's variables file with ``isolated_cores`` set to ``cpus`` (the profile isolates
    what it says; Debian's default computes its own set)."""
    kept = [line for line in variables.splitlines() if not line.strip().startswith("isolated_cores")]
    return "\n".join([*kept, f"isolated_cores={','.join(map(str, cpus))}"]) + "\n"


def tuned_selection(listed: str, mode_file: str | None) -> str:
    """What tuned has selected, as ``restore`` puts it back: "" (no profile: ``tuned-adm off``), "auto NAMES"
    (chosen by tuned's recommendation: ``tuned-adm auto_profile``) or "manual NAMES" (``tuned-adm profile NAMES``).

    ``listed``: what ``tuned-adm list`` (or ``active``) printed, whose "Current active profile:" line also names
    the post-loaded profile at its end, which stays loaded across profile switches and is not restored;
    ``mode_file``: what tuned's profile_mode file reads (it is not on D-Bus in tuned 2.20)."""
    lines = dict(line.partition(":")[::2] for line in listed.splitlines() if line.startswith("Current "))
    names = lines.get("Current active profile", "").split()
    post_loaded = lines.get("Current post-loaded profile", "").strip()
    if post_loaded and names[-1:] == [post_loaded]:
        names.pop()
    if not names:
        return ""
    return f"{'auto' if (mode_file or '').strip() == 'auto' else 'manual'} {' '.join(names)}"


def tuned_profile_files(name: str, dirs: tuple[str, ...] = TUNED_PROFILE_DIRS, root: str = "") -> list[str]:
    """The files tuned's profile ``name`` and those it includes write: its [sysctl] keys, [sysfs] paths (globs
    expanded under ``root``), THP from [vm], and the IRQ masks its [scheduler] moves off isolated cores."""
    files: list[str] = []
    seen: set[str] = set()
    pending = [name]
    while pending:
        profile = pending.pop()
        if profile in seen or "$" in profile:  # an include chosen by a variable is not followed
            continue
        seen.add(profile)
        config = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",))
        config.optionxform = str  # type: ignore[assignment,method-assign]  # sysfs paths keep their case
        path = next((f"{d}/{profile}/tuned.conf" for d in dirs if os.path.exists(f"{d}/{profile}/tuned.conf")), None)
        if path is None:
            continue
        try:
            config.read(path)
        except configparser.Error:
            continue
        pending += [p for p in re.split(r"[\s,]+", config.get("main", "include", fallback="")) if p]
        files += [f"{root}/proc/sys/{key.replace('.', '/')}" for key in
                  (config.options("sysctl") if config.has_section("sysctl") else [])]
        for pattern in config.options("sysfs") if config.has_section("sysfs") else []:
            files += sorted(glob.glob(f"{root}{pattern}"))
        if config.has_option("vm", "transparent_hugepages"):
            files.append(f"{root}{THP}")
        if config.has_option("scheduler", "isolated_cores"):
            files += [f"{root}/proc/irq/default_smp_affinity", *sorted(glob.glob(f"{root}/proc/irq/*/smp_affinity"))]
    return list(dict.fromkeys(files))


def apply_tuned_profile(profile: Profile, cpus: tuple[int, ...], ledger: Ledger, holder: str,
                        steps: list[Step]) -> dict[str, Any] | None:
    """Apply the tuned profile of the same purpose when tuned's daemon runs and has it; None without tuned.

    ``steps``: rtvirt's own steps for the profile: their files are recorded with tuned's, so whatever tuned does
    not roll back is put back by rtvirt."""
    if not shutil.which("tuned-adm"):
        return None
    if not tuned_daemon_running():
        return {"profile": profile.tuned, "applied": False, "failed": False,
                "reason": "tuned is installed but its daemon is not running (tuned-adm would only preset the "
                          "profile): rtvirt applies every item itself"}
    # one Python start of tuned-adm (seconds each in a small guest): the list ends with the active profile
    listed = subprocess.run(["tuned-adm", "list"], capture_output=True, text=True, timeout=60)
    if listed.returncode != 0 or f"- {profile.tuned}" not in listed.stdout:
        return {"profile": profile.tuned, "applied": False, "failed": listed.returncode != 0,
                "reason": (listed.stderr.strip() or f"tuned has no profile {profile.tuned}")[:300]}
    # recorded before the profile, so written back after tuned's own rollback (only where it differs then)
    files = [*tuned_profile_files(profile.tuned), f"{TUNED_CONFIG_DIR}/bootcmdline",
             *(s.path for s in steps if s.path.startswith("/"))]
    for path in dict.fromkeys(files):
        ledger.remember(holder, path)
    previous = tuned_selection(listed.stdout, read_raw(f"{TUNED_CONFIG_DIR}/profile_mode"))
    ledger.remember_command(holder, "tuned", previous)
    # recorded after the profile, so restored before it: the previous profile loads with the variables found
    variables = f"{TUNED_CONFIG_DIR}/{profile.tuned}-variables.conf"
    found = read_raw(variables)
    if found is not None:
        ledger.change(holder, variables, isolated_cores_set(found, cpus))
    # tuned-adm waits until the daemon has applied the profile (13 s in a TCG guest) or says why not
    done = run_tuned_adm(["tuned-adm", "profile", profile.tuned], profile.tuned)
    return {"profile": profile.tuned, "applied": done.returncode == 0, "failed": done.returncode != 0,
            "previous": previous or None, "reason": (done.stderr.strip() or done.stdout.strip())[:300] or None}
