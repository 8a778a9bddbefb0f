"""Shared fixtures: the rtvirt command as users run it (installed entry point, real agents)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

RTVIRT = [sys.executable, "-m", "rtvirt"]

# A suite started in the background by a script inherits SIGINT ignored, and so would every rtvirt it starts:
# the Ctrl-C tests would then test nothing. A handled signal is reset to its default at exec, an ignored one
# is not, so handling it here gives every child a default SIGINT (and this session a working Ctrl-C).
signal.signal(signal.SIGINT, signal.default_int_handler)


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# A suite stopped with SIGTERM (`timeout`, a CI job cancelled) unwinds as on Ctrl-C, so each test's clean-up stops
# what it started: a pytest killed by `timeout` once left a docs example's campaign running with two KVM labs.
signal.signal(signal.SIGTERM, _terminated)


def run_cli(
    *args: str, timeout: float = 120, check: bool = False, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run `rtvirt ARGS...` in a subprocess, as a user would. Past ``timeout`` it gets SIGTERM (its clean-up
    path: VMs destroyed, samples kept), then SIGKILL, and the test fails with what it printed (a bare
    TimeoutExpired lost the output of a hung libvirt run in CI)."""
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([*RTVIRT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            **kwargs)  # type: ignore[call-overload]
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop_cli(proc)
        raise AssertionError(f"rtvirt {' '.join(args)} did not end within {timeout:.0f}s (stopped); stderr ends:\n"
                             f"{stderr[-3000:]}\nstdout ends:\n{stdout[-1000:]}") from None
    except BaseException:  # the suite was stopped (Ctrl-C, SIGTERM): its rtvirt stops too, through its clean-up
        _stop_cli(proc)
        raise
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"rtvirt {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def _stop_cli(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM to an rtvirt of run_cli (its clean-up path: VMs destroyed, samples kept), SIGKILL after 30 s."""
    proc.terminate()
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def live_processes() -> list[tuple[int, list[str]]]:
    """(pid, /proc/PID/stat fields after the command name) of every live, non-zombie process."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields and fields[0] != "Z":
            found.append((int(entry), fields))
    return found


def children_of(pid: int, comm: str | None = None, state: str | None = None) -> list[int]:
    """Live children of ``pid`` (named ``comm`` when given: a child not yet exec'd still has its parent's; in
    ``state`` when given, e.g. "T" for stopped)."""
    children = [child for child, fields in live_processes()  # state, ppid, ...
                if int(fields[1]) == pid and state in (None, fields[0])]
    if comm is None:
        return children
    named = []
    for child in children:
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == comm:
                named.append(child)
        except OSError:
            continue
    return named


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


def esc_overrides(seed: int, load: float, switch_us: int, delay_us: int, driver: tuple[int, int, int],
                  wheels: list[dict[str, object]], wheel_exec: list[tuple[int, int]]) -> list[tuple[str, object]]:
    """Overrides of a shipped ESC model for one random draw: overheads, the driver domain N's slice, period
    and packet cost (``driver`` = exec, slice, period in us), each wheel's vCPU fields and control-task
    execution range (low, low + extra in us)."""
    driver_exec, driver_slice, driver_period = driver
    overrides: list[tuple[str, object]] = [
        ("simulation.duration", "0.5s"), ("simulation.seed", seed), ("vm.nonrt.load", load),
        ("hypervisor.overheads.vm_switch", f"{switch_us}us"),
        ("hypervisor.overheads.interrupt_delay", f"{delay_us}us"),
        ("vm.N.vcpu.0.slice", f"{driver_slice}us"), ("vm.N.vcpu.0.period", f"{driver_period}us")]
    for wheel, (fields, (low, extra)) in enumerate(zip(wheels, wheel_exec, strict=True), 1):
        overrides += [(f"vm.wheel{wheel}.vcpu.0.{name}", value) for name, value in fields.items()]
        overrides.append((f"vm.wheel{wheel}.task.control.execution",
                          {"distribution": "uniform", "min": f"{low}us", "max": f"{low + extra}us"}))
        overrides += [(f"vm.N.task.{task}{wheel}.execution",
                       {"distribution": "uniform", "min": "1us", "max": f"{driver_exec}us"}) for task in ("rx", "tx")]
    return overrides


def steal_live_stream(results: Path, min_bytes: int = 2048,
                      timeout: float = 240) -> tuple[threading.Thread, list[Path]]:
    """Start a thread that deletes the first run's live stream file once it holds ``min_bytes`` (the header and
    some records): the live stream is lost while the guest writes it. Returns the thread and the deleted paths."""
    removed: list[Path] = []

    def steal() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for stream in results.glob("runs/*/samples.rtvs"):
                if stream.stat().st_size > min_bytes:
                    stream.unlink()
                    removed.append(stream)
                    return
            time.sleep(0.05)

    thief = threading.Thread(target=steal)
    thief.start()
    return thief, removed


# --- running on several workers (`make test`: pytest-xdist, --dist loadgroup) ----------------------------------
# Tests that share a costly set-up run on one worker, so that it happens once: the users of a session fixture of this
# suite (the Xen lab campaign, read by three modules) form its group, the users of a module's module-scoped fixture
# (libvirtd, sshd, a labgrid coordinator, a Xen lab with shares) their module's. The rest go wherever a worker is
# free. A test marked ``xdist_group`` keeps its own (a module whose tests ask for a fixture at run time marks them).


# A campaign run that ran to its end: complete, or short of the samples it promised (docs/scenarios.md, "Short runs"):
# a timer in a TCG guest or the nested Xen lab overruns periods when the host is loaded, and what the tests of
# guests and labs check does not depend on how many samples that left.
RAN = ("complete", "short")

# a SCHED_FIFO 50 task of 10 ms every 50 ms on the measured vCPU's pCPU, started before the guest (its agent
# copied to a KVM host before the guest starts, not during the run): a scenario's timeline and disturbance
FIFO_TASK_ON_THE_VCPUS_PCPU = """[timeline]
start_order = ["stress-first"]
settle = "1s"

[[disturbances]]
name = "same-core"
[[disturbances.stressors]]
stressor = "cpu"
where = "same-core"
params = { priority = 50, slice = "10ms", period = "50ms" }
"""


def fifo_task_named_and_exits_counted(explained: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`rtvirt explain --json` of a KVM guest's run beside FIFO_TASK_ON_THE_VCPUS_PCPU: the task is one culprit
    of the VM layer, named with its policy and priority where the vCPU did not run, and the KVM host's kernel
    counted the run's exits; returns the KVM layer's exits by their raw reason."""
    assert any(row["cause"] == "task rtvirt-stress" and row["layer"] == "vm" for row in explained["summary"]), \
        sorted(row["cause"] for row in explained["summary"])[:20]
    part = next(p for outlier in explained["worst"] for p in outlier["parts"]
                if p["cause"].startswith("vCPU not running: rtvirt-stress/"))
    assert part["detail"]["policy"] == "real-time" and part["detail"]["priority"] == 50, part
    (kvm_layer,) = [layer for layer in explained["layers"] if layer["layer"] == "kvm"]
    assert any("counted by the KVM host's kernel" in note for note in kvm_layer["notes"]), kvm_layer["notes"]
    return {row["raw_reason"]: row for row in kvm_layer["tables"]["kvm_exits"]}


def assert_ran(result: subprocess.CompletedProcess[str]) -> None:
    """`rtvirt run` measured every run to its end: exit 0, or 1 when runs were short and none failed."""
    said = result.stderr[-3000:] + result.stdout[-3000:]
    if result.returncode == 0:
        return
    assert result.returncode == 1, said
    if "{" in result.stdout:  # --json: one campaign's document, or several
        document = json.loads(result.stdout[result.stdout.index("{"):])
        statuses = {run["status"] for campaign in document.get("campaigns", [document])
                    for run in campaign["runs"].values()}
        assert "short" in statuses and statuses <= set(RAN), said
    else:
        assert "run(s) failed" not in result.stdout and "short of their expected samples" in result.stdout, said


def guest_stressor_cause(explanation: Any) -> tuple[str, int]:
    """The in-guest stressor's worker as the guest layer names it (``guest task rtvirt-stress/PID SCHED_FIFO/RR
    50``), checked to be the guest task that held the probe back most, and how many outliers it held back."""
    by_cause: dict[str, int] = {}
    for part in explanation.parts:
        by_cause[part.cause] = by_cause.get(part.cause, 0) + part.duration_ns
    stressor = {cause: ns for cause, ns in by_cause.items() if cause.startswith("guest task rtvirt-stress/")}
    assert stressor, f"no guest-side stressor cause among {sorted(by_cause)[:10]}"
    assert all(part.layer == "guest" for part in explanation.parts if part.cause in stressor)
    worker = max(stressor, key=lambda cause: stressor[cause])
    assert "SCHED_FIFO" in worker and worker.endswith(" 50"), worker  # the worker at its priority
    # of the guest's tasks, the stressor's worker is the one that held the probe back (under TCG the rest of
    # these windows is mostly the guest idle, waiting for a late timer IRQ: not the stressor's). The guest's trace
    # relay (rtvirt-trace, the flight recorder's) is left out: under TCG it formats its trace at about 100 us an
    # event and is often the guest's current task when the host takes the vCPU's thread away, time the guest
    # layer alone gives to that task (at host load 17 it out-weighed the stressor in 2 of 3 runs)
    tasks = {cause: ns for cause, ns in by_cause.items()
             if cause.startswith("guest task ") and not cause.startswith("guest task rtvirt-trace/")}
    assert max(tasks, key=lambda cause: tasks[cause]) == worker, tasks
    return worker, len({part.rank for part in explanation.parts if part.cause == worker})


def _shared_setup(item: pytest.Item) -> str | None:
    """``item``'s group: the session fixture of this suite it uses, else its module when it uses a module-scoped
    fixture of this suite, else None (no set-up shared)."""
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return None
    module_scoped = None
    for name in item.fixturenames:
        for fixture in definitions.name2fixturedefs.get(name, ()):
            if not fixture.func.__module__.startswith(("test_", "conftest")):
                continue  # pytest's own (tmp_path_factory, ...) are cheap
            if fixture.scope == "session":
                return f"session:{name}"
            if fixture.scope in ("module", "package"):
                module_scoped = f"module:{item.nodeid.split('::')[0]}"
    return module_scoped


# modules whose tests change or check machine-wide state (the host's tuning and settings ledger, every rtvirt cpuset,
# where every task runs) or name what ran on a measured CPU (an explanation names another test's stressor there):
# no other test of the suite may run beside them, so make test runs them with the quiet ones
MACHINE_WIDE_MODULES = ("tests/test_host.py", "tests/test_explain_host.py", "tests/test_explain_import.py",
                        "tests/test_explain_vm.py", "tests/test_env_libvirt.py")
# set-ups whose tests compare timings inside nested guests: beside other workers' guests an RTDS reservation's
# interruptions came out off their rate (the lab campaign runs alone, in the quiet phase), and the explanation
# lab's guest-side readings agreed with xentrace in 70 % of windows (87-96 % with nothing beside it).
# The KVM lab's campaign too, though it compares no timings: with it in the parallel phase (2026-12-04, its lab's
# stall long fixed) its test phases took 43.9 and 46.9 min against 41.9 without, the campaign itself 429-526 s against
# 214-264 s here, and another test's TCG guest beside it went 1.75 s without running.
QUIET_FIXTURES = ("lab_campaign", "libvirtd", "xen_lab", "kvm_lab_campaign")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks set as each test is collected, before anything reads them: xdist's worker (the groups) and -m (quiet)
    both read them in pytest_collection_modifyitems."""
    if item.nodeid.split("::")[0] in MACHINE_WIDE_MODULES or any(name in item.fixturenames
                                                                  for name in QUIET_FIXTURES):
        item.add_marker(pytest.mark.quiet)
    if item.get_closest_marker("xdist_group") is None and (group := _shared_setup(item)) is not None:
        item.add_marker(pytest.mark.xdist_group(group))


# what the suite starts that must not outlive it: a clean-up that fails quietly leaves one running, and the tests
# after it (the quiet phase's timings above all) pay for it unseen
OUTLIVING_KINDS = ("qemu-system", "libvirtd", "virtlogd", "postgres", "prometheus", "chromium", "stress-ng", "dask",
                   "-m rtvirt", "rtvirt-stress", "rtvirt-probe", "rtvirt-trace", "rtvirt-a653", "xl ", "sshd")


def _outliving(since: int) -> list[str]:
    """The processes of OUTLIVING_KINDS started since ``since`` (clock ticks since boot) that are orphans or
    still this process's own. An orphan's new parent is init or the nearest subreaper above it (a CI runner, a
    container's init): any ancestor of this process."""
    processes = live_processes()
    parent = {pid: int(fields[1]) for pid, fields in processes}

    def ancestors(pid: int) -> list[int]:
        line = []
        while pid > 1:
            pid = parent.get(pid, 0)
            line.append(pid)
        return line

    adopters = {1, *ancestors(os.getpid())}
    left = []
    for pid, fields in processes:
        if int(fields[19]) < since or pid == os.getpid() or pid in adopters:  # (fields[19]: its start time)
            continue  # (this pytest and what runs it: its command line may name a kind, as test_experiment_dask.py)
        if not (int(fields[1]) in adopters or os.getpid() in ancestors(pid)):
            continue
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(kind in command for kind in OUTLIVING_KINDS):
            left.append(f"{pid}: {command[:300]}")
    return left


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session fails when something it started outlives it (20 s allowed for what is stopping); an xdist
    worker leaves the check to the controller, which makes it once every worker has ended."""
    from rtvirt.procs import process_start_time

    if hasattr(session.config, "workerinput"):
        return
    started = int(process_start_time(os.getpid()) or 0)  # (this pytest's: what started since is the session's)
    deadline = time.monotonic() + 20
    while (left := _outliving(started)) and time.monotonic() < deadline:
        time.sleep(1)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line("processes this session started outlive it:\n  " + "\n  ".join(left), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def assert_given_host_tsc_rate(text: str, ending: str = r"(?:\s|$)") -> None:
    """``text`` (a kernel command line, a domain's XML) gives a guest kernel this host's cycle counter rate
    (tsc_early_khz, then ``ending``), within 0.01 %: each process measures the rate afresh over 50 ms, and a
    test's measurement and rtvirt's differed by 1 kHz in 2.4 GHz in a suite run. (A kernel's own calibration is
    within 0.1 % at best.)"""
    from rtvirt.environments.tcg_clock import host_cycles_khz

    match = re.search(rf"tsc_early_khz=(\d+){ending}", text)
    assert match is not None, text[-500:]
    assert abs(int(match.group(1)) / host_cycles_khz() - 1) < 1e-4, (match.group(1), host_cycles_khz())


def has_samples(stream: Path) -> bool:
    """A stream being written holds data records."""
    return samples_so_far(stream) > 0


def samples_so_far(stream: Path) -> int:
    """The data records a stream being written holds (polled as a follower reads it: read_stream refuses a stream
    whose header is not there yet, and the header alone is several hundred bytes)."""
    from rtvirt.stream import StreamReader

    reader = StreamReader(stream)
    try:
        return int(reader.poll().size)
    finally:
        reader.close()
