"""What watching a campaign live costs the measurement: the timer probe in a campaign with the live view open
(`rtvirt serve` on the results, a headless Chromium page following it, a real Prometheus scraping /metrics every
second) against the same campaign with neither, in alternating rounds of one run each. By default the three
run on the CPUs the probe does not measure on, as `rtvirt run --serve` places its server and as a real-time
setup keeps the measured CPU for the measurement (--no-pin: wherever the scheduler puts them).

"Live" is what a lab does during a long campaign: the server follows the running run's stream and the state
file (reading only what the recorder already wrote, once a second), pushes the page's document to Chromium
(Server-Sent Events, redrawn there), and answers Prometheus' scrapes; the server, Chromium and Prometheus start
before the round's campaign and stop after it, so the measured window sees them only as they run. "Neither":
nothing beside the campaign. Rounds alternate (neither, live, neither, ...) so the shared machine's slow drifts
hit both alike. Prints mean and p99 of each, the ratios live/neither (goal: within noise, at most 1.05) with a
95 % interval from resampling the pairs (bench_explain_cost's), the server's CPU time, and the load average.

`--control` adds a third round to each pair: instead of the watchers, a plain busy loop on their CPUs taking as
much CPU time as they took in the pair's live round, in bursts once a second as they run. It tells apart what the
live view's own work costs from what any work of that size on the other CPUs costs the probe on this machine.

    .venv/bin/python benchmarks/bench_live_cost.py [--pairs 5] [--duration 10s] [--control]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_explain_cost import pooled_statistic, ratio_interval, verdict  # noqa: E402
from live_page import LivePage, start_serve, stop  # noqa: E402

RTVIRT = Path(sys.executable).with_name("rtvirt")
GOAL = 1.05
SCENARIO = """name = "live-cost"
duration = "{duration}"
repetitions = 1
run_timeout = "2m"

[workload]
probe = "timer"
params = {{ interval = "1ms", threads = 1, priority = 99 }}

[[environments]]
kind = "host"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def started_on(cpus: set[int]) -> Iterator[None]:
    """Processes started in the block run on ``cpus`` (they inherit this process's affinity, as their own children
    do); this process gets its own back after it."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus or mine)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


@contextlib.contextmanager
def watched(results: Path, work: Path, cpus: set[int]) -> Iterator[tuple[LivePage, subprocess.Popen[str], int, int]]:
    """`rtvirt serve` on ``results``, a Chromium page on it and Prometheus scraping it every second, on ``cpus``."""
    with started_on(cpus):
        server, url, prometheus, page = _start_watchers(results, work)
    try:
        page.wait_for("document.getElementById('status').textContent.includes('campaign(s)')")
        yield page, server, page.proc.pid, prometheus.pid
    finally:
        page.close()
        prometheus.terminate()
        prometheus.wait(timeout=30)
        stop(server)


def _start_watchers(results: Path, work: Path) -> tuple[subprocess.Popen[str], str, subprocess.Popen[bytes],
                                                        LivePage]:
    server, url = start_serve(str(results))
    port = _free_port()
    config = work / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: rtvirt\n"
                      f"    static_configs:\n      - targets: ['{url.removeprefix('http://').rstrip('/')}']\n")
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    prometheus = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                                   f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--log.level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return server, url, prometheus, LivePage(url)


def _cpu_seconds(*roots: int) -> float:
    """CPU time (user + system) of the processes ``roots`` and their live descendants, and of their waited-for
    children (Chromium's renderer, GPU and utility processes are its children)."""
    parents, used = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    total, wanted = 0, set(roots)
    for pid in sorted(parents):  # children have larger pids than their parents here (no pid wrap in a run)
        if pid in wanted or parents[pid] in wanted:
            wanted.add(pid)
            total += used[pid]
    return total / os.sysconf("SC_CLK_TCK")


def one_round(scenario: Path, results: Path, work: Path, live: bool,
              cpus: set[int]) -> tuple[np.ndarray, tuple[float, ...]]:
    """One campaign of one run; its samples' values and the CPU seconds the server, Chromium and Prometheus
    used during it (none when not live)."""
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    argv = [str(RTVIRT), "run", str(scenario), "--out", str(results), "--no-progress", "--no-report"]
    used: tuple[float, ...] = ()
    if live:
        with watched(results, work, cpus) as (page, server, chromium, prometheus):
            watchers = (server.pid, chromium, prometheus)
            before = [_cpu_seconds(pid) for pid in watchers]
            subprocess.run(argv, check=True, capture_output=True)
            page.wait_for("(e => e && e.textContent.includes('1 of 1 runs done'))"
                          "(document.querySelector('[data-live=progress]'))", timeout=30)
            used = tuple(_cpu_seconds(pid) - b for pid, b in zip(watchers, before, strict=True))
    else:
        subprocess.run(argv, check=True, capture_output=True)
    (run,) = results.glob("runs/*/samples.parquet")
    manifest = json.loads((run.parent / "manifest.json").read_text())
    if manifest["status"] != "complete" or manifest["dropped"]:
        sys.exit(f"the run did not complete whole: {manifest['status']}, {manifest['dropped']} dropped")
    return pq.read_table(run, columns=["latency_ns"])["latency_ns"].to_numpy().astype(np.int64), used


BURNER = """import sys, time
busy = float(sys.argv[1])  # seconds of CPU per second
while True:
    start = time.monotonic()
    while time.monotonic() - start < busy:
        pass
    time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
"""


def burned_round(scenario: Path, results: Path, work: Path, busy_per_s: float, cpus: set[int]) -> np.ndarray:
    """One campaign of one run beside a busy loop on ``cpus`` taking ``busy_per_s`` CPU seconds each second."""
    with started_on(cpus):
        burner = subprocess.Popen([sys.executable, "-c", BURNER, f"{busy_per_s:.4f}"])
    try:
        return one_round(scenario, results, work, False, cpus)[0]
    finally:
        burner.kill()
        burner.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="alternating neither/live pairs")
    parser.add_argument("--duration", default="10s", help="length of each run")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="the server, Chromium and Prometheus on the CPUs the probe does not measure on (as "
                             "`rtvirt run --serve` places its server; --no-pin: wherever the scheduler puts them)")
    parser.add_argument("--control", action="store_true",
                        help="a third round per pair: a busy loop taking the live round's CPU time on its CPUs")
    args = parser.parse_args()
    measured = max(os.sched_getaffinity(0))  # the host environment's default measured CPU
    cpus = set(os.sched_getaffinity(0)) - {measured} if args.pin else set(os.sched_getaffinity(0))
    neither, watched_runs, cpu, burned = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-live-") as tmp:
        work = Path(tmp)
        scenario = work / "live-cost.toml"
        scenario.write_text(SCENARIO.format(duration=args.duration))
        for pair in range(args.pairs):
            neither.append(one_round(scenario, work / "results", work, False, cpus)[0])
            values, used = one_round(scenario, work / "results", work, True, cpus)
            watched_runs.append(values)
            cpu.append(used)
            if args.control:  # as much CPU a second as the watchers took over the run (its samples: 1 ms apart)
                busy = min(0.9, sum(used) / max(1.0, values.size / 1000))
                burned.append(burned_round(scenario, work / "results", work, busy, cpus))
            print(f"pair {pair + 1}: neither mean {neither[-1].mean():8.0f} ns p99 "
                  f"{np.percentile(neither[-1], 99):8.0f} ns | live mean {values.mean():8.0f} ns p99 "
                  f"{np.percentile(values, 99):8.0f} ns | CPU s: server {used[0]:.2f}, Chromium {used[1]:.2f}, "
                  f"Prometheus {used[2]:.2f}" + (f" | busy loop mean {burned[-1].mean():8.0f} ns p99 "
                                                  f"{np.percentile(burned[-1], 99):8.0f} ns" if burned else ""),
                  flush=True)
    live, plain = np.concatenate(watched_runs), np.concatenate(neither)
    print(f"\ntimer probe -i 1ms -p 99 on CPU {measured}, the watchers on CPU(s) {sorted(cpus)}; {args.duration} runs "
          f"x {args.pairs} alternating pairs; load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'':8} {'samples':>9} {'mean ns':>10} {'p99 ns':>10} {'max ns':>10} {'median ns':>10}")
    rows = [("neither", plain), ("live", live)] + ([("busy", np.concatenate(burned))] if burned else [])
    for name, values in rows:
        print(f"{name:8} {values.size:9d} {values.mean():10.0f} {np.percentile(values, 99):10.0f} "
              f"{values.max():10d} {np.median(values):10.0f}")
    for index, name in enumerate(("rtvirt serve", "Chromium", "Prometheus")):
        print(f"CPU of {name} per round ({args.duration} measured): median {np.median([c[index] for c in cpu]):.2f} s")
    rng = np.random.default_rng(0)
    for name in ("mean", "p99", "median"):
        ratio = pooled_statistic(live, name) / pooled_statistic(plain, name)
        low, high = ratio_interval(watched_runs, neither, name, rng)
        goal = f"goal <= {GOAL:.2f}: {verdict(low, high, GOAL)}" if name != "median" else \
            "no goal: the typical wake-up"
        print(f"ratio live/neither {name}: {ratio:.3f} (95 % interval {low:.3f}-{high:.3f}; {goal})")
        if burned:
            ratio = pooled_statistic(np.concatenate(burned), name) / pooled_statistic(plain, name)
            low, high = ratio_interval(burned, neither, name, rng)
            print(f"ratio busy/neither {name}: {ratio:.3f} (95 % interval {low:.3f}-{high:.3f}; the control)")


if __name__ == "__main__":
    main()
