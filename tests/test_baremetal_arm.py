"""The bare-metal guest on aarch64 (agents/baremetal/aarch64): real boots of our own kernel on QEMU's virt board with
an emulated Cortex-A72 (TCG), GICv2 and GICv3, through the qemu environment's ``arch = "aarch64"``.

Each probe's samples reach the host over the guest's virtio-mmio console and are read by the same readers as the x86
guest's (the stream reader, ``rtvirt stats``); the timer probe keeps the 1 kHz grid of the virtual timer; the
stressor programs and the stop request (the board's power button) work as on x86; a campaign run says what was
emulated; what cannot run is refused with exit 2 before anything boots.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RAN, run_cli

from rtvirt.agents import agent_args, agent_path
from rtvirt.environments.qemu import QemuConfig, QemuEnvironment
from rtvirt.environments.sched import SchedPolicy
from rtvirt.probes import PROBES
from rtvirt.procs import Supervisor
from rtvirt.stream import SampleStream, StreamReader, read_stream

pytestmark = [pytest.mark.vm,
              pytest.mark.skipif(shutil.which("qemu-system-aarch64") is None,
                                 reason="qemu-system-aarch64 is not installed (scripts/setup.sh arm)")]

CPUS = sorted(os.sched_getaffinity(0))
CPU = CPUS[-1]
MS = 1_000_000


def aarch64(gic: int = 2) -> QemuConfig:
    return QemuConfig(kind="qemu", cpus=(CPU,), accel="tcg", guest="baremetal", arch="aarch64", gic_version=gic,
                      vcpu_sched=SchedPolicy(policy="other"))


def boot(tmp_path: Path, probe: str, params: dict[str, Any] | None = None, *, gic: int = 2,
         agent: str = "rtvirt-probe", args: list[str] | None = None) -> tuple[QemuEnvironment, Path, int]:
    """One run of the aarch64 guest through the qemu environment: (env, stream, guest status)."""
    argv = args if args is not None else agent_args(PROBES[probe].params(affinity=(0,), **(params or {})))
    config = aarch64(gic)
    out = tmp_path / f"{probe}.rtvs"
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, tmp_path / f"vm-{probe}")
        try:
            launched = env.launch(agent, [probe, *argv], out)
            status = launched.proc.wait(timeout=300)  # type: ignore[union-attr]
            assert env.check() is None, env.console_text()[-2000:]
        finally:
            env.close()
    return env, out, status


def finished(env: QemuEnvironment, out: Path, status: int, gic: int = 2) -> SampleStream:
    assert status == 0, env.console_text()[-2000:]
    stream = read_stream(out)
    assert stream.end_reason == "complete" and stream.total_dropped == 0 and stream.corrupt is None
    assert stream.header["host"]["machine"] == "aarch64" and stream.header["host"]["cpus"] == 1
    guest = stream.header["guest"]
    assert guest == {"kind": "baremetal", "boot": "image", "timer": "cntv-cval", "interrupt_controller": f"gicv{gic}",
                     "counter_source": "cntfrq", "channel": "virtio-console"}, guest
    return stream


@pytest.mark.parametrize("gic", [2, 3])
def test_the_virtual_timer_keeps_its_1khz_grid_on_gicv2_and_gicv3(tmp_path: Path, gic: int) -> None:
    # 3 s: the suite's parallel phase runs this beside the ARM labs' campaign on 2 cores, where the emulated
    # board got 8 % of real time once (80 samples and 920 overruns of a 1 s run)
    env, out, status = boot(tmp_path, "timer", {"duration": "3s", "interval": "1ms"}, gic=gic)
    stream = finished(env, out, status, gic)
    r = stream.records
    # every period of the run is a sample or a counted overrun (a loaded TCG host misses many)
    assert r.size >= 100 and r.size + stream.stats[(0, "overruns")] == 3000, (r.size, stream.stats)
    assert np.all(r["value"] >= r["aux"].astype(np.int64))  # the handler runs before the thread
    steps = np.diff(r["t_ns"].astype(np.int64))
    periods = np.round(steps / MS)
    assert np.all(periods >= 1)
    # on the grid: the period is 62,500 counter ticks of the virt board's 62.5 MHz counter, exact in ns
    assert stream.header["cycles_hz"] == 62_500_000 and np.all(steps == periods * MS)
    # the same file through rtvirt stats, as any agent's stream
    result = run_cli("stats", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[str(out)]["thread 0"]["samples"] == r.size
    assert env.describe()["emulated"] == (f"QEMU's virt board with a GICv{gic}, the generic timer and an emulated "
                                          "cortex-a72 (TCG)")


def test_kops_times_sgis_switches_and_timers(tmp_path: Path) -> None:
    stream = finished(*boot(tmp_path, "kops", {"iterations": 50}, gic=3), gic=3)
    kinds = stream.header["kinds"]
    counts = np.bincount(stream.records["kind"], minlength=len(kinds))
    assert dict(zip(kinds, counts.tolist(), strict=True)) == {k: 50 for k in kinds}
    medians = {k: float(np.median(stream.records["value"][stream.records["kind"] == i])) for i, k in enumerate(kinds)}
    assert medians["irq_entry"] > 0 and medians["sem_switch"] > medians["sem_give"], medians


# quiet: every 250 ms interval must count rounds; beside the suite's other guests one woke 1.2 s late with 0 rounds
# (as tests/test_baremetal.py's x86 one)
@pytest.mark.quiet
def test_threadmetric_counts_rounds_per_interval(tmp_path: Path) -> None:
    stream = finished(*boot(tmp_path, "threadmetric", {"duration": "1200ms", "report_interval": "250ms"}))
    assert 3 <= stream.records.size <= 5 and np.all(stream.records["value"] > 0)
    assert stream.stats[(0, "counter_spread")] <= 1


def test_the_workload_kernels(tmp_path: Path) -> None:
    for kernel in ("qsort", "basicmath", "bitcount"):  # basicmath: the FP unit, enabled for the workload only
        stream = finished(*boot(tmp_path / kernel, "workload", {"duration": "20s", "loops": 3, "kernel": kernel,
                                                                "size": 65536}))
        assert stream.records.size == 3 and np.all(stream.records["value"] > 0)
        assert set(stream.records["kind"].tolist()) == {stream.header["kinds"].index(kernel)}


@pytest.mark.parametrize(("program", "stats"), [("cpu", {"spins_per_ms", "spins"}),
                                                ("cache", {"cache_level", "cache_bytes", "buffer_bytes", "passes"})])
def test_stressor_programs_run_until_stopped(tmp_path: Path, program: str, stats: set[str]) -> None:
    """A disturbing guest's program runs until the host presses the board's power button."""
    out = tmp_path / "stressor.rtvs"
    with Supervisor() as supervisor:
        env = QemuEnvironment(aarch64(), supervisor, tmp_path / "vm")
        try:
            launched = env.launch("rtvirt-stress", [program, "--workers=1"], out)
            reader = StreamReader(out)
            deadline = time.monotonic() + 120
            while reader.header is None:  # booted, its program started
                assert launched.poll() is None and time.monotonic() < deadline, env.console_text()[-1000:]
                time.sleep(0.2)
                reader.poll()
            time.sleep(2)  # a few 100 ms reports of the spinner, passes of the 1.5 MiB buffer
        finally:
            env.close()
    stream = read_stream(out)
    assert stream.end_reason == "signal" and {name for _, name in stream.stats} == stats, stream.stats
    if program == "cache":  # CCSIDR of the emulated Cortex-A72: a 1 MiB L2, stored over 1.5 x
        assert stream.stats[(0, "cache_level")] == 2 and stream.stats[(0, "cache_bytes")] == 1 << 20
        assert stream.stats[(0, "buffer_bytes")] == 3 << 19 and stream.stats[(0, "passes")] >= 1


@pytest.mark.parametrize("probe", ["timer", "gap"])
def test_the_power_button_stops_a_run_with_every_sample_written(tmp_path: Path, probe: str) -> None:
    """Closing the environment mid-run presses the virt board's power button (QMP system_powerdown): the guest
    writes out everything it took and ends its stream as SIGTERM ends an agent's. The gap probe spins with
    interrupts off: it sees the pending button in the GIC and stops, its statistics written."""
    params: dict[str, Any] = {"duration": 0, **({"interval": "1ms"} if probe == "timer" else {"threshold": "50us"})}
    out = tmp_path / "samples.rtvs"
    with Supervisor() as supervisor:
        env = QemuEnvironment(aarch64(), supervisor, tmp_path / "vm")
        try:
            launched = env.launch("rtvirt-probe", [probe, *agent_args(PROBES[probe].params(**params))], out)
            reader, seen = StreamReader(out), 0
            while seen < 30:
                assert launched.poll() is None, env.console_text()[-1000:]
                time.sleep(0.1)
                seen += reader.poll().size
        finally:
            env.close()
    assert launched.returncode == 0
    stream = read_stream(out)
    assert stream.end_reason == "signal" and stream.corrupt is None and stream.total_dropped == 0
    assert stream.records.size >= seen and stream.written == stream.records.size
    if probe == "gap":
        assert stream.stats[(0, "gaps")] == stream.records.size


ARM_SCENARIO = """\
name = "arm-bare"
duration = "1s"

[workload]
probe = "timer"
params = {{ interval = "1ms" }}

[[environments]]
kind = "qemu"
name = "a72"
guest = "baremetal"
arch = "aarch64"
gic_version = 3
cpus = [{cpu}]

[[disturbances]]
name = "solo"

[[disturbances]]
name = "beside-a72"
[[disturbances.stressors]]
stressor = "cpu"
where = "other-vm"
guest = "baremetal"
params = {{ slice = "5ms", period = "20ms" }}
"""


def test_a_campaign_runs_the_aarch64_guest_and_says_what_was_emulated(tmp_path: Path) -> None:
    scenario = tmp_path / "arm.toml"
    scenario.write_text(ARM_SCENARIO.format(cpu=CPU))
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"), "--no-report", timeout=300)
    assert result.returncode == 0, result.stderr
    manifests = {m.parent: json.loads(m.read_text()) for m in (tmp_path / "results" / "runs").glob("*/manifest.json")}
    assert len(manifests) == 2 and all(m["status"] in RAN for m in manifests.values())
    # the disturbing guest is an aarch64 bare-metal one too, its cpu program on a duty cycle
    beside = next(run for run, m in manifests.items() if "beside-a72" in run.name)
    stressor = read_stream(next(beside.glob("work/**/stressor.rtvs")))
    assert stressor.header["host"]["machine"] == "aarch64" and stressor.header["probe"] == "cpu"
    assert stressor.header["params"]["slice"] == 5 * MS and stressor.header["params"]["period"] == 20 * MS
    manifest = next(m for run, m in manifests.items() if run != beside)
    detail = manifest["environment_detail"]
    assert detail["arch"] == "aarch64" and detail["acceleration"] == "tcg"
    assert detail["acceleration_reason"] == "an aarch64 guest on an x86_64 host is emulated"
    assert detail["emulated"] == "QEMU's virt board with a GICv3, the generic timer and an emulated cortex-a72 (TCG)"
    assert agent_path("rtvirt-baremetal", "aarch64").read_bytes()[56:60] == b"ARM\x64"  # an arm64 Image


@pytest.mark.parametrize(("lines", "message"), [
    ('guest = "linux"\narch = "aarch64"', "field 'environments[0]': arch: an aarch64 guest is the "
                                          "bare-metal one for now"),
    ('guest = "baremetal"\narch = "aarch64"\naccel = "kvm"', "accel: KVM runs x86_64 guests here; an aarch64 guest "
                                                             "is emulated"),
    ('guest = "baremetal"\narch = "riscv64"', "field 'environments[0].arch'"),
    ('guest = "baremetal"\narch = "aarch64"\ngic_version = 4', "field 'environments[0].gic_version'"),
])
def test_rtvirt_run_exits_2_for_an_aarch64_guest_it_cannot_boot(tmp_path: Path, lines: str, message: str) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(f'name = "bad"\nduration = "1s"\n\n[workload]\nprobe = "timer"\n\n'
                        f'[[environments]]\nkind = "qemu"\n{lines}\n')
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "results" / "runs").exists()
