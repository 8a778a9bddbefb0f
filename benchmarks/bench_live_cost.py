"""What watching a campaign live costs the measurement: the timer probe in a campaign with the live view open
(`rtvirt serve` on the results, a headless Chromium page following it, a real Prometheus scraping /metrics every
second) against the same campaign with neither, in alternating rounds of one run each.

"Live" is what a lab does during a long campaign: the server follows the running run's stream and the state
file (reading only what the recorder already wrote, once a second), pushes the page's document to Chromium
(Server-Sent Events, redrawn there), and answers Prometheus' scrapes; the server, Chromium and Prometheus start
before the round's campaign and stop after it, so the measured window sees them only as they run. "Neither":
nothing beside the campaign. Rounds alternate (neither, live, neither, ...) so the shared machine's slow drifts
hit both alike. Prints mean and p99 of each, the ratios live/neither (goal: within noise, at most 1.05) with a
95 % interval from resampling the pairs (bench_explain_cost's), the server's CPU time, and the load average.

    .venv/bin/python benchmarks/bench_live_cost.py [--pairs 5] [--duration 10s]
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
def watched(results: Path, work: Path) -> Iterator[tuple[LivePage, subprocess.Popen[str]]]:
    """`rtvirt serve` on ``results``, a Chromium page on it and Prometheus scraping it every second."""
    server, url = start_serve(str(results))
    port = _free_port()
    config = work / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: rtvirt\n"
                      f"    static_configs:\n      - targets: ['{url.removeprefix('http://').rstrip('/')}']\n")
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    prometheus = subprocess.Popen([shutil.which("prometheus") or "prometheus", f"--config.file={config}",
                                   f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--log.level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    page = LivePage(url)
    try:
        page.wait_for("document.getElementById('status').textContent.includes('campaign(s)')")
        yield page, server
    finally:
        page.close()
        prometheus.terminate()
        prometheus.wait(timeout=30)
        stop(server)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(scenario: Path, results: Path, work: Path, live: bool) -> tuple[np.ndarray, float]:
    """One campaign of one run; its samples' values and the server's CPU seconds during it (0 when not live)."""
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    argv = [str(RTVIRT), "run", str(scenario), "--out", str(results), "--no-progress", "--no-report"]
    used = 0.0
    if live:
        with watched(results, work) as (page, server):
            before = _cpu_seconds(server.pid)
            subprocess.run(argv, check=True, capture_output=True)
            page.wait_for("(e => e && e.textContent.includes('1 of 1 runs done'))"
                          "(document.querySelector('[data-live=progress]'))", timeout=30)
            used = _cpu_seconds(server.pid) - before
    else:
        subprocess.run(argv, check=True, capture_output=True)
    (run,) = results.glob("runs/*/samples.parquet")
    manifest = json.loads((run.parent / "manifest.json").read_text())
    if manifest["status"] != "complete" or manifest["dropped"]:
        sys.exit(f"the run did not complete whole: {manifest['status']}, {manifest['dropped']} dropped")
    return pq.read_table(run, columns=["latency_ns"])["latency_ns"].to_numpy().astype(np.int64), used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="alternating neither/live pairs")
    parser.add_argument("--duration", default="10s", help="length of each run")
    args = parser.parse_args()
    neither, watched_runs, cpu = [], [], []
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-live-") as tmp:
        work = Path(tmp)
        scenario = work / "live-cost.toml"
        scenario.write_text(SCENARIO.format(duration=args.duration))
        for pair in range(args.pairs):
            neither.append(one_round(scenario, work / "results", work, live=False)[0])
            values, used = one_round(scenario, work / "results", work, live=True)
            watched_runs.append(values)
            cpu.append(used)
            print(f"pair {pair + 1}: neither mean {neither[-1].mean():8.0f} ns p99 "
                  f"{np.percentile(neither[-1], 99):8.0f} ns | live mean {values.mean():8.0f} ns p99 "
                  f"{np.percentile(values, 99):8.0f} ns | server CPU {used:.2f} s", flush=True)
    live, plain = np.concatenate(watched_runs), np.concatenate(neither)
    print(f"\ntimer probe -i 1ms -p 99 on the host's last CPU, {args.duration} runs x {args.pairs} alternating pairs; "
          f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'':8} {'samples':>9} {'mean ns':>10} {'p99 ns':>10} {'max ns':>10} {'median ns':>10}")
    for name, values in (("neither", plain), ("live", live)):
        print(f"{name:8} {values.size:9d} {values.mean():10.0f} {np.percentile(values, 99):10.0f} "
              f"{values.max():10d} {np.median(values):10.0f}")
    print(f"server CPU per {args.duration} run: median {np.median(cpu):.2f} s (following the stream, the page's "
          "document once a second, the scrapes)")
    rng = np.random.default_rng(0)
    for name in ("mean", "p99", "median"):
        ratio = pooled_statistic(live, name) / pooled_statistic(plain, name)
        low, high = ratio_interval(watched_runs, neither, name, rng)
        goal = f"goal <= {GOAL:.2f}: {verdict(low, high, GOAL)}" if name != "median" else \
            "no goal: the typical wake-up"
        print(f"ratio live/neither {name}: {ratio:.3f} (95 % interval {low:.3f}-{high:.3f}; {goal})")


if __name__ == "__main__":
    main()
