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
process, and the imports trend needs).

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
        for name, seconds in figures.items():
            print(f"{name:24s} {seconds:7.2f} s")
        print(f"trend / reference: {figures['trend'] / figures['reference']:.1f}")


if __name__ == "__main__":
    main()
