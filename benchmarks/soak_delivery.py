"""Soak: many short runs of a measuring guest beside two disturbing guests that start first (issue 27's failing
configuration, examples/scenarios/soak-delivery.toml), optionally with the host's CPUs kept busy; then every run's
manifest is checked: complete (or short: whole, with fewer samples than promised), and the host holds every record
the guest's agent wrote.

    .venv/bin/python benchmarks/soak_delivery.py --repetitions 100            # a quiet host
    .venv/bin/python benchmarks/soak_delivery.py --repetitions 100 --load 2   # its 2 CPUs kept busy

Prints, per group (linux, baremetal): runs, complete, runs that lost samples, the agent's word on the handshake,
and how often (and for how long) the Linux guest's /init had to wait for its virtio-serial ports: without that wait
each such run would have lost every sample (the cause found in issue 27). Exit 1 when any run lost anything.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "scenarios" / "soak-delivery.toml"


@contextlib.contextmanager
def host_load(workers: int) -> Iterator[None]:
    """``workers`` busy loops at nice 19: the host's CPUs stay occupied, as by other work on a shared machine."""
    loops = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
             for _ in range(workers)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def check_runs(results: Path) -> dict[str, collections.Counter[str]]:
    """Per group: what each run's manifest says of its status and delivery."""
    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for manifest_path in sorted((results / "runs").glob("*/manifest.json")):
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        group = str((manifest.get("campaign") or {}).get("group") or "?")
        counts = tally[group]
        counts["runs"] += 1
        counts[f"status {manifest.get('status')}"] += 1
        delivery = manifest.get("delivery") or {}
        if delivery.get("agent_records") is not None and delivery["agent_records"] == delivery.get("host_records"):
            counts["every record arrived"] += 1
        else:
            counts["lost records"] += 1
        if "guest_said" in delivery:
            counts[f"agent said {delivery['guest_said']}"] += 1
        waited = delivery.get("ports_waited_s")
        if waited:
            counts["/init waited for its ports"] += 1
            counts["longest port wait (0.1 s)"] = max(counts["longest port wait (0.1 s)"], round(waited * 10))
            for port in delivery.get("ports_late", []):
                counts[f"late at /init's first look: {port}"] += 1
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=100)
    parser.add_argument("--load", type=int, default=0, help="busy loops at nice 19 beside the soak")
    parser.add_argument("--out", type=Path, help="results directory (default: a temporary one)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rtvirt-soak-")))
        stack.enter_context(host_load(args.load))
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "rtvirt", "run", str(SCENARIO), "--repetitions",
                        str(args.repetitions), "--out", str(out), "--no-progress"], check=False,
                       stdout=subprocess.DEVNULL)
        elapsed = time.monotonic() - started
        tally = check_runs(out)
    print(f"soak: {args.repetitions} repetitions per group, {args.load} busy loops beside, {elapsed / 60:.1f} min")
    for group, counts in sorted(tally.items()):
        print(f"  {group}: " + ", ".join(f"{key}: {value}" for key, value in sorted(counts.items())))
    # a short run (the load starved it of samples) kept its whole stream: not a loss
    lost = sum(counts["lost records"] + counts["runs"] - counts["status complete"] - counts["status short"]
               for counts in tally.values())
    sys.exit(1 if lost or not tally else 0)


if __name__ == "__main__":
    main()
