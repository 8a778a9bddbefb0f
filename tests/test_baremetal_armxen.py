"""The aarch64 bare-metal kernel as a Xen domU on arm64, before the ARM labs: Debian's arm64 Xen 4.17 on an emulated
Cortex-A72 board with Debian's arm64 kernel as dom0 (xl, xenstored, xenconsoled from Debian's arm64 packages;
tests/arm64host) creates our kernel with ``xl create`` on pCPU 1 (credit scheduler), beside a second domU of our
kernel running the ``cpu`` stressor 5 ms of every 20 ms on the same pCPU. What it shows: Xen's domain builder loads
our Image, the kernel finds Xen in the device tree Xen writes, makes hypercalls with HVC, writes its console text and
its framed stream over Xen's PV console (dom0's xenconsoled log, split by the same ConsoleDemux as on x86), reads its
runstate area per sample, and stops on a ^C from dom0 (Xen on Arm has no NMI to give it): the competing domain's
5 ms come back as holes of 5 ms, 20 ms apart, each named in the explanation as time stolen by Xen."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rtvirt.environments.baremetal import ConsoleDemux
from rtvirt.stream import SampleStream, read_stream

sys.path.insert(0, str(Path(__file__).parent / "arm64host"))
from harness import XenJob, assert_injected_holes, needs_arm64_host, run_xen  # noqa: E402

MS = 1_000_000
pytestmark = needs_arm64_host()

JOBS = [XenJob("timer", "timer --duration=1000000000 --interval=1000000"),
        XenJob("gap-beside-domain", "gap --duration=3000000000 --threshold=300000",
               stress="cpu --duration=0 --slice=5000000 --period=20000000"),
        XenJob("stopped", "timer --duration=0 --interval=1000000", stop_after=3)]


@pytest.fixture(scope="module")
def domains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """One boot of Xen with its dom0, every job a domU in it: each job's stream and console text."""
    console, logs = run_xen(JOBS)
    assert "xen_scheduler : credit" in console, console[-3000:]
    tmp = tmp_path_factory.mktemp("armxen")
    found = {}
    for name, log in logs.items():
        demux = ConsoleDemux(tmp / f"{name}.rtvs")
        demux.feed(log)
        demux.close()
        assert demux.corrupt is None, (name, demux.corrupt)
        found[name] = (tmp / f"{name}.rtvs", demux.text())
    assert set(found) == {job.name for job in JOBS}, console[-3000:]
    return found


def _read(domains: dict[str, tuple[Path, str]], name: str) -> SampleStream:
    path, text = domains[name]
    assert "RTVIRT-EXIT 0" in text, text[-2000:]
    stream = read_stream(path)
    assert stream.corrupt is None and stream.total_dropped == 0
    assert stream.header["guest"] == {"kind": "baremetal", "boot": "image", "timer": "cntv-cval",
                                      "interrupt_controller": "gicv2", "counter_source": "cntfrq",
                                      "channel": "xen-console"}, stream.header["guest"]
    assert stream.header["stolen"] == "xen-runstate"
    return stream


def test_a_xen_domu_keeps_the_timers_1khz_grid(domains: dict[str, tuple[Path, str]]) -> None:
    stream = _read(domains, "timer")
    assert stream.end_reason == "complete"
    r = stream.records
    assert r.size >= 100 and r.size + stream.stats[(0, "overruns")] == 1000, (r.size, stream.stats)
    steps = np.diff(r["t_ns"].astype(np.int64))
    assert np.all(steps >= MS) and np.all(steps % MS == 0)


def test_a_competing_domain_comes_back_as_holes_named_stolen_by_xen(domains: dict[str, tuple[Path, str]]) -> None:
    stream = _read(domains, "gap-beside-domain")
    assert stream.end_reason == "complete"
    # its 5 ms of every 20 ms: Xen's runstate area counts them runnable, the explanation names them
    assert_injected_holes(domains["gap-beside-domain"][0], 5 * MS, 20 * MS)


def test_a_ctrl_c_from_dom0_stops_the_domu_with_every_sample_written(domains: dict[str, tuple[Path, str]]) -> None:
    stream = _read(domains, "stopped")
    assert stream.end_reason == "signal" and stream.written == stream.records.size
    assert stream.records.size >= 100  # it ran its ~3 s first
