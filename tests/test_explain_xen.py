"""The Xen layer of explanations (explain.xen): xentrace in the lab's dom0 beside a gap probe in an RTDS domU.

One lab boot (module fixture) serves the traced runs: a competing RT domU on the measuring domU's pCPU, an
RTDS budget shorter than the bare-metal kernel's work (read by two tests), the bare-metal timer probe, a stressor
inside a Linux domU and a long run kept by the flight recorder. The reader of xentrace's records and the clock
alignment are also checked on records built from Xen's trace.h layout. Lab timings are TCG-nested: assertions
check causes and proportions.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import guest_stressor_cause

from rtvirt.environments.base import SharedResources
from rtvirt.environments.lab_machine import free_port
from rtvirt.environments.xen import XenConfig, XenEnvironment
from rtvirt.explain.config import ExplainConfig
from rtvirt.explain.guest import read_guest_trace
from rtvirt.explain.model import Explanation, LayerTrace
from rtvirt.explain.sources import session_for
from rtvirt.explain.stored import read_explanation
from rtvirt.explain.xen import _exhaustions, reclaim_xentrace
from rtvirt.explain.xenalign import align
from rtvirt.explain.xentrace import (
    TRC_RTDS_BUDGET_BURN,
    TRC_RTDS_BUDGET_REPLENISH,
    TraceError,
    parse_records,
    read_trace,
)
from rtvirt.probes import PROBES
from rtvirt.stream import read_stream
from rtvirt.stressors.registry import STRESSORS

RUN_S = 3
THRESHOLD_US = 1000  # gaps the test explains (the lab's own noise stays below)
PERIOD_US, BUDGET_US = 10_000, 4_000
WINDOW = np.dtype([("start_ns", "<i8"), ("end_ns", "<i8"), ("cpu", "<i2")])


def _record(event: int, data: tuple[int, ...], tsc: int | None) -> bytes:
    header = event | len(data) << 28 | (1 << 31 if tsc is not None else 0)
    body = struct.pack("<II", tsc & 0xFFFFFFFF, tsc >> 32) if tsc is not None else b""
    return struct.pack("<I", header) + body + struct.pack(f"<{len(data)}I", *data)


def test_records_are_read_per_pcpu_with_their_tsc_and_a_cut_tail_is_dropped() -> None:
    blob = (_record(0x1F003, (1, 64), None) + _record(0x21101, (5 << 16 | 2,), 1 << 33)
            + _record(0x28004, (9,), None) + _record(0x1F003, (0, 32), None) + _record(0x21011, (5 << 16 | 2,), 7))
    records = list(parse_records(blob + _record(0x21101, (1,), 8)[:6]))
    assert [(r.cpu, r.tsc, r.event, r.data) for r in records] == [
        (1, 1 << 33, 0x21101, (5 << 16 | 2,)), (1, 1 << 33, 0x28004, (9,)), (0, 7, 0x21011, (5 << 16 | 2,))]
    trace = read_trace(blob)
    assert trace.runstates[(5, 2)] == [(7, "runnable", 0), (1 << 33, "running", 1)]
    assert trace.running == {1: [(1 << 33, 5, 2)]}
    with pytest.raises(TraceError, match="not a xentrace file"):
        list(parse_records(_record(0x21101, (1,), 5)))


def _block(cpu: int, records: bytes) -> bytes:
    """One pCPU buffer window as xentrace writes it: a CPU_CHANGE record (pCPU, length), then its records."""
    return _record(0x1F003, (cpu, len(records)), None) + records


def test_the_xentrace_stream_is_cut_at_whole_pcpu_blocks_and_freed_behind(tmp_path: Path) -> None:
    """The flight recorder's xentrace streams into a file that grows while the run goes: what is taken is whole
    pCPU blocks (a block still arriving waits), readable as a trace on its own and joined with the next, and the
    file gives back what was taken (no longer a 2 GB file after an 8 h run)."""
    from rtvirt.explain.xensegments import _Stream

    running = [_block(cpu, b"".join(_record(0x21101, (5 << 16 | 2,), (cpu + 1) * 10**6 + i) for i in range(3000)))
               for cpu in (0, 1, 0)]
    local = tmp_path / "stream.bin"
    stream = _Stream(local, None, follows=False)
    assert stream.take() == (b"", None)  # nothing arrived yet: no file
    local.write_bytes(running[0] + running[1][:100])
    first, problem = stream.take()
    assert problem is None and first == running[0]
    with local.open("ab") as f:
        f.write(running[1][100:] + running[2])
    second, _ = stream.take()
    assert second == running[1] + running[2] and stream.take() == (b"", None)
    records = list(parse_records(first)) + list(parse_records(second))
    assert [r.cpu for r in records] == [0] * 3000 + [1] * 3000 + [0] * 3000
    assert local.stat().st_size == 3 * len(running[0]) and local.stat().st_blocks * 512 <= 1 << 16  # (64 KiB steps)
    with local.open("ab") as f:  # not xentrace's blocks: the rest is not trusted, and the notes say so
        f.write(b"\xff" * 64)
    assert stream.take()[1] == (f"xentrace's stream broke at byte {3 * len(running[0])} ('{'?' * 32}'...): its rest "
                                "is not read")
    stream.close()
    assert not local.exists()


def test_a_stream_segment_is_placed_by_its_records_times_and_the_quickest_delivery() -> None:
    """Segments are judged by which samples lie in them, so they are placed on this host's clock while the run
    goes: by their records' TSC, offset by the quickest delivery seen (records held back in dom0's pipe or the
    lab's SSH channel arrive late, in bursts, and would place a segment late)."""
    from rtvirt.explain.xensegments import _TraceClock

    clock = _TraceClock(ns_per_tick=0.5)  # a 2 GHz TSC
    block = _block(0, _record(0x21101, (1,), 2_000_000_000) + _record(0x21101, (1,), 4_000_000_000))
    assert clock.span(block) is None  # nothing arrived yet: not placed
    clock.arrived(block, 5_000_000_000)  # its newest record (2 s of TSC) arrived 3 s later
    clock.arrived(_block(0, _record(0x21101, (1,), 6_000_000_000)), 3_100_000_000)  # 0.1 s later: quicker
    assert clock.span(block) == (1_100_000_000, 2_100_000_000)
    assert _TraceClock(None).span(block) is None  # without Xen's TSC rate: by arrival (the recorder's fallback)


def test_an_rtds_depletion_names_its_replenishment_and_the_slice_that_emptied_it() -> None:
    """Xen 4.17's burn record (unit:16 dom:16, cur_budget s64, delta int, ...) and replenishment record (unit/dom,
    cur_deadline u64, cur_budget u64): a slice charged past the whole 10 ms budget empties it until the next
    replenishment; a burn that leaves budget is no depletion."""
    unit = 2 << 16 | 0  # domain 2, vCPU 0 as RTDS packs it (unit low, dom high)

    def burn(tsc: int, left: int, charged: int) -> bytes:
        return _record(TRC_RTDS_BUDGET_BURN, (unit, left & 0xFFFFFFFF, left >> 32 & 0xFFFFFFFF, charged, 0, 0), tsc)

    def replenish(tsc: int, deadline: int) -> bytes:
        return _record(TRC_RTDS_BUDGET_REPLENISH, (unit, 0, deadline & 0xFFFFFFFF, deadline >> 32, 10_000_000, 0),
                       tsc)

    blob = (_record(0x1F003, (1, 64), None) + burn(100, 6_000_000, 4_000_000) + burn(200, 0, 10_537_421)
            + replenish(300, 105_310_000_000))
    trace = read_trace(blob)
    assert trace.burns[(2, 0)] == [(100, 6_000_000, 4_000_000), (200, 0, 10_537_421)]
    assert _exhaustions(trace, (2, 0)) == [(200, 300, {"deadline_ns": 105_310_000_000, "budget_ns": 10_000_000,
                                                       "charged_ns": 10_537_421})]


def test_alignment_puts_the_vcpus_waits_inside_the_windows_they_caused() -> None:
    """Windows hold a wait of the vCPU sharing their start (preempted, then the guest lost more time) or their
    end (woken late); the mapping is found from them alone, through a TSC rate 10 ppm off the one Xen gives."""
    ns_per_tick, offset = 1 / 2.4, -12_345_678
    rng = np.random.default_rng(7)
    ready = np.sort(rng.choice(np.arange(10**9, 4 * 10**10, 8 * 10**7), 300, replace=False))  # 33 ms apart or more
    resumes = ready + rng.integers(200_000, 12_000_000, 300)
    chosen = np.sort(rng.choice(300, 40, replace=False))

    def true_ns(tsc: np.ndarray) -> np.ndarray:
        return (tsc * ns_per_tick * 1.00001 + offset).astype(np.int64)

    extra = rng.integers(0, 2_000_000, 40)
    at_start = rng.random(40) < 0.5
    windows = np.zeros(40, dtype=WINDOW)
    windows["start_ns"] = true_ns(ready[chosen]) - np.where(at_start, 0, extra)
    windows["end_ns"] = true_ns(resumes[chosen]) + np.where(at_start, extra, 0)
    found = align(ready, resumes, windows, ns_per_tick)
    assert found is not None and found.matched == 40
    assert abs(found.to_ns(int(ready[0])) - int(true_ns(ready[:1])[0])) < 1_000
    assert found.uncertainty_ns < 1_000
    assert align(ready, resumes, windows[:0], ns_per_tick) is None


def _traced_gap_run(shared: SharedResources, config: XenConfig, workdir: Path, competitor: bool,
                    layers: tuple[str, ...] = ("xen",), top: int = 100, timer: bool = False,
                    timer_options: dict[str, Any] | None = None, inside: list[str] | None = None,
                    follow: bool = False) -> tuple[Explanation, dict[int, str]]:
    """A gap probe in the measuring domU explained as a campaign does it (explain.session), with xentrace beside
    it and, with ``competitor``, a spinning RT domU on its pCPU (``timer``: the timer probe at 1 ms instead, or
    with ``timer_options``); ``inside``: a stressor's arguments, run inside the measuring domU beside the probe;
    ``follow``: the sources follow the samples as a campaign's do (their flight recorders keep what they need);
    returns the stored explanation and the domUs."""
    env = XenEnvironment(config, shared.supervisor, workdir, shared)
    session = session_for(env, ExplainConfig(threshold=THRESHOLD_US, layers=list(layers), top=top))
    stressor = None
    out = workdir / "samples.rtvs"
    try:
        env.start()
        session.start(out if follow else None)
        if competitor:
            stressor = env.stressor_guest(1, None)
            cpu = STRESSORS["cpu"]
            stressor.launch("rtvirt-stress", cpu.command(cpu.params(workers=1, duration=0), "")[1:], None)
            deadline = time.monotonic() + 900
            while not stressor.booted:
                assert stressor.check() is None and time.monotonic() < deadline
                time.sleep(0.5)
        probe = PROBES["timer" if timer else "gap"]
        options = (timer_options or {"interval": "1ms"}) if timer else {"threshold": "500us"}
        if inside is not None:
            env.add_guest_job("rtvirt-stress", inside)
        params = probe.params(**options, duration=f"{RUN_S}s", **env.probe_overrides())
        launched = env.launch("rtvirt-probe", probe.command(params, "")[1:], out)
        launched.follow(900, env.check)
    finally:
        session.stop()
        if stressor is not None:
            stressor.close()
        env.close()
    return _stored_explanation(session, workdir, out), dict(env._domids)


def _stored_explanation(session: Any, workdir: Path, out: Path) -> Explanation:
    """The run's samples explained and stored as a campaign does it, read back."""
    entry = session.explain_into(workdir, read_stream(out))
    assert "error" not in entry, entry
    explanation = read_explanation(workdir)
    assert explanation is not None
    return explanation


def _xen(explanation: Explanation) -> LayerTrace:
    (layer,) = [layer for layer in explanation.layers if layer.layer == "xen"]
    assert layer.seen, layer.why_not
    return layer


def _outliers_with(explanation: Explanation, kind: str, cause: str | None = None) -> float:
    """The share of the explained outliers that have a part of ``kind`` (and ``cause``)."""
    ranks = {part.rank for part in explanation.parts}
    having = {part.rank for part in explanation.parts if part.kind == kind and (cause is None or part.cause == cause)}
    return len(having) / len(ranks)


@pytest.fixture(scope="module")
def xen_lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    assert XenEnvironment.available() is None, XenEnvironment.available()
    shared = SharedResources()
    yield shared, tmp_path_factory.mktemp("xen-explain")
    shared.close()


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_a_competing_rt_domu_shows_as_runnable_while_it_ran(xen_lab: Any) -> None:
    shared, work = xen_lab
    # the measuring domU runs our bare-metal kernel (what is checked is Xen's own account of the pCPU), the
    # competitor a Linux domU with the cpu stressor
    config = XenConfig(kind="xen", name="explain-compete", guest="baremetal", scheduler="rtds", cpus=[1],
                       boot_timeout="900s", rtds={"period": "10ms", "budget": "10ms"},
                       stressor_rtds={"period": "10ms", "budget": "3ms"})
    explanation, names = _traced_gap_run(shared, config, work / "compete", competitor=True)
    layer = _xen(explanation)
    competitor = next(name for name in names.values() if "-stress" in name)
    cause = f"runnable: domU {competitor} ran"
    assert explanation.outliers >= 50, explanation.outliers  # the competitor takes ~3 ms of every 10 ms
    assert _outliers_with(explanation, "runstate", cause) >= 0.5, (explanation.summary[:4], layer.notes)
    xen_rows = [row for row in explanation.summary if row["layer"] == "xen"]
    # the largest Xen culprit: the competitor, its variant the measuring vCPU's runnable wait
    assert xen_rows[0]["culprit"] == f"domU {competitor}", xen_rows[:3]
    assert xen_rows[0]["variants"][0]["variant"] == "the measuring vCPU runnable", xen_rows[0]
    # Its budget is its whole period: Xen depletes it only after charging one slice past the budget (a budget
    # timer late under TCG; seen once in a 3 s run, a 10.5 ms slice, replenished 1.8 ms later), while the
    # competitor's budget runs out every period; its depletions are not the measuring vCPU's.
    with_budget = {part.rank for part in explanation.parts if part.kind == "budget"}
    assert len(with_budget) <= 0.1 * explanation.outliers, (len(with_budget), explanation.summary[:4])
    assert layer.alignment_ns < 1_000_000, layer.notes


@pytest.fixture(scope="module")
def bare_rtds_run(xen_lab: Any) -> tuple[Explanation, Path]:
    """Our bare-metal kernel's gap probe in an RTDS domU whose budget (4 ms of 10 ms) is shorter than its work,
    every gap explained by the Xen and guest layers: (the stored explanation, the run's directory). Two tests
    read it (the Xen layer's budget exhaustions, the guest's stolen time)."""
    shared, work = xen_lab
    config = XenConfig(kind="xen", name="explain-bare", guest="baremetal", scheduler="rtds", cpus=[1],
                       boot_timeout="900s", rtds={"period": f"{PERIOD_US}us", "budget": f"{BUDGET_US}us"})
    # every gap explained: under host load the largest ones are the outer host's, which Xen cannot see either
    explanation, _ = _traced_gap_run(shared, config, work / "bare", competitor=False, layers=("xen", "guest"),
                                     top=1000)
    return explanation, work / "bare"


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_an_rtds_budget_shorter_than_the_work_shows_as_exhaustion_until_replenishment(
        xen_lab: Any, bare_rtds_run: tuple[Explanation, Path]) -> None:
    shared, _ = xen_lab
    explanation, _ = bare_rtds_run
    layer = _xen(explanation)
    assert explanation.outliers >= 100, explanation.outliers
    assert _outliers_with(explanation, "budget") >= 0.5, (explanation.summary[:4], layer.notes)
    budgets = [json.loads(part.detail) for part in explanation.parts if part.kind == "budget"]
    waits = [detail["replenished_ns"] - detail["exhausted_ns"] for detail in budgets]
    # the budget ran out after 4 ms of a 10 ms period: replenished about 6 ms later (TCG: +-30 %)
    assert 0.7 * (PERIOD_US - BUDGET_US) * 1000 <= float(np.median(waits)) <= 1.3 * (PERIOD_US - BUDGET_US) * 1000
    assert all(detail["budget_ns"] == BUDGET_US * 1000 for detail in budgets)
    # nothing of ours is left in dom0: no tracer, no trace file
    dom0 = next(obj for obj in shared._objects.values() if hasattr(obj, "lab"))
    assert "xentrace" not in dom0.run(["ps"]).stdout
    assert reclaim_xentrace(dom0.transport) == []


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_resume_stops_a_tracer_its_killed_campaign_left_in_dom0(xen_lab: Any) -> None:
    """A campaign killed with -9 in a Xen host's dom0 leaves xentrace running: reclaim (``--resume``) stops it,
    which switches Xen's tracing off, and removes its files."""
    shared, work = xen_lab
    env = XenEnvironment(XenConfig(kind="xen", name="explain-left"), shared.supervisor, work / "left", shared)
    (source,) = env.trace_sources(ExplainConfig(layers=["xen"]))  # the Xen layer only: xentrace in dom0
    source.start()  # and never stopped: what a killed rtvirt leaves
    dom0 = env._dom0
    assert dom0 is not None
    assert "xentrace" in dom0.run(["ps"]).stdout
    removed = dom0.reclaim()
    assert any(line.startswith("xentrace in dom0") for line in removed), removed
    assert "xentrace" not in dom0.run(["ps"]).stdout
    assert dom0.run(["sh", "-c", "ls /run/rtvirt | grep -c xentrace; exit 0"]).stdout.strip() == "0"
    source.stop()  # the source's own stop after a reclaim: nothing left to do, and no error


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_the_bare_metal_guest_reads_the_time_xen_stole_from_each_sample(
        bare_rtds_run: tuple[Explanation, Path]) -> None:
    """Our bare-metal kernel as the RTDS domU (budget 4 ms of 10 ms): its gap probe reads the vCPU's runstate area
    around every gap, and the stolen time it reports per sample is non-zero where the budget ran out, never more
    than the gap, and the runnable time xentrace saw in the same windows within twice the Xen layer's stated
    alignment (a length has two edges, each placed within it)."""
    explanation, run = bare_rtds_run
    stream = read_stream(run / "samples.rtvs")
    assert stream.header["stolen"] == "xen-runstate" and stream.end_reason == "complete"
    runnable, offline = stream.stolen_per_sample()
    gaps = stream.records["value"].astype(np.int64)
    stolen = runnable + offline
    # never more than its gap; gaps without any are the outer host's (nested TCG: time Xen cannot see either)
    assert (stolen <= gaps).all() and (stolen > 0).any(), (stolen[:20], gaps[:20])
    xen = _xen(explanation)
    guest = next(layer for layer in explanation.layers if layer.layer == "guest")
    assert guest.seen and any("lost time to Xen" in note for note in guest.notes), guest.notes
    starts = stream.records["t_ns"].astype(np.int64)
    # windows where xentrace saw the budget run out for longer than its alignment's uncertainty
    budget_ns: dict[int, int] = {}
    for part in explanation.parts:
        if part.kind == "budget":
            budget_ns[part.rank] = budget_ns.get(part.rank, 0) + part.duration_ns
    budget_ranks = {rank for rank, total in budget_ns.items() if total > xen.alignment_ns}
    assert len(budget_ranks) >= 10, explanation.summary[:4]
    compared = []
    for rank in sorted(budget_ranks):
        part = next(part for part in explanation.parts if part.rank == rank)
        start, end = part.sample_t_ns, part.sample_t_ns + part.latency_ns
        sample = int(np.flatnonzero(starts == start)[0])
        # the guest saw the budget run out too (its neighbours show where a misplaced wait went)
        near = slice(max(sample - 2, 0), sample + 3)
        assert stolen[sample] > 0, (rank, part.latency_ns, budget_ns[rank], starts[near] - start, gaps[near],
                                    stolen[near])
        seen_by_xentrace = sum(max(0, min(o.end_ns, end) - max(o.start_ns, start)) for o in xen.occupancies
                               if o.detail.get("runstate") == "runnable")
        compared.append(abs(int(runnable[sample]) - seen_by_xentrace))
    # the alignment bounds how far the guest's and xentrace's view of one edge differ (its largest residual): a
    # length differs by up to twice that (held to once the alignment, 55-100 % of the windows were within in five
    # lab runs, and a suite failed at 74 %; twice: 85-100 % in four)
    within = float(np.mean(np.array(compared) <= 2 * xen.alignment_ns))
    print(f"stolen vs xentrace over {len(compared)} budget windows: |difference| median {np.median(compared):.0f} ns, "
          f"max {max(compared)} ns, alignment {xen.alignment_ns} ns, within {within:.0%}; notes {xen.notes}")
    assert within >= 0.8, (sorted(compared), xen.alignment_ns, xen.notes)


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_the_bare_metal_timer_probe_splits_its_windows_into_stolen_time_and_its_own(xen_lab: Any) -> None:
    """The timer probe (1 ms) in the bare-metal RTDS domU with 1 ms of every 10 ms: samples whose window Xen held
    carry their stolen time, never more than their latency, and the guest layer names it beside its IRQ split."""
    shared, work = xen_lab
    config = XenConfig(kind="xen", name="explain-bare-timer", guest="baremetal", scheduler="rtds", cpus=[1],
                       boot_timeout="900s", rtds={"period": "10ms", "budget": "1ms"})
    explanation, _ = _traced_gap_run(shared, config, work / "bare-timer", competitor=False, layers=("xen", "guest"),
                                     top=1000, timer=True)
    stream = read_stream(work / "bare-timer" / "samples.rtvs")
    assert stream.header["stolen"] == "xen-runstate" and stream.end_reason == "complete"
    runnable, offline = stream.stolen_per_sample()
    latency = stream.records["value"].astype(np.int64)
    assert ((runnable + offline) <= latency).all() and (runnable > 0).any()
    guest = next(layer for layer in explanation.layers if layer.layer == "guest")
    assert guest.seen and guest.notes[0].startswith("split over"), guest.notes
    kinds = {part.kind for part in explanation.parts if part.layer == "guest"}
    assert "stolen" in kinds and "guest-thread" in kinds, kinds
    print(f"timer: {latency.size} samples, {int((runnable > 0).sum())} with stolen time (median "
          f"{np.median(runnable[runnable > 0]) / 1e3:.0f} us); {explanation.outliers} outliers; "
          f"{[(row['layer'], row['cause'][:50], row['share']) for row in explanation.summary[:5]]}; {guest.notes}")


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_a_stressor_inside_a_linux_domu_is_named_by_the_domus_own_trace(xen_lab: Any) -> None:
    """A Linux domU traces its measuring vCPU itself and relays the trace to dom0's listener while the run goes
    (once its vif is up), where the guest's flight recorder keeps what it needs: an RT cpu stressor inside it,
    above the timer probe's priority, is named as a guest-side cause (comm, the pid the guest gave it, its
    priority); Xen's layer stays beside it, and nothing of ours is left in dom0."""
    shared, work = xen_lab
    config = XenConfig(kind="xen", name="explain-guest", cpus=[1], boot_timeout="900s")
    cpu = STRESSORS["cpu"]
    inside = cpu.command(cpu.params(workers=1, duration=0, priority=50, slice="3ms", period="20ms"), "")[1:]
    explanation, _ = _traced_gap_run(shared, config, work / "guest", competitor=False, layers=("xen", "guest"),
                                     timer=True, timer_options={"interval": "2ms", "priority": 10}, inside=inside,
                                     follow=True)
    trace = read_guest_trace(work / "guest" / "guest-trace.txt")
    assert trace.began and trace.complete, trace.lines[-3:]
    guest = next(layer for layer in explanation.layers if layer.layer == "guest")
    assert guest.seen, guest.why_not
    assert explanation.outliers > 0
    worker, held = guest_stressor_cause(explanation)
    assert held >= 10, (held, explanation.summary[:5])
    assert any(note.startswith("the flight recorder held at most") for note in guest.notes), guest.notes
    # nothing of ours is left in dom0: no listener, no domain directory
    dom0 = next(obj for obj in shared._objects.values() if hasattr(obj, "lab"))
    assert "nc -l" not in dom0.run(["ps"]).stdout
    assert ":77" not in dom0.run(["busybox", "netstat", "-ltn"]).stdout
    assert dom0.run(["sh", "-c", "ls /run/rtvirt | grep -c explain-guest; exit 0"]).stdout.strip() == "0"
    print(f"linux domU: {explanation.outliers} outliers, {worker} in {held}; guest trace "
          f"{len(trace.lines)} lines, dropped {trace.dropped}; "
          f"{[(row['layer'], row['cause'][:50], row['share']) for row in explanation.summary[:5]]}; {guest.notes}")


def test_dom0_listeners_nobody_connected_to_are_ended_and_their_pid_files_removed(tmp_path: Path) -> None:
    """A listener (the stream copy's, the guest trace's) that no domU connected to does not end with its SSH
    channel: the run ends it by the pid it noted, and only while that pid is still a busybox."""
    import subprocess

    from rtvirt.environments.xen.console import LISTENER, LISTENERS_END

    port = free_port()
    listener = subprocess.Popen(["sh", "-c", LISTENER, "rtvirt-listen", str(tmp_path), str(port)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        pid_file = tmp_path / f"listener-{port}.pid"
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(pid_file.read_text()) == listener.pid  # exec: the noted pid is the listener itself
        (tmp_path / "listener-1.pid").write_text(f"{__import__('os').getpid()}\n")  # a pid that is not a busybox
        subprocess.run(["sh", "-c", LISTENERS_END, "rtvirt-listen-end", str(tmp_path), str(port), "1"],
                       check=True, timeout=10)
        assert listener.wait(timeout=10) != 0  # killed, not ended by itself
        assert list(tmp_path.glob("listener-*.pid")) == []
    finally:
        listener.kill()
        listener.wait()


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_the_flight_recorder_keeps_the_segments_of_a_long_runs_largest_samples(xen_lab: Any) -> None:
    """A 24 s gap probe in the bare-metal RTDS domU whose budget is its whole period except from 8 s to 13 s of
    the run (20-140 ms of 400 ms, changed about every period: a dozen gaps of 260-380 ms), traced in 4 s
    xentrace segments with a bound that holds three or four of the largest: the segments of the budget's middle
    stretch are kept, the run's largest gaps are explained by budget exhaustion, and the dropped segments are
    named. (The samples are placed on this host's clock by when they arrive, late by up to seconds through the
    bare-metal guest's console relay: with two segments kept, the kept pair was once a segment past the stretch
    and held four of its gaps. With one budget, all gaps alike, offsets a period apart explained all but one or
    two windows alike and the alignment was refused or left in doubt. xentrace's own circular buffer would keep
    the run's end, where the budget is whole again.) The budget's gaps must stand out of the nested lab's own stalls,
    which the outer hypervisor's load makes: 20-58 ms at load 5, up to 190 ms at load 10 (with 4 ms of 10 ms,
    6 ms gaps, the run's largest samples were those stalls and the budget explained 2-38 % of its top 100)."""
    shared, work = xen_lab
    workdir = work / "recorder"
    config = XenConfig(kind="xen", name="explain-recorder", guest="baremetal", scheduler="rtds", cpus=[1],
                       boot_timeout="900s", rtds={"period": "10ms", "budget": "10ms"})
    env = XenEnvironment(config, shared.supervisor, workdir, shared)
    session = session_for(env, ExplainConfig(threshold=THRESHOLD_US, layers=["xen"], top=10))
    (source,) = session.sources
    # 4 s segments under a bound that holds three or four of the largest seen so far: set from this run's own
    # segments (190-390 KiB on a quiet host, smaller on a loaded one, where a fixed 900 KiB once held them all)
    source.segment_s, source.bound_kb = 4, 1 << 20
    out = workdir / "samples.rtvs"
    budget_changes: list[threading.Timer] = []
    watching = threading.Event()

    def bound_to_the_largest_segments() -> None:
        while not watching.wait(0.2):
            sizes = [segment.size for segment in list(source.recorder.kept)] + \
                [segment.size for segment, _ in list(source.recorder.dropped)]
            if sizes:
                source.recorder.bound_bytes = int(3.5 * max(sizes))

    watcher = threading.Thread(target=bound_to_the_largest_segments, daemon=True)
    try:
        env.start()
        session.start(out)
        assert source.recorder is not None, source.collect
        watcher.start()
        probe = PROBES["gap"]
        params = probe.params(threshold="500us", duration="24s", **env.probe_overrides())
        launched = env.launch("rtvirt-probe", probe.command(params, "")[1:], out)
        assert env._dom0 is not None
        dom0, domid = env._dom0, str(env._measuring_domid)
        budgets_ms = (40, 90, 20, 120, 60, 30, 100, 50, 140, 70, 25, 110, 80)
        changes = [*((8 + 0.4 * step, "400000", str(budget_ms * 1000)) for step, budget_ms in enumerate(budgets_ms)),
                   (13, "10000", "10000")]
        for at_s, period, budget in changes:
            change = threading.Timer(at_s, dom0.xl, ("sched-rtds", "-d", domid, "-v", "all", "-p", period,
                                                     "-b", budget, "-e", "0"))
            change.start()
            budget_changes.append(change)
        launched.follow(900, env.check)
    finally:
        for change in budget_changes:
            change.cancel()
        watching.set()
        session.stop()
        env.close()
    explanation = _stored_explanation(session, workdir, out)
    recorder = source.recorder
    kept = [(segment.index, segment.size) for segment in recorder.kept]
    dropped = [(segment.index, segment.size) for segment, _ in recorder.dropped]
    layer = next(layer for layer in explanation.layers if layer.layer == "xen")
    print(f"recorder: kept segments {kept}, dropped {dropped}; {layer.why_not}; notes {layer.notes}; "
          f"{[(row['layer'], row['cause'][:50], row['share']) for row in explanation.summary[:4]]}")
    assert layer.seen, layer.why_not
    assert dropped and len(kept) >= 2, (kept, dropped)  # the bound mattered
    assert any("dropped" in note and "segments" in note for note in layer.notes), layer.notes
    # the holes between segments (0.1-0.4 s here) leave a few windows outside the kept trace, named
    outside = [int(note.split()[0]) for note in layer.notes if "outside the kept trace" in note]
    assert sum(outside) < 0.3 * explanation.outliers and _outliers_with(explanation, "budget") >= 0.6, \
        (outside, explanation.summary[:4], layer.notes)
    assert "xentrace" not in dom0.run(["ps"]).stdout
    assert reclaim_xentrace(dom0.transport) == []
