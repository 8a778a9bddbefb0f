"""``rtvirt host tune`` / ``restore``: meet a profile's runtime items through the ledger, and put them all back.

Every write goes through :class:`rtvirt.host.ledger.Ledger`, which records the value found first; a setting the
profile already meets is not touched (nothing to restore). A step that fails (not root, a knob this kernel lacks,
a per-CPU IRQ that cannot move) is reported and the rest go on. Where tuned is installed, its profile of the same
purpose is applied first and rtvirt only completes what it left.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from ..errors import InputError
from .checks import HostContext, Item, run_checks, tune_steps
from .checks.power import PM_QOS
from .ledger import Ledger, read_raw
from .profiles import PROFILES, Profile

__all__ = ["TuneResult", "tune_host", "restore_host", "profile_named", "tuned_daemon_running", "isolated_cores_set"]


@dataclass
class StepResult:
    item: str
    path: str
    value: str
    outcome: str  # applied | failed
    found: str | None = None
    error: str | None = None


@dataclass
class TuneResult:
    profile: str
    cpus: list[int]
    steps: list[StepResult] = field(default_factory=list)
    tuned: dict[str, Any] | None = None  # the tuned profile applied and the items it met
    owners: list[str] = field(default_factory=list)  # warnings: settings another tool owns
    after: list[Item] = field(default_factory=list)
    pm_qos: BinaryIO | None = None  # /dev/cpu_dma_latency held at 0 while open (closed by release())

    def release(self) -> None:
        """Let go of what is held open (the PM QoS limit); the ledger's settings are released by the caller."""
        if self.pm_qos is not None:
            self.pm_qos.close()
            self.pm_qos = None

    def as_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["pm_qos"] = "held at 0 us" if self.pm_qos is not None else "not held"
        document["after"] = [i.as_json() for i in self.after]
        return document


def profile_named(name: str, option: str = "--profile") -> Profile:
    if name not in PROFILES:
        raise InputError(f"option {option}: unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[name]


TUNED_PID_FILE = "/run/tuned/tuned.pid"  # tuned's daemon writes it, in the foreground too
TUNED_CONFIG_DIR = "/etc/tuned"


def tuned_daemon_running(pid_file: str = TUNED_PID_FILE) -> bool:
    """Whether tuned's daemon runs: without it ``tuned-adm profile`` only presets a profile for the daemon's next
    start and asks ``service tuned restart`` to do it (which fails without an init system: nothing is applied)."""
    try:
        os.kill(int(read_raw(pid_file) or ""), 0)
    except ValueError:
        return False
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def isolated_cores_set(variables: str, cpus: tuple[int, ...]) -> str:
    """A tuned realtime profile's variables file with ``isolated_cores`` set to ``cpus`` (the profile isolates
    what it says; Debian's default computes its own set)."""
    kept = [line for line in variables.splitlines() if not line.strip().startswith("isolated_cores")]
    return "\n".join([*kept, f"isolated_cores={','.join(map(str, cpus))}"]) + "\n"


def _tuned_profile(profile: Profile, cpus: tuple[int, ...], ledger: Ledger, holder: str) -> dict[str, Any] | None:
    """Apply the tuned profile of the same purpose when tuned's daemon runs and has it; None without tuned."""
    if not shutil.which("tuned-adm"):
        return None
    if not tuned_daemon_running():
        return {"profile": profile.tuned, "applied": False, "failed": False,
                "reason": "tuned is installed but its daemon is not running (tuned-adm would only preset the "
                          "profile): rtvirt applies every item itself"}
    listed = subprocess.run(["tuned-adm", "list"], capture_output=True, text=True, timeout=60)
    if listed.returncode != 0 or f"- {profile.tuned}" not in listed.stdout:
        return {"profile": profile.tuned, "applied": False, "failed": listed.returncode != 0,
                "reason": (listed.stderr.strip() or f"tuned has no profile {profile.tuned}")[:300]}
    active = subprocess.run(["tuned-adm", "active"], capture_output=True, text=True, timeout=60).stdout
    previous = active.partition(":")[2].strip() if "Current active profile" in active else ""
    ledger.remember_command(holder, "tuned", previous)
    # recorded after the profile, so restored before it: the previous profile loads with the variables found
    variables = f"{TUNED_CONFIG_DIR}/{profile.tuned}-variables.conf"
    found = read_raw(variables)
    if found is not None:
        ledger.change(holder, variables, isolated_cores_set(found, cpus))
    done = subprocess.run(["tuned-adm", "profile", profile.tuned], capture_output=True, text=True, timeout=300)
    return {"profile": profile.tuned, "applied": done.returncode == 0, "failed": done.returncode != 0,
            "previous": previous or None, "reason": done.stderr.strip()[:300] or None}


def tune_host(ctx: HostContext, profile: Profile, holder: str, ledger: Ledger | None = None,
              hold: bool = True) -> TuneResult:
    """Meet ``profile``'s runtime items for ``ctx.rt_cpus`` on this machine, on behalf of ``holder``.

    ``hold``: the caller lives as long as the tuning (a campaign), so the PM QoS limit, which lasts only while its
    file is open, is held too (released by ``TuneResult.release``)."""
    ledger = ledger or Ledger()
    result = TuneResult(profile.name, list(ctx.rt_cpus))
    if os.geteuid() != 0:  # every item says so, and nothing is written (nor a ledger made)
        result.steps = [StepResult(s.item, s.path, s.value, "failed", read_raw(s.path), "needs root")
                        for s in tune_steps(ctx, set(profile.items))]
        result.after = run_checks(ctx)
        return result
    before = {i.id: i for i in run_checks(ctx)}
    result.owners = sorted({f"{i.id}: {i.owner} owns this setting and may change it back" for i in before.values()
                            if i.owner and i.id in profile.items})
    result.tuned = _tuned_profile(profile, ctx.rt_cpus, ledger, holder)
    if result.tuned and result.tuned.get("applied"):
        ctx.cache.clear()
        met = [i.id for i in run_checks(ctx) if i.status == "ok" and before[i.id].status != "ok"]
        result.tuned["covered"] = met
    # a setting another holder changed is joined even when it already reads as wanted: it must not go back
    # while this holder still wants it
    held = {entry["path"] for entry in ledger.held()}
    for step in tune_steps(ctx, set(profile.items)):
        found = read_raw(step.path)
        current = None if found is None else (step.restore_as(found) if step.restore_as else found).strip()
        if current == step.value and step.path not in held:
            continue
        try:
            ledger.change(holder, step.path, step.value, step.restore_as)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if os.geteuid() != 0 and exc.errno in (1, 13):
                reason += " (needs root)"
            result.steps.append(StepResult(step.item, step.path, step.value, "failed", found, reason))
            continue
        result.steps.append(StepResult(step.item, step.path, step.value, "applied", found))
    if hold and "pm-qos" in profile.items:
        try:
            result.pm_qos = open(PM_QOS, "wb", buffering=0)  # noqa: SIM115 - held open for the tuning's life
            result.pm_qos.write((0).to_bytes(4, "little"))
        except OSError as exc:
            result.steps.append(StepResult("pm-qos", PM_QOS, "0", "failed", None, exc.strerror))
    ctx.cache.clear()
    result.after = run_checks(ctx)
    return result


def restore_host(holder: str, ledger: Ledger | None = None) -> list[dict[str, Any]]:
    """Put back every setting ``holder`` changed (and any a dead holder left); what was written back."""
    ledger = ledger or Ledger()
    changes = ledger.release(holder) + ledger.reclaim()
    return [asdict(c) for c in changes]
