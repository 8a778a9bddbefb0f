"""The bare-metal guest (agents/baremetal): real boots under QEMU TCG of our own kernel.

Every probe is booted once with parameters rendered from the Linux probes' own pydantic models, the
way the campaign engine renders them; a host-side SCHED_FIFO duty cycle on the vCPU's CPU must show
up in the guest's gap probe with its length and period; a parameter the guest refuses stops it with
status 2; a PREEMPT_RT guest boots and its manifest says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RAN, run_cli

from rtvirt.agents import agent_args
from rtvirt.campaign import CampaignState, run_campaign
from rtvirt.environments import baremetal
from rtvirt.environments.qemu import QemuConfig, QemuEnvironment
from rtvirt.environments.sched import SchedPolicy
from rtvirt.errors import InputError, RtvirtError
from rtvirt.probes import PROBES
from rtvirt.procs import Supervisor
from rtvirt.scenario import parse_scenario
from rtvirt.store import load_run
from rtvirt.stream import RECORD, SampleStream, StreamReader, read_stream
from rtvirt.stressors import start_stressor

pytestmark = pytest.mark.vm

CPUS = sorted(os.sched_getaffinity(0))
CPU = CPUS[-1]
MS = 1_000_000


def boot(tmp_path: Path, probe: str, params: dict[str, Any] | None = None, raw: list[str] | None = None,
         vcpu_sched: SchedPolicy | None = None) -> tuple[QemuEnvironment, Path, int, RtvirtError | None]:
    """Run one probe in the bare-metal guest through the qemu environment: (env, stream, guest status,
    the error the environment's watchdog raised for the finished guest).

    ``params`` go through the probe's pydantic model and agent_args, as the campaign engine does;
    ``raw`` arguments are passed as given (what the models cannot produce)."""
    args = raw if raw is not None else agent_args(PROBES[probe].params(affinity=(0,), **(params or {})))
    config = QemuConfig(kind="qemu", cpus=(CPU,), accel="tcg", guest="baremetal",
                        vcpu_sched=vcpu_sched or SchedPolicy(policy="other"))
    out = tmp_path / f"{probe}.rtvs"
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, tmp_path / f"vm-{probe}")
        try:
            launched = env.launch("rtvirt-probe", [probe, *args], out)
            status = launched.proc.wait(timeout=180)  # type: ignore[union-attr]
            try:
                error = None
                assert env.check() is None, f"status {status}: {env.console_text()[-2000:]}"
            except RtvirtError as exc:
                error = exc
        finally:
            env.close()
    return env, out, status, error


def finished(env: QemuEnvironment, out: Path, status: int, error: RtvirtError | None) -> SampleStream:
    assert status == 0 and error is None, env.console_text()[-2000:]
    stream = read_stream(out)
    assert stream.end_reason == "complete" and stream.total_dropped == 0 and stream.corrupt is None
    assert stream.header["guest"]["kind"] == "baremetal" and stream.header["host"]["cpus"] == 1
    assert stream.header["guest"]["channel"] == "virtio-console"
    return stream


@pytest.fixture(scope="module")
def kops_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("kops")
    finished(*boot(tmp, "kops", {"iterations": 100}))
    out = tmp / "kops.rtvs"
    yield out


def test_timer_interrupt_and_thread_latency(tmp_path: Path) -> None:
    stream = finished(*boot(tmp_path, "timer", {"duration": "1s", "interval": "2ms"}))
    r = stream.records
    assert stream.header["params"]["interval"] == 2 * MS  # the model's value, in ns, as the Linux agent echoes it
    assert stream.header["aux_field"] == "irq_latency_ns"
    # 500 periods in the second from the first: each one is a sample or a counted overrun (a loaded TCG host
    # misses many; counted from the run's start, a slow header write once left 3 periods neither)
    assert r.size >= 20 and r.size + stream.stats[(0, "overruns")] == 500, (r.size, stream.stats)
    # the handler runs before the thread resumes: every thread latency covers its interrupt latency
    assert np.all(r["value"] >= r["aux"].astype(np.int64))
    steps = np.diff(r["t_ns"].astype(np.int64))
    periods = np.round(steps / (2 * MS))
    assert np.all(periods >= 1)  # each period sampled once at most
    assert np.all(np.abs(steps - periods * 2 * MS) <= 2 + periods)  # on the grid (period rounded to whole cycles)


def test_kops_keeps_every_iteration_of_every_operation(kops_stream: Path) -> None:
    stream = read_stream(kops_stream)
    kinds = stream.header["kinds"]
    counts = np.bincount(stream.records["kind"], minlength=len(kinds))
    assert dict(zip(kinds, counts.tolist(), strict=True)) == {k: 100 for k in kinds}
    assert stream.stats[(0, "iterations")] == 700  # 7 measured sequences, two of them timing two operations
    medians = {k: float(np.median(stream.records["value"][stream.records["kind"] == i])) for i, k in enumerate(kinds)}
    # a switch to another thread costs more than a give or put that switches nothing
    assert medians["sem_switch"] > medians["sem_give"] and medians["msgq_switch"] > medians["msgq_put"]


# quiet: every 250 ms interval must count rounds. In a clean-clone run's parallel phase (2026-11-27) two of five
# counted 0 and 2: the reporter woke 251 ms late, then 130 ms after that with no round counted (``aux``: the time
# since the last report), so the guest's vCPU had run nothing for a stretch: other tests' guests and FIFO threads
# held both host CPUs
@pytest.mark.quiet
def test_threadmetric_counts_rounds_per_interval(tmp_path: Path) -> None:
    stream = finished(*boot(tmp_path, "threadmetric", {"duration": "1500ms", "report_interval": "250ms"}))
    r = stream.records
    assert 4 <= r.size <= 6 and np.all(r["value"] > 0)
    steps = np.diff(r["t_ns"].astype(np.int64))  # planned report times, one interval apart
    assert np.all(np.abs(steps - 250 * MS) <= 10) and np.all(r["aux"] > 0)
    assert stream.stats[(0, "counter_spread")] <= 1
    assert stream.stats[(0, "rounds_total")] >= int(r["value"].sum())


@pytest.mark.parametrize("kernel", ["qsort", "basicmath", "bitcount"])
def test_workload_runs_the_linux_probes_kernels(tmp_path: Path, kernel: str) -> None:
    stream = finished(*boot(tmp_path, "workload", {"duration": "20s", "loops": 5, "kernel": kernel,
                                                   "size": 65536}))
    assert stream.records.size == 5 and set(stream.records["kind"].tolist()) == {stream.header["kinds"].index(kernel)}
    assert np.all(stream.records["value"] > 0)


@pytest.mark.skipif(len(CPUS) < 2 or os.geteuid() != 0, reason="needs a second CPU for QEMU's other threads, "
                    "and root for SCHED_FIFO")
def test_host_fifo_duty_cycle_shows_in_the_guest_gap_probe(tmp_path: Path) -> None:
    """A SCHED_FIFO thread above the vCPU thread on its CPU, busy 2 ms every 10 ms: the guest sees holes
    of 2 ms every 10 ms, however the TCG-emulated guest counts its own time."""
    params = {"cpus": [CPU], "priority": 90, "duration": 0, "slice": "2ms", "period": "10ms"}
    with Supervisor() as supervisor:
        running = start_stressor("cpu", params, supervisor)
        try:
            stream = finished(*boot(tmp_path, "gap", {"duration": "3s", "threshold": "300us"},
                                    vcpu_sched=SchedPolicy(policy="fifo", priority=80)))
        finally:
            running.stop()
    gaps = stream.records[stream.records["value"] >= 1 * MS]
    assert gaps.size >= 200, f"expected ~300 holes of 2 ms in 3 s, saw {gaps.size}"
    lengths, spacing = gaps["value"], np.diff(gaps["t_ns"].astype(np.int64))
    assert abs(np.median(lengths) - 2 * MS) <= 0.15 * 2 * MS
    assert abs(np.median(spacing) - 10 * MS) <= 0.1 * 10 * MS
    assert np.mean(np.abs(spacing - 10 * MS) <= 1 * MS) >= 0.7
    assert stream.stats[(0, "cpu_share_ppm")] <= 850_000


def test_a_parameter_the_guest_refuses_stops_it_with_status_2(tmp_path: Path) -> None:
    # timerlat is valid for the Linux agent (the model accepts it) but not in our kernel
    _, _, status, error = boot(tmp_path, "timer", {"engine": "timerlat"})
    assert status == 2 and isinstance(error, InputError) and error.exit_code == 2
    assert re.search(r"'--engine'.*timerlat is a Linux tracer", str(error))
    _, out, status, error = boot(tmp_path, "gap", raw=["--threshold=12abc"])
    assert status == 2 and isinstance(error, InputError)
    assert "invalid value for '--threshold': '12abc'" in str(error)
    assert not out.exists() or out.stat().st_size == 0  # refused before the stream began


def test_a_corrupted_stream_is_refused_after_its_valid_prefix(kops_stream: Path, tmp_path: Path) -> None:
    data = kops_stream.read_bytes()
    good = read_stream(kops_stream)
    start = len(data) - (good.records.size + len(good.stats) + 2) * RECORD.itemsize  # header end
    # line noise in record 500: flag bits no writer sets
    noisy = bytearray(data)
    at = start + 500 * RECORD.itemsize
    noisy[at + 30:at + 32] = b"\xff\x7f"
    (tmp_path / "noisy.rtvs").write_bytes(noisy)
    stream = read_stream(tmp_path / "noisy.rtvs")
    assert stream.corrupt is not None and f"byte {at}" in stream.corrupt
    assert stream.records.size == 500 and np.array_equal(stream.records, good.records[:500])
    assert stream.end_reason is None  # the END record lay beyond the damage: the run reads as partial
    # one byte lost on the channel: every later record is misaligned
    shifted = data[:at + 7] + data[at + 8:]
    (tmp_path / "shifted.rtvs").write_bytes(shifted)
    stream = read_stream(tmp_path / "shifted.rtvs")
    assert stream.corrupt is not None and np.array_equal(stream.records, good.records[:stream.records.size])
    assert 500 <= stream.records.size < good.records.size
    # bytes after END
    (tmp_path / "trailing.rtvs").write_bytes(data + data[start:start + 64])
    stream = read_stream(tmp_path / "trailing.rtvs")
    assert "after END" in (stream.corrupt or "") and stream.end_reason == "complete"
    assert np.array_equal(stream.records, good.records)


GUESTS_SCENARIO = """\
name = "guest-kernels"
duration = "2s"
run_timeout = "600s"

[workload]
probe = "timer"
params = {{ interval = "2ms" }}

[[environments]]
kind = "qemu"
name = "rt"
accel = "tcg"
guest = "linux-rt"
cpus = [{cpu}]
boot_timeout = "400s"

[[environments]]
kind = "qemu"
name = "bare"
accel = "tcg"
guest = "baremetal"
cpus = [{cpu}]
"""


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="the linux-rt kernel comes from apt-get download")
def test_preempt_rt_and_baremetal_guests_in_a_campaign_say_so_in_their_manifests(tmp_path: Path) -> None:
    text = GUESTS_SCENARIO.format(cpu=CPU)
    scenario = parse_scenario(text, "guests.toml")
    state = CampaignState.create(tmp_path, scenario.name, text, "guests.toml", 1.0)
    outcomes = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes
    for key in ("rt/solo/-/r1", "bare/solo/-/r1"):
        assert outcomes[key].status in RAN, outcomes[key].reason
    rt = load_run(tmp_path / "runs" / outcomes["rt/solo/-/r1"].run_id).manifest
    assert rt["environment_detail"]["guest"] == "linux-rt" and rt["environment_detail"]["preempt_rt"] is True
    assert "-rt-" in rt["environment_detail"]["guest_kernel"]
    bare = load_run(tmp_path / "runs" / outcomes["bare/solo/-/r1"].run_id).manifest
    assert bare["environment_detail"]["guest"] == "baremetal"
    assert bare["environment_detail"]["guest_kernel"] == "rtvirt-baremetal"


def test_libvirt_and_xen_take_the_same_guest_field_and_refuse_what_they_cannot_boot() -> None:
    from rtvirt.environments.libvirt import LibvirtConfig
    from rtvirt.environments.xen import XenConfig

    assert LibvirtConfig(kind="libvirt", guest="linux-rt").guest == "linux-rt"
    assert LibvirtConfig(kind="libvirt", guest="baremetal").guest == "baremetal"
    with pytest.raises(ValueError, match="vcpus: the bare-metal guest runs on one vCPU"):
        LibvirtConfig(kind="libvirt", guest="baremetal", vcpus=2)
    assert XenConfig(kind="xen").model_dump()["guest"] == "linux"  # recorded in the manifest's environment_detail
    assert XenConfig(kind="xen", guest="linux-rt").guest == "linux-rt"
    assert XenConfig(kind="xen", guest="baremetal").guest == "baremetal"  # a PVH domU (tests/test_baremetal_xen.py)
    with pytest.raises(ValueError, match="vcpus: the bare-metal guest runs on one vCPU"):
        XenConfig(kind="xen", guest="baremetal", vcpus=2)
    with pytest.raises(ValueError, match="vcpus: the bare-metal guest runs on one vCPU"):
        QemuConfig(kind="qemu", guest="baremetal", vcpus=2)


@pytest.mark.parametrize(("channel", "devices"), [("debugcon", ["-debugcon", "file:{out}"]),
                                                  ("com2", ["-serial", "file:{out}"])])
def test_without_virtio_the_stream_takes_the_debug_console_or_com2(tmp_path: Path, channel: str,
                                                                   devices: list[str]) -> None:
    out, console = tmp_path / "kops.rtvs", tmp_path / "console.log"
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "128", "-display", "none", "-nodefaults",
            "-no-reboot", "-kernel", str(baremetal.kernel_path()), "-append", "kops --iterations=20",
            "-serial", f"file:{console}", *[d.format(out=out) for d in devices],
            *baremetal.qemu_devices("x86_64", None)]
    with Supervisor() as supervisor:
        proc = supervisor.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert baremetal.GuestProcess(proc, console).wait(timeout=120) == 0, console.read_text()[-1000:]
    stream = read_stream(out)
    assert stream.header["guest"]["channel"] == channel and stream.end_reason == "complete"
    assert stream.records.size == 20 * len(stream.header["kinds"]) and stream.corrupt is None


@pytest.mark.parametrize("probe", ["timer", "gap"])
def test_stopping_a_running_guest_writes_out_every_sample(tmp_path: Path, probe: str) -> None:
    """Closing the environment mid-run (Ctrl-C, a watchdog) stops the guest as SIGTERM stops an agent:
    everything it took reaches the file and the stream ends with reason 'signal'."""
    params: dict[str, Any] = {"duration": 0, **({"interval": "1ms"} if probe == "timer" else {"threshold": "50us"})}
    out = tmp_path / "samples.rtvs"
    config = QemuConfig(kind="qemu", cpus=(CPU,), accel="tcg", guest="baremetal",
                        vcpu_sched=SchedPolicy(policy="other"))
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, tmp_path / "vm")
        try:
            launched = env.launch("rtvirt-probe", [probe, *agent_args(PROBES[probe].params(**params))], out)
            reader, seen = StreamReader(out), 0
            while seen < 30:  # running, with samples on the host already
                assert launched.poll() is None, env.console_text()[-1000:]
                time.sleep(0.1)
                seen += reader.poll().size
        finally:
            env.close()
    assert launched.returncode == 0
    stream = read_stream(out)
    assert stream.end_reason == "signal" and stream.corrupt is None and stream.total_dropped == 0
    assert stream.records.size >= seen and stream.written == stream.records.size


@pytest.mark.parametrize(("params", "message"), [
    ('probe = "timer"\nparams = { engine = "timerlat" }', "engine: timerlat is a Linux tracer"),
    ('probe = "gap"\nparams = { work = true }', "work: the bare-metal gap probe spins on the TSC only"),
    ('probe = "wakeup"', "the bare-metal guest runs timer, gap, kops, threadmetric, workload, not wakeup"),
])
def test_rtvirt_run_exits_2_for_what_the_bare_metal_guest_cannot_run(tmp_path: Path, params: str,
                                                                    message: str) -> None:
    scenario = tmp_path / "bare.toml"
    scenario.write_text(f'name = "bare"\nduration = "1s"\n\n[workload]\n{params}\n\n'
                        '[[environments]]\nkind = "qemu"\nguest = "baremetal"\n')
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"))
    assert result.returncode == 2, result.stderr
    assert "field 'workload.params'" in result.stderr and message in result.stderr
    assert not (tmp_path / "results" / "runs").exists()  # refused before anything booted
