"""The bare-metal guest as a Xen PVH domU: its console protocol (text and framed stream on one PV console) and
real runs in the Xen lab (Xen 4.17 nested in QEMU/TCG), which share the lab campaign of tests/test_env_xen.py:
one lab boot for every Xen test of the session.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from test_env_xen import _run, lab_campaign  # noqa: F401 - the session's lab campaign fixture (one boot)

from rtvirt.environments.baremetal import FRAME_MAGIC, ConsoleDemux, xen_domain_lines
from rtvirt.environments.base import SharedResources
from rtvirt.environments.xen import XenConfig, XenEnvironment
from rtvirt.errors import InputError
from rtvirt.scenario.loader import parse_scenario
from rtvirt.stream import read_stream

MS = 1_000_000


def _frame(payload: bytes) -> bytes:
    return FRAME_MAGIC + len(payload).to_bytes(2, "little") + payload


def test_the_console_splits_into_text_and_the_framed_stream_whatever_the_read_sizes(tmp_path: Path) -> None:
    rng = random.Random(12)
    # stream bytes hold what text cannot (NUL, the console's own marks): they must stay in the stream
    chunks = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000))) for _ in range(20)]
    chunks[3] = b"\nRTVIRT-EXIT 0\n\0RVS" + chunks[3]
    console = b"RTVIRT-READY 1200 us after reset (TSC xen-cpuid)\n"
    for chunk in chunks:
        console += _frame(chunk)
    console += b"\nrtvirt-baremetal: done\nRTVIRT-EXIT 0\n"
    out = tmp_path / "stream.rtvs"
    demux = ConsoleDemux(out)
    at = 0
    while at < len(console):  # dom0's log arrives in pieces of any size: headers split too
        step = rng.choice((1, 2, 5, 7, 100, 4096))
        demux.feed(console[at:at + step])
        at += step
    demux.close()
    assert out.read_bytes() == b"".join(chunks) and demux.stream_bytes == sum(map(len, chunks))
    assert demux.corrupt is None
    assert demux.text().splitlines() == ["RTVIRT-READY 1200 us after reset (TSC xen-cpuid)", "",
                                         "rtvirt-baremetal: done", "RTVIRT-EXIT 0"]


def test_a_frame_that_is_not_ours_ends_the_stream_and_keeps_its_prefix(tmp_path: Path) -> None:
    out = tmp_path / "stream.rtvs"
    demux = ConsoleDemux(out)
    demux.feed(b"boot\n" + _frame(b"first") + b"\0XYZ\x05\x00later" + _frame(b"second") + b"\nRTVIRT-EXIT 1\n")
    demux.close()
    assert out.read_bytes() == b"first"
    assert demux.corrupt == "a malformed stream frame after 5 stream bytes"
    assert demux.text().endswith("RTVIRT-EXIT 1\n")


def test_the_xen_environment_takes_the_bare_metal_guest_as_a_one_vcpu_pvh_domu(tmp_path: Path) -> None:
    config = XenConfig(kind="xen", guest="baremetal", mode="pvh")
    assert config.guest == "baremetal"
    # a disturbing domU beside our kernel is a Linux domU of the configured mode (it was created as PV and then
    # refused for not being the PVH our kernel needs)
    with SharedResources() as shared:
        env = XenEnvironment(XenConfig(kind="xen", guest="baremetal"), shared.supervisor, tmp_path, shared)
        stressor = env.stressor_guest(1, None)
        assert isinstance(stressor, XenEnvironment)
        assert (env._domain_type(), stressor._domain_type(), stressor._flavour()) == ("pvh", "pv", "linux")
    with pytest.raises(ValueError, match="vcpus: the bare-metal guest runs on one vCPU"):
        XenConfig(kind="xen", guest="baremetal", vcpus=2)
    with pytest.raises(ValueError, match="mode: the bare-metal guest boots as a PVH domU"):
        XenConfig(kind="xen", guest="baremetal", mode="pv")
    assert xen_domain_lines("/run/rtvirt/d/kernel", "timer --interval=1000000", 64) == [
        'type = "pvh"', 'kernel = "/run/rtvirt/d/kernel"', 'cmdline = "timer --interval=1000000"', "memory = 64",
        'tsc_mode = "native"']
    with pytest.raises(InputError, match="cannot contain"):
        xen_domain_lines("/k", 'workload --kernel=a"b', 64)


def test_a_workload_only_linux_runs_is_refused_for_a_bare_metal_domu() -> None:
    text = ('name = "x"\nduration = "2s"\n[workload]\nprobe = "timer"\nparams = { engine = "timerlat" }\n'
            '[[environments]]\nkind = "xen"\nname = "bare"\nguest = "baremetal"\n')
    with pytest.raises(InputError, match=r"engine: timerlat is a Linux tracer.*guest = 'baremetal' in bare"):
        parse_scenario(text, "bad.toml")


# the lab campaign is tests/test_env_xen.py's (one boot for all the session's Xen tests): its bare-metal domUs
# (bare-pvh, the RTDS servers, the null pool) take 6-9 s a run there
@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_timer_samples_from_a_bare_metal_pvh_domu_land_in_the_results_store(
        lab_campaign: tuple[Path, dict[str, Any]]) -> None:  # noqa: F811 - the imported fixture
    manifest = _run(lab_campaign, "bare-timer/bare-pvh/alone/-/r1")
    assert manifest["probe"] == "timer" and manifest["summary"]["all"]["dropped"] == 0
    assert manifest["summary"]["all"]["samples"] > 100
    detail = manifest["environment_detail"]
    assert (detail["guest"], detail["guest_kernel"], detail["preempt_rt"]) == ("baremetal", "rtvirt-baremetal", False)
    assert detail["applied"]["type"] == "pvh" and [v["hard_affinity"] for v in detail["applied"]["vcpu_list"]] == ["1"]
    assert detail["boot_seconds"] is not None
    # every record the guest wrote was split from dom0's console log, none garbled on the way
    delivery = manifest["delivery"]
    assert delivery["agent_records"] == delivery["host_records"] == manifest["summary"]["all"]["samples"]
    assert delivery["channel_corrupt"] is None and delivery["corrupt"] is None
    results, summary = lab_campaign
    stream = read_stream(results / "runs" / summary["runs"]["bare-timer/bare-pvh/alone/-/r1"]["run_id"] /
                         "samples.rtvs")
    # the guest booted through its PVH entry and wrote the stream through its own Xen console driver
    assert stream.header["guest"]["boot"] == "pvh" and stream.header["guest"]["channel"] == "xen-console"
    assert stream.header["guest"]["tsc_source"] == "xen-cpuid" and stream.end_reason == "complete"
    latency, irq = stream.records["value"], stream.records["aux"]
    assert (latency > 0).all() and (irq.astype("int64") <= latency).all()  # the handler runs before the thread


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_an_rtds_reservation_shows_in_the_bare_metal_domus_gap_probe(
        lab_campaign: tuple[Path, dict[str, Any]]) -> None:  # noqa: F811 - the imported fixture
    key = "rtds/rtds-4-10/alone/-/r1"
    applied = _run(lab_campaign, key)["environment_detail"]["applied"]
    assert applied["pool"].startswith("rtvirt-rtds-")
    assert [(r["Period"], r["Budget"], r["Extratime"]) for r in applied["sched_rtds"]] == [("10000", "4000", "no")]
    results, summary = lab_campaign
    stream = read_stream(results / "runs" / summary["runs"][key]["run_id"] / "samples.rtvs")
    gaps_ms = stream.records["value"] / MS
    starts_ms = stream.records["t_ns"] / MS
    assert len(gaps_ms) > 20 and stream.stats[(0, "loop_min_ns")] < 1000  # the TSC is read natively
    # holes of period - budget (6 ms), one per 10 ms period: nested TCG stretches and merges some, never by 3x
    median_ms = statistics.median(gaps_ms)
    spacing_ms = statistics.median(b - a for a, b in zip(starts_ms, starts_ms[1:], strict=False))
    assert 6 / 3 < median_ms < 6 * 3, median_ms
    assert 10 / 3 < spacing_ms < 10 * 3, spacing_ms
