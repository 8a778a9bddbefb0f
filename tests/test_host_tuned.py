"""tuned for real: a throwaway TCG guest (tests/guest_chroot.py: this host's root file system read-only over 9p)
starts a system D-Bus and Debian's tuned daemon, then runs this checkout's ``rtvirt host tune --profile
realtime-virtual-guest --cpus 1`` and ``rtvirt host restore`` with tuned in its own (auto) profile, then, with
tuned switched off (``tuned-adm off``), ``--profile realtime-virtual-host`` and its restore, then ``--profile
realtime-host`` (tuned's plain ``realtime``) and its restore; the guest's settings are read before, during and
after each. tuned's daemon never runs on this shared host: its realtime profiles
would retune it for everyone.

The guest's /etc/tuned is a writable copy (tuned saves its profile and mode there; rtvirt sets isolated_cores in
the variables file) and /var/log a tmpfs (tuned's log)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from guest_chroot import RTVIRT_ENV, needs_guest, run_guest

from rtvirt.host.checks.base import chosen, parse_hex_mask, parse_list
from rtvirt.host.checks.kthreads import PF_KTHREAD, PF_NO_SETAFFINITY
from rtvirt.host.checks.power import DEEP_US
from rtvirt.host.profiles import PROFILES

# (tag, rtvirt's profile, tuned's selection before): tuned's auto profile, then none (tuned-adm off) twice
CYCLES = (("guest", "realtime-virtual-guest", "auto"), ("host", "realtime-virtual-host", "off"),
          ("plain", "realtime-host", "off"))
# every file the profiles (tuned's and rtvirt's) write in this guest, read as bytes (md5) and as text
SETTINGS = ("/etc/tuned/active_profile /etc/tuned/profile_mode /etc/tuned/post_loaded_profile /etc/tuned/bootcmdline "
            "/etc/tuned/realtime-virtual-guest-variables.conf /etc/tuned/realtime-virtual-host-variables.conf "
            "/etc/tuned/realtime-variables.conf "
            "/proc/sys/kernel/timer_migration /proc/sys/kernel/sched_rt_runtime_us "
            "/proc/sys/kernel/nmi_watchdog /proc/sys/kernel/watchdog_cpumask /proc/sys/kernel/hung_task_timeout_secs "
            "/proc/sys/kernel/numa_balancing /proc/sys/vm/stat_interval /proc/sys/vm/dirty_ratio "
            "/proc/sys/vm/dirty_background_ratio /proc/sys/vm/swappiness /sys/kernel/mm/transparent_hugepage/enabled "
            "/sys/kernel/mm/transparent_hugepage/defrag /sys/kernel/mm/ksm/run /proc/irq/default_smp_affinity "
            "/sys/devices/virtual/workqueue/cpumask /sys/devices/virtual/workqueue/*/cpumask "
            "/proc/irq/*/smp_affinity_list /sys/devices/system/machinecheck/machinecheck*/ignore_ce")
# the guest's script (dash in the chroot): a snapshot is tuned's active profile as its daemon says on D-Bus, the
# settings' bytes and text, and every task's flags and allowed CPUs
SCRIPT = rf"""
snapshot() {{
  dbus-send --system --print-reply --dest=com.redhat.tuned /Tuned com.redhat.tuned.control.active_profile \
    | sed -n 's/^ *string "\(.*\)"$/profile:\1/p' > /tmp/out/$1.txt
  echo "qos:$(od -An -td4 /dev/cpu_dma_latency)" >> /tmp/out/$1.txt  # the PM QoS limit (us) tuned holds
  md5sum {SETTINGS} 2>/dev/null | sed 's/^/md5:/' >> /tmp/out/$1.txt
  grep -H '' {SETTINGS} 2>/dev/null | sed 's/^/value:/' >> /tmp/out/$1.txt
  # every task but the driver (the caller): rtvirt's own process, whose flags say it used root's privileges
  cat /proc/[0-9]*/stat 2>/dev/null | sed "/^$PPID /d; s/^/stat:/" >> /tmp/out/$1.txt
  grep -H '^Cpus_allowed_list:' /proc/[0-9]*/status 2>/dev/null | grep -v "^/proc/$PPID/" \
    | sed 's/^/allowed:/' >> /tmp/out/$1.txt
}}
if [ "$1" = snapshot ]; then snapshot "$2"; exit; fi  # the driver's call (CYCLES_DRIVER)
mkdir -p /run/dbus
dbus-daemon --system --fork
tuned --daemon
# the daemon is up once it answers on D-Bus and has applied the profile it chose (its recommendation here)
for i in $(seq 600); do
  dbus-send --system --print-reply --dest=com.redhat.tuned /Tuned com.redhat.tuned.control.is_running 2>/dev/null \
    | grep -q 'boolean true' && break
  sleep 0.5
done
{RTVIRT_ENV} {sys.executable} /tmp/out/cycles.py {" ".join(":".join(cycle) for cycle in CYCLES)}
cat /run/rtvirt/ledger.json > /tmp/out/ledger.json
cp /var/log/tuned/tuned.log /tmp/out/tuned.log
"""
# the guest's rtvirt commands in one interpreter, each a whole CLI invocation with its own stdout, stderr and exit
# status: a Python start with rtvirt's imports takes 15-30 s in this TCG guest, and the cycles made six
CYCLES_DRIVER = r"""import os, subprocess, sys, time
from rtvirt.cli import app


def snapshot(name):
    subprocess.run(["/bin/sh", "/tmp/out/script.sh", "snapshot", name], check=True)


def rtvirt(args, out, err):
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out, "w") as stdout, open(err, "w") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        try:
            app.main(args, prog_name="rtvirt", standalone_mode=True)
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    return status


selection = None
for cycle in sys.argv[1:]:
    tag, profile, wanted = cycle.split(":")
    if wanted == "off" and selection != "off":
        subprocess.run(["tuned-adm", "off"], check=True)
    selection = wanted
    snapshot(f"before-{tag}")
    times = [time.time()]
    status = rtvirt(["host", "tune", "--profile", profile, "--cpus", "1", "--json"], f"/tmp/out/tune-{tag}.json",
                    f"/tmp/out/tune-{tag}.log")
    open(f"/tmp/out/tune-{tag}.rc", "w").write(f"{status}\n")
    times.append(time.time())
    snapshot(f"during-{tag}")
    status = rtvirt(["host", "restore", "--json"], f"/tmp/out/restore-{tag}.json", f"/tmp/out/restore-{tag}.log")
    open(f"/tmp/out/restore-{tag}.rc", "w").write(f"{status}\n")
    times.append(time.time())
    open(f"/tmp/out/times-{tag}", "w").write("".join(f"{t:.3f}\n" for t in times))
    snapshot(f"after-{tag}")
"""
# tuned's dynamic tuning off: with it, the daemon moves the PM QoS limit between 1000 and 100 us every 10 s as the
# guest's load changes (virtual-guest's cpu plugin), so a snapshot would catch tuned's mood, not rtvirt's work
BODY = """mkdir /tuned-etc && cp -a /host/etc/tuned/. /tuned-etc/ && mount -o bind /tuned-etc /host/etc/tuned
sed -i 's/^dynamic_tuning *=.*/dynamic_tuning = 0/' /tuned-etc/tuned-main.conf
mount -t tmpfs log /host/var/log
chroot /host /bin/sh /tmp/out/script.sh"""


def _state(text: str) -> dict[str, object]:
    """A snapshot: ``profile``, ``qos`` (us), ``md5`` {path: digest}, ``value`` {path: text}, ``tasks``
    {pid:start: (flags, allowed CPUs)}."""
    profile, qos, md5, values, flags, allowed = "", -1, {}, {}, {}, {}
    for line in text.splitlines():
        kind, _, rest = line.partition(":")
        if kind == "profile":
            profile = rest
        elif kind == "qos":
            qos = int(rest)
        elif kind == "md5":
            digest, path = rest.split(maxsplit=1)
            md5[path] = digest
        elif kind == "value":
            path, _, value = rest.partition(":")
            values[path] = values.get(path, "") + value + "\n"
        elif kind == "stat":
            pid, fields = rest.split()[0], rest.rsplit(")", 1)[1].split()
            flags[pid] = (f"{pid}:{fields[19]}", int(fields[6]))  # start time, flags
        elif kind == "allowed":
            pid = rest.split("/")[2]
            allowed[pid] = rest.rsplit(":", 1)[1].strip()
    tasks = {flags[p][0]: (flags[p][1], allowed[p]) for p in flags.keys() & allowed.keys()}
    return {"profile": profile, "qos": qos, "md5": md5, "value": values, "tasks": tasks}


def _excludes_cpu1(hex_mask: str) -> bool:
    return 1 not in parse_hex_mask(hex_mask.strip())


# What each checklist item tuned may cover reads as, in the guest's own files: whether it is met on CPU 1.
def _met(state: dict[str, object]) -> dict[str, Callable[[], bool]]:
    value: dict[str, str] = state["value"]  # type: ignore[assignment]
    tasks: dict[str, tuple[int, str]] = state["tasks"]  # type: ignore[assignment]

    def one(path: str) -> str:
        return value.get(path, "").strip()

    workqueues = [p for p in value if p.startswith("/sys/devices/virtual/workqueue/")]
    kthreads = [cpus for flags, cpus in tasks.values() if flags & PF_KTHREAD and not flags & PF_NO_SETAFFINITY]
    return {
        "timer-migration": lambda: one("/proc/sys/kernel/timer_migration") == "0",
        "rt-throttling": lambda: one("/proc/sys/kernel/sched_rt_runtime_us") == "-1",
        "vm-stat-interval": lambda: int(one("/proc/sys/vm/stat_interval")) >= 10,
        "workqueue-cpumask": lambda: bool(workqueues) and all(_excludes_cpu1(value[p]) for p in workqueues),
        "default-irq-affinity": lambda: _excludes_cpu1(one("/proc/irq/default_smp_affinity")),
        "watchdog-cpumask": lambda: 1 not in (parse_list(one("/proc/sys/kernel/watchdog_cpumask")) or [1]),
        "thp": lambda: chosen(one("/sys/kernel/mm/transparent_hugepage/enabled")) != "always",
        "thp-defrag": lambda: chosen(one("/sys/kernel/mm/transparent_hugepage/defrag")) not in ("always",
                                                                                                "defer+madvise"),
        "ksm": lambda: one("/sys/kernel/mm/ksm/run") == "0",
        "kthread-affinity": lambda: all(cpus == "1" or 1 not in (parse_list(cpus) or [1]) for cpus in kthreads),
        "pm-qos": lambda: 0 <= state["qos"] <= DEEP_US,  # type: ignore[operator]
        "irq-affinity": lambda: all(1 not in (parse_list(v.strip()) or [1]) for p, v in value.items()
                                    if p.endswith("/smp_affinity_list")),
    }


@pytest.mark.vm
@pytest.mark.timeout(1300)
@needs_guest
@pytest.mark.skipif(not (shutil.which("tuned") and shutil.which("dbus-daemon")),
                    reason="needs Debian's tuned package (scripts/setup.sh all installs it)")
def test_tuned_profile_applies_covers_and_restores_in_a_guest(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "script.sh").write_text(SCRIPT)
    (tmp_path / "out" / "cycles.py").write_text(CYCLES_DRIVER)
    out = run_guest(tmp_path, BODY, {}, timeout=1200)
    for tag, profile, selection in CYCLES:
        _check_cycle(out, tag, profile, selection)
    assert json.loads((out / "ledger.json").read_text())["entries"] == []


def _check_cycle(out: Path, tag: str, profile: str, selection: str) -> None:
    """One tune and restore with tuned's daemon in ``selection`` ("auto": its own profile, "off": none)."""
    before, during, after = (_state((out / f"{phase}-{tag}.txt").read_text())
                             for phase in ("before", "during", "after"))
    tune = json.loads((out / f"tune-{tag}.json").read_text() or "null")
    assert tune is not None, (out / f"tune-{tag}.log").read_text()[-3000:]
    tuned = tune["tuned"]
    # rtvirt recorded tuned's selection as found: its own profile with its mode, or none
    if selection == "auto":
        mode = before["value"]["/etc/tuned/profile_mode"].strip()  # type: ignore[index]
        assert before["profile"] and tuned["previous"] == f"{mode} {before['profile']}", (before["profile"], tuned)
    else:
        assert before["profile"] == "" and tuned["previous"] is None, (before["profile"], tuned)
    tuned_profile = PROFILES[profile].tuned  # the tuned profile rtvirt's profile hands its work to
    assert tuned["applied"] and during["profile"] == tuned_profile, (tuned, during["profile"])
    assert "isolated_cores=1\n" in during["value"][f"/etc/tuned/{tuned_profile}-variables.conf"]  # type: ignore[index]
    # the settings the realtime profiles make, in force during the tuning (read from the guest's /proc and /sys)
    met_before, met_during = _met(before), _met(during)
    assert all(met_during[item]() for item in ("timer-migration", "rt-throttling", "workqueue-cpumask",
                                                "vm-stat-interval", "thp")), during["value"]
    # "covered" is what tuned made true: each item covered reads met now and did not before; every item that
    # became met is tuned's or one of rtvirt's own steps, and rtvirt repeated none of tuned's
    covered = set(tuned["covered"])
    ours = {step["item"] for step in tune["steps"] if step["outcome"] == "applied"}
    assert {"timer-migration", "rt-throttling", "workqueue-cpumask", "vm-stat-interval"} <= covered, tuned
    assert covered <= met_during.keys(), covered  # every item claimed is read here
    for item in covered:
        assert met_during[item]() and not met_before[item](), item
    became_met = {item for item, met in met_during.items() if met() and not met_before[item]()}
    assert became_met <= covered | ours, (became_met, covered, ours)
    assert not covered & ours, tune["steps"]
    # restore: tuned's selection as found (and its mode), and every setting byte for byte, every task's CPUs
    restored = json.loads((out / f"restore-{tag}.json").read_text())
    assert (out / f"restore-{tag}.rc").read_text().strip() == "0", restored
    assert not [c for c in restored["restored"] if c["error"]], restored
    assert (after["profile"], after["qos"]) == (before["profile"], before["qos"])
    assert after["md5"] == before["md5"] and after["value"] == before["value"]
    tasks_before, tasks_during, tasks_after = before["tasks"], during["tasks"], after["tasks"]
    common = tasks_before.keys() & tasks_after.keys()  # type: ignore[attr-defined]
    assert len(common) > 50
    # every task whose CPUs can be set is back where it was, the ones the tuning moved among them; the kernel moves
    # the rest itself (a workqueue's rescuer, mm_percpu_wq, takes the CPUs of the pool it last rescued: it went
    # from 0-1 to 1 during one cycle of a suite run, asked by no one)
    settable = {t for t in common if not tasks_before[t][0] & PF_NO_SETAFFINITY}  # type: ignore[index]
    assert any(tasks_during.get(t) != tasks_before[t] for t in settable)  # type: ignore[attr-defined,index]
    assert {t: tasks_after[t] for t in settable} == {t: tasks_before[t] for t in settable}  # type: ignore[index]
    # how long the real daemon took (TCG guest on a nested 2-vCPU VM), for docs/host.md
    start, tuned_at, restored_at = map(float, (out / f"times-{tag}").read_text().split())
    print(f"{profile} from {selection}: tune {tuned_at - start:.1f} s, restore {restored_at - tuned_at:.1f} s; "
          f"covered {sorted(covered)}; rtvirt's own steps {sorted(ours)}; "
          f"tune exit {(out / f'tune-{tag}.rc').read_text().strip()}")
    assert re.search(rf"static tuning from profile '{tuned_profile}' applied", (out / "tuned.log").read_text())
