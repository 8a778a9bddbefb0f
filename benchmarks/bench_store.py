"""A shared results store at lab scale: 100,000 runs (10^11 samples) in one PostgreSQL catalog.

Starts a PostgreSQL server from a temporary directory (as tests/pg_server.py does), fills the catalog with
``--runs`` synthetic runs (500 configurations x 20 machines, each run claiming 10^6 samples; rows written with
COPY, the way a year of deliveries would leave them), and two real runs of one configuration with their files
(1 M samples each) on the shared directory. Then times, each as a new process as users run them:

  deliver    `rtvirt import` of one 1 M-sample file into the store (write the run into the spool, copy it to the
             shared directory, insert its row)
  trend      `rtvirt trend CONFIG --results URL --json`: one configuration's history across machines
  compare    `rtvirt compare RUN --results URL --json`: the last run of its configuration on its machine, and
             the tail test on both exact histograms
  sql        `rtvirt sql` over the whole store (every run listed: the DuckDB catalog is built from all rows)
  sql+manifest  the same with the runs' manifests (JSON text) in the catalog: here ~300 bytes a run; real ones,
             with the system audit, 10-50 kB
  reference  psql running trend's query itself (the least any tool must do to answer it)

and prints each time, trend's ratio to the reference, and where the time goes (the store's queries in a warm
process, and the imports trend needs). Then the live view over the same store: the runs grouped into 5,000
published campaigns (20 runs each, as `rtvirt run` publishes them; 5 still running), `rtvirt serve URL` started,
and its answers timed once warm (the first request of each kind is left out), as a page asks them over HTTP:

  page: campaign list   GET /api/state: every machine's latest campaigns with their runs' statistics, verdicts
                        and explanations (the server's document, rebuilt once a second; the query behind it,
                        run again when a campaign publishes, is timed in a warm process too)
  page: trend           GET /api/trend?config=cfg-7: one configuration's history across machines

    .venv/bin/python benchmarks/bench_store.py [--runs 100000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from pg_server import PgServer, _bin  # noqa: E402

RTVIRT = Path(sys.executable).with_name("rtvirt")
CONFIGS, MACHINES = 500, 20
RUNS_PER_CAMPAIGN = 20
CAMPAIGN_SCENARIO = f"""name = "bench"
duration = "1h"
repetitions = {RUNS_PER_CAMPAIGN}
[[environments]]
kind = "host"
"""


def fill(url: str, env: dict[str, str], runs: int) -> None:
    import psycopg

    from rtvirt.stores.postgres import TABLE, SharedStore
    from rtvirt.stores.provenance import COLUMNS, run_row

    store = SharedStore(url)
    store.check()  # creates the table
    store.close()
    conninfo = url.split("?")[0]
    names = [*COLUMNS, "files", "manifest_sha256", "manifest"]
    with psycopg.connect(conninfo, password=env["PGPASSWORD"]) as connection, connection.cursor() as cursor:
        with cursor.copy(f"COPY {TABLE} ({', '.join(names)}) FROM STDIN") as copy:
            rng = np.random.default_rng(3)
            for i in range(runs):
                config, machine = f"cfg-{i % CONFIGS}", f"board-{(i // CONFIGS) % MACHINES}"
                kernel = "6.6.30-rt30" if i < runs // 2 else "6.12.1-rt5"
                created = f"2026-{1 + i * 12 // runs:02d}-01T00:00:00.{i:06d}+00:00"
                top = float(20_000 + rng.integers(0, 30_000))
                manifest = {"run_id": f"r{i:07d}", "name": config, "config": config, "created": created,
                            "source": "measured", "status": "complete", "probe": "timer",
                            "value_field": "latency_ns", "system": {"hostname": machine, "kernel": kernel},
                            "summary": {"all": {"samples": 1_000_000, "max_ns": top, "p9999_ns": top * 0.8}}}
                row = run_row(manifest)  # the columns as a delivery computes them (unit, identity, ...)
                copy.write_row([row.get(n) for n in COLUMNS] + [f"runs/r{i:07d}", "x", json.dumps(manifest)])
        connection.commit()
        cursor.execute("ANALYZE " + TABLE)


def publish_campaigns(url: str, runs: int) -> None:
    """The runs grouped into campaigns of RUNS_PER_CAMPAIGN, published as `rtvirt run` publishes them (each
    machine's campaigns in order; the last 5 still running)."""
    from rtvirt.live.progress import campaign_record
    from rtvirt.stores.postgres import SharedStore

    store = SharedStore(url)
    campaigns = runs // RUNS_PER_CAMPAIGN
    for c in range(campaigns):
        first = c * RUNS_PER_CAMPAIGN
        machine = f"board-{(first // CONFIGS) % MACHINES}"
        running = c >= campaigns - 5
        state = {"campaign_id": f"bench-{c:05d}", "scenario": "bench", "scenario_text": CAMPAIGN_SCENARIO,
                 "source": "bench.toml", "scale": 1.0, "finished": not running,
                 "updated": f"2026-{1 + first * 12 // runs:02d}-01T00:00:00.{c:06d}+00:00",
                 "runs": {f"host/solo/-/r{k + 1}": {"status": "running" if running and k == 10 else "complete",
                                                    "run_id": f"r{first + k:07d}"}
                          for k in range(RUNS_PER_CAMPAIGN) if not running or k <= 10}}
        store.publish_campaign(campaign_record(state, machine))
    store.close()


def campaign_list_query(url: str) -> float:
    """The page's campaign list as the server asks it when campaigns changed (the full query), warm."""
    from rtvirt.live.shared import StoreSource
    from rtvirt.results.verdicts import load_classes
    from rtvirt.stores.postgres import SharedStore

    source = StoreSource(SharedStore(url, read_only=True), "bench", 100_000, load_classes())
    source.published_campaigns()
    start = time.perf_counter()
    source.published_campaigns()
    took = time.perf_counter() - start
    source.close()
    return took


def serve_figures(url: str, env: dict[str, str], repeat: int = 5) -> dict[str, float]:
    """`rtvirt serve URL` answering the page's questions, timed warm (the first of each left out)."""
    import re
    import statistics
    import urllib.request

    proc = subprocess.Popen([str(RTVIRT), "serve", url, "--listen", "127.0.0.1:0"], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    start = time.perf_counter()
    line = proc.stderr.readline()
    found = re.search(r"serving (http://\S+/) ", line)
    if not found:
        proc.kill()
        sys.exit(f"rtvirt serve did not start: {line}{proc.stderr.read()[-2000:]}")
    figures = {"serve: start to first page": time.perf_counter() - start}
    page = found.group(1)
    try:
        for name, path in (("page: campaign list", "api/state"), ("page: trend cfg-7", "api/trend?config=cfg-7")):
            times = []
            for _ in range(repeat + 1):
                start = time.perf_counter()
                with urllib.request.urlopen(page + path, timeout=60) as answer:
                    body = answer.read()
                times.append(time.perf_counter() - start)
            figures[f"{name} (median of {repeat})"] = statistics.median(times[1:])
            figures[f"{name} (worst)"] = max(times[1:])
            if path == "api/state":
                document = json.loads(body)
                figures["page: campaign list built in"] = float(document["built_s"])
                shown = sum(len(m["campaigns"]) for m in document["machines"])
                print(f"campaign list: {shown} campaigns of {len(document['machines'])} machines, "
                      f"{len(body) / 1e3:.0f} kB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return figures


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 3):
        sys.exit(f"{' '.join(argv[:3])} failed: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-store-") as tmp, PgServer() as pg:
        work = Path(tmp)
        url = pg.url(data=work / "shared", spool=str(work / "spool"))
        env = pg.env()
        os.environ["PGPASSWORD"] = env["PGPASSWORD"]  # this process fills the catalog as a user would connect
        start = time.perf_counter()
        fill(url, env, args.runs)
        print(f"filled {args.runs:,} runs ({args.runs * 10**6:.1e} samples claimed) in "
              f"{time.perf_counter() - start:.1f} s")
        rng = np.random.default_rng(5)
        files = []
        for name in ("first", "second"):
            path = work / f"{name}.csv"
            values = (8_000 + rng.gamma(2.0, 1_500.0, 1_000_000)).astype(np.int64)
            buffer = io.StringIO()
            np.savetxt(buffer, values, fmt="%d")
            path.write_text("latency_ns\n" + buffer.getvalue())
            files.append(path)
        figures = {}
        figures["deliver"], _ = timed([str(RTVIRT), "import", "column", str(files[0]), "--results", url,
                                       "--config", "cfg-7", "--json"], env)
        _, out = timed([str(RTVIRT), "import", "column", str(files[1]), "--results", url, "--config", "cfg-7",
                        "--json"], env)
        second = next(iter(json.loads(out)))
        figures["trend"], _ = timed([str(RTVIRT), "trend", "cfg-7", "--results", url, "--json"], env)
        figures["compare"], _ = timed([str(RTVIRT), "compare", second, "--results", url, "--json"], env)
        figures["sql"], _ = timed([str(RTVIRT), "sql", "SELECT machine, max(max_ns) FROM runs GROUP BY machine",
                                   "--results", url, "--format", "csv"], env)
        figures["sql+manifest"], _ = timed([str(RTVIRT), "sql", "SELECT count(manifest) FROM runs", "--results", url,
                                            "--format", "csv"], env)
        query = ("SELECT * FROM rtvirt_runs WHERE coalesce(config, name) = 'cfg-7' ORDER BY created, run_id")
        figures["reference"], _ = timed([_bin("psql"), url.split("?")[0], "-qAt", "-c", query], env)
        # where the time goes: the store's own work in this (already warm) process, without start-up and imports
        from rtvirt.stores.postgres import SharedStore

        store = SharedStore(url)
        for name, work in (("in-process rows(config)", lambda: store.rows(config="cfg-7")),
                           ("in-process runs_table()", store.runs_table)):
            start = time.perf_counter()
            work()
            figures[name] = time.perf_counter() - start
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import rtvirt.cli.trend, rtvirt.results.history, "
                        "rtvirt.stores.postgres, psycopg"], check=True)
        figures["trend's imports"] = time.perf_counter() - start
        store.close()
        start = time.perf_counter()
        publish_campaigns(url, args.runs)
        print(f"published {args.runs // RUNS_PER_CAMPAIGN:,} campaigns in {time.perf_counter() - start:.1f} s")
        figures |= serve_figures(url, env)
        figures["in-process campaign list query"] = campaign_list_query(url)
        for name, seconds in figures.items():
            print(f"{name:40s} {seconds:7.3f} s")
        print(f"trend / reference: {figures['trend'] / figures['reference']:.1f}")
        print(f"load average while it ran: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
