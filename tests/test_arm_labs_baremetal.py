"""Issue 41's acceptance on the ARM labs themselves: rtvirt's aarch64 bare-metal kernel as the guest of the ARM KVM
lab (rtvirt's own QEMU on the lab over SSH, ``kind = "qemu"``, ``host = "lab"``) and of the ARM Xen lab (a PVH
domU), as a campaign runs them. Its timer keeps a 1 kHz grid on both; an interference injected beside it comes
back as holes of the injected length, counted by the hypervisor as stolen from the guest and named in the run's
explanation: a task of the KVM lab's host at SCHED_FIFO 90 on the vCPU's CPU, 2 ms every 10 ms; a competing
domU on the same pCPU busy 5 ms every 20 ms.

Under TCG each of KVM's exits and entries costs about 0.3 ms of the emulated board's time (the stream's own
short gaps that lost nothing to anyone), and putting a preempted vCPU back more, so a KVM hole is the task's run
plus what the lab's own trace says KVM spent around it; the stolen time KVM counted in it runs from the task's
wake-up to the vCPU thread's return, as that trace says.
The KVM lab's clock exchange with the bare-metal guest is ±6-7 ms
there (its virtio console's round trips), so its VM layer cannot place a 2 ms hole: the guest layer names it,
from the stolen time the guest read in KVM's PV time structure.
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli

from rtvirt.explain.stored import read_explanation
from rtvirt.store import load_run, resolve_runs
from rtvirt.stream import read_stream

sys.path.insert(0, str(Path(__file__).parent / "arm64host"))
from harness import assert_injected_holes, injected_holes, needs_arm64_host  # noqa: E402

MS = 1_000_000
pytestmark = [*needs_arm64_host(), pytest.mark.timeout(3600)]

SCENARIO = """\
name = "arm-baremetal"
duration = "6s"
run_timeout = "20m"

[[workloads]]
name = "timer"
probe = "timer"
params = { interval = "1ms" }

[[workloads]]
name = "gap"
probe = "gap"
params = { threshold = "100us" }

[[environments]]
kind = "qemu"
name = "kvm-arm"
host = "lab"
arch = "aarch64"
guest = "baremetal"
cpus = [1]
boot_timeout = "10m"

[[environments]]
kind = "xen"
name = "xen-arm"
arch = "aarch64"
guest = "baremetal"
cpus = "1"
boot_timeout = "10m"

[[disturbances]]
name = "solo"

[[disturbances]]
name = "host-task"
[[disturbances.stressors]]
stressor = "cpu"
where = "same-core"
params = { priority = 90, slice = "2ms", period = "10ms" }

[[disturbances]]
name = "domain"
[[disturbances.stressors]]
stressor = "cpu"
where = "other-vm"
guest_cpus = "same-core"
params = { priority = 99, slice = "5ms", period = "20ms" }

[[groups]]
name = "timer"
workload = "timer"
disturbances = ["solo"]

[[groups]]
name = "kvm-holes"
workload = "gap"
environments = ["kvm-arm"]
disturbances = ["host-task"]
start_order = ["stress-first"]

[[groups]]
name = "xen-holes"
workload = "gap"
environments = ["xen-arm"]
disturbances = ["domain"]
start_order = ["stress-first"]

[timeline]
settle = "1s"

[explain]
layers = ["vm", "xen", "guest"]
threshold = "1ms"  # every injected hole an outlier (p99.9 would pick the board's few largest stalls)
top = 5000
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The campaign (four runs, one boot of each lab: under 3 min here), its runs by label."""
    work = tmp_path_factory.mktemp("arm-baremetal")
    (work / "arm-baremetal.toml").write_text(SCENARIO)
    finished = run_cli("run", str(work / "arm-baremetal.toml"), "--out", str(work / "results"), "--no-report",
                       timeout=3000)
    # (exit 1 only for a failed run or samples nothing accounts for: the emulated board's timer overruns are
    # counted, so a short timer run is not one)
    assert finished.returncode == 0, finished.stderr[-3000:]
    found = {run.run_id: run.path for run in resolve_runs(work / "results")}
    assert len(found) == 4, sorted(found)
    return found


def _run(runs: dict[str, Path], group: str, system: str) -> Path:
    (path,) = [path for run_id, path in runs.items() if f"-{group}_{system}_" in run_id]
    return path


def _detail(run: Path) -> dict[str, Any]:
    return load_run(run).manifest["environment_detail"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("system", ["kvm-arm", "xen-arm"])
def test_the_bare_metal_timer_keeps_its_1khz_grid_on_both_arm_labs(runs: dict[str, Path], system: str) -> None:
    run = _run(runs, "timer", system)
    stream = read_stream(run / "samples.rtvs")
    assert stream.header["guest"]["kind"] == "baremetal" and stream.header["host"]["machine"] == "aarch64"
    records = stream.records
    # every period of the 6 s run is a sample or a counted overrun (the emulated board's vCPU is late at times)
    assert records.size >= 3000 and records.size + stream.stats[(0, "overruns")] == 6000, (records.size, stream.stats)
    steps = np.diff(records["t_ns"].astype(np.int64))
    assert np.all(steps >= MS) and np.all(steps % MS == 0)  # expiries on the 1 ms grid of the generic timer
    detail = _detail(run)
    if system == "kvm-arm":  # KVM itself runs the guest (arm64 KVM at EL2 in the lab), not TCG inside the lab
        assert detail["acceleration"] == "kvm" and detail["kvm_host"]["accelerates"] is True, detail["kvm_host"]
        assert "emulated by TCG" in detail["kvm_lab"]["emulated"]


def test_a_kvm_lab_host_task_comes_back_as_holes_of_its_slice_named_stolen(runs: dict[str, Path]) -> None:
    run = _run(runs, "kvm-holes", "kvm-arm")
    holes = injected_holes(run / "samples.rtvs", 2 * MS, 10 * MS)  # (most windows, on a 10 ms grid within 10 %)
    stored = read_explanation(run)
    exits = _preempted_exits(stored, "rtvirt-stress", MS)
    # The time KVM counted as stolen in each hole is what the lab's own trace says: KVM adds the vCPU thread's
    # run_delay, which the scheduler starts at the task's wake-up (it skips the clock update of the switch the
    # wake-up forces), not at the thread's switch-out; it ends when the thread runs again. The task itself ran up
    # to its 2 ms: it ends its window at the planned time, so a late wake-up on the starved board shortens it
    # (counted from the switch-out alone the prediction fell 0.09-0.19 ms short; one suite's stolen median was
    # 1.74 ms against the 2 ms injected). Both sides keep the task's windows of at least half its slice, the holes
    # by what KVM counted, the exits by what the task ran: on a board starved enough that a fifth of its windows ran
    # under 1 ms (2026-12-01's clean-clone run: task median 1.51 ms), the exits' median with the short ones was
    # 0.18 ms below the holes' (1.81 against 1.99 ms; without them 1.96 ms).
    assert abs(np.median(holes.stolen) - np.median(exits.woken_to_back)) <= 0.1 * MS, (
        np.percentile(holes.stolen, [10, 50, 90]), np.percentile(exits.woken_to_back, [10, 50, 90]))
    assert np.median(exits.task) <= 2 * MS + 0.1 * MS and np.median(holes.stolen) >= MS, (
        np.percentile(exits.task, [10, 50, 90]), np.percentile(holes.stolen, [10, 50, 90]))
    # The hole around it is what the lab's own trace says the vCPU spent out of the guest for those preemptions
    # (on the lab's clock, from the task's wake-up by the timer interrupt that made the vCPU exit, ~70 us before
    # kvm_exit, to kvm_entry: the task's slice, then KVM putting the vCPU back, 0.2-0.4 ms under TCG and more when
    # this machine is busy), plus the world switch on either side that the tracepoints do not see. On the faster
    # machine of 2026-11-30's first campaign that unseen part was what an ordinary exit's is (its gap in the guest
    # less its time in the trace: 2.383 ms holes against 2.375 predicted); on this slower one it was 1.5-3.3 times
    # that in three campaigns (0.46-0.61 ms), varying with the machine's load. What is asserted: the hole holds the
    # trace's time (within 0.2 ms), and what the trace does not see of it is less than the window KVM counted.
    # (Timed from kvm_exit alone, the trace's time fell 0.12-0.20 ms short in four runs.)
    traced = np.median(exits.around)
    assert traced - 0.2 * MS <= np.median(holes.lengths) < traced + np.median(holes.stolen), (
        np.percentile(holes.lengths, [10, 50, 90]), np.percentile(exits.around, [10, 50, 90]),
        np.median(holes.exits), np.median(exits.ordinary))
    # the explanation names what KVM counted: the guest layer's stolen parts cover it, in every hole (each one an
    # outlier: a CI run named 269 of its 599 holes with a threshold of 1.5 ms, which a starved board's late
    # wake-ups put shortened windows under, and a top of 1000, which the board's own stalls can crowd)
    assert np.median(holes.named * holes.lengths / holes.stolen) >= 0.9, np.percentile(holes.named, [10, 50, 90])
    stolen = {part.sample_t_ns for part in stored.parts if part.kind == "stolen" and part.layer == "guest"}
    named = np.isin(holes.starts, np.array(sorted(stolen), dtype=np.int64))
    assert stored.threshold_ns <= np.min(holes.lengths) and named.all(), (
        {(part.layer, part.kind) for part in stored.parts}, stored.threshold_ns, stored.outliers, len(stolen),
        holes.lengths.size, named.sum())
    assert read_stream(run / "samples.rtvs").header["stolen"] == "kvm-pv-time"


@dataclass
class PreemptedExits:
    """From the VM layer's trace of the lab (its clock): the durations of the VM exits during which a task ran in
    the vCPU's place (``around``), of that task's stretches in them (``task``), from each such exit's start (the
    wake-up that made it) to the vCPU thread's return to its pCPU (``woken_to_back``, for the exits in which the task
    ran at least ``min_task_ns``), and of the other exits."""

    around: np.ndarray
    task: np.ndarray
    woken_to_back: np.ndarray
    ordinary: np.ndarray


def _preempted_exits(stored: Any, comm: str, min_task_ns: int) -> PreemptedExits:
    [vm] = [layer for layer in stored.layers if layer.layer == "vm"]
    preempted = sorted((o.start_ns, o.end_ns, o.detail.get("comm")) for o in vm.occupancies
                       if o.kind == "vcpu-preempted")
    starts = [start for start, _, _ in preempted]
    around, task, back, other = [], [], [], []
    for exit_ in (o for o in vm.occupancies if o.kind == "vm-exit"):
        inside = preempted[bisect.bisect_left(starts, exit_.start_ns):bisect.bisect_right(starts, exit_.end_ns)]
        inside = [(start, end, name) for start, end, name in inside if end <= exit_.end_ns]
        mine = [end - start for start, end, name in inside if name == comm]
        if not mine:
            other.append(exit_.end_ns - exit_.start_ns)
            continue
        around.append(exit_.end_ns - exit_.start_ns)
        task += mine
        if "before_kvm_exit_ns" in exit_.detail and sum(mine) >= min_task_ns:  # started at the wake-up
            back.append(max(end for _, end, _ in inside) - exit_.start_ns)
    tasks = sum(1 for *_, name in preempted if name == comm)
    assert len(around) >= tasks // 2 and len(back) >= len(around) // 2 and other, (len(around), tasks, len(back))
    return PreemptedExits(np.array(around), np.array(task), np.array(back), np.array(other))


def test_a_competing_domu_comes_back_as_holes_of_its_slice_named_with_the_domain(runs: dict[str, Path]) -> None:
    run = _run(runs, "xen-holes", "xen-arm")
    assert_injected_holes(run / "samples.rtvs", 5 * MS, 20 * MS)
    stored = read_explanation(run)
    # the domU that ran instead, by name, in the hypervisor's own trace
    named = {part.sample_t_ns for part in stored.parts
             if part.layer == "xen" and part.cause.startswith("runnable: domU ") and "-stress" in part.cause}
    assert len(named) >= injected_holes(run / "samples.rtvs", 5 * MS, 20 * MS).lengths.size // 2, \
        sorted({part.cause for part in stored.parts})[:10]
