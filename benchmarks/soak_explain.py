"""Soak: one long explained run with sparse injected interference; every injected outlier must keep its
explanation at every layer the environment has, with the memory the flight recorders held stated.

    .venv/bin/python benchmarks/soak_explain.py --env qemu --minutes 30   # layers vm + guest (a TCG guest)
    .venv/bin/python benchmarks/soak_explain.py --env host --minutes 30   # layer host
    .venv/bin/python benchmarks/soak_explain.py --env xen --minutes 30    # layers xen + guest (the nested lab)

Interference, each a known task on a known period, named by the layer that sees it:
- ``inside`` (qemu, xen): our ``cpu`` stressor inside the guest at SCHED_FIFO 50, above the probe (10), busy
  ``--burst`` every ``--every`` seconds: the guest layer names it (``guest task rtvirt-stress/N``);
- ``same-core`` (qemu, host): the same on the host CPU of the measured vCPU (of the probe, for host) at SCHED_FIFO
  99: the VM layer (``vCPU not running: rtvirt-stress/N ran``) or the host layer (``task rtvirt-stress/N``).
Their periods differ by 7 s so that their bursts drift apart.

Each burst makes outliers of about its length, far above the threshold (half the burst); each
interferer's bursts are found in the stored explanation by its cause and grouped (outliers less than a second
apart are one burst). A burst of the run that left no named outlier is missing: the run lost it. The script
prints per interferer the bursts expected (the run's length over the period) and found, the largest gap between
found bursts (one period when none is missing), every note of every layer about trace it lost, what each
recorder held against its bound, and the campaign process's peak RSS. Exit 1 when a burst is missing or a
layer lost trace of an explained window.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAST_CPU = max(os.sched_getaffinity(0))
# notes that name outlier windows whose trace is not whole (the bound dropping trace no window needed is not one)
LOST = re.compile(r"outlier windows lost trace|outside the kept trace|were not held|overflowed before")

ENVIRONMENTS = {
    "qemu": ('kind = "qemu"\nname = "soak"\naccel = "tcg"\nguest = "linux"\ncpus = [{cpu}]\nboot_timeout = "600s"',
             ["vm", "guest"], ["inside", "same-core"]),
    "host": ('kind = "host"\nname = "soak"\ncpus = [{cpu}]', ["host"], ["same-core"]),
    "xen": ('kind = "xen"\nname = "soak"\nguest = "linux"\ncpus = "1"\nboot_timeout = "900s"', ["xen", "guest"],
            ["inside"]),
}
# the interferer's cause as each layer names it
CAUSES = {"inside": ("guest", "guest task rtvirt-stress/"), "same-core": (None, "rtvirt-stress/")}


def scenario(env: str, minutes: float, every_s: float, burst_ms: int, interval_us: int, top: int, cpu: int) -> str:
    environment, layers, interferers = ENVIRONMENTS[env]
    stressors = ""
    for offset, where in enumerate(interferers):
        priority = 50 if where == "inside" else 99
        stressors += (f'[[disturbances.stressors]]\nstressor = "cpu"\nwhere = "{where}"\nworkers = 1\n'
                      f'params = {{ priority = {priority}, slice = "{burst_ms}ms", '
                      f'period = "{int((every_s + 7 * offset) * 1000)}ms" }}\n')
    return (f'name = "soak-explain-{env}"\nduration = "{int(minutes * 60)}s"\nrun_timeout = "20m"\n\n'
            f'[workload]\nprobe = "timer"\nparams = {{ interval = "{interval_us}us", priority = 10 }}\n\n'
            f"[[environments]]\n{environment.format(cpu=cpu)}\n\n"
            f'[[disturbances]]\nname = "bursts"\n{stressors}\n'
            f'[timeline]\nstart_order = ["stress-first"]\nsettle = "0s"\n\n'
            f'[explain]\nthreshold = "{burst_ms // 2}ms"\ntop = {top}\nlayers = {json.dumps(layers)}\n')


def bursts_found(run_dir: Path, interferers: list[str], every_s: float) -> dict[str, dict[str, Any]]:
    """Per interferer: the bursts the explanation names it in (times from the run's start) and the largest gap."""
    from rtvirt.explain.stored import read_explanation
    from rtvirt.store import load_run

    explanation = read_explanation(run_dir)
    assert explanation is not None, "the run has no explanation"
    manifest = load_run(run_dir).manifest
    start = int(manifest["stream_header"]["start_monotonic_ns"])
    found = {}
    for offset, where in enumerate(interferers):
        layer, prefix = CAUSES[where]
        by_cause: dict[str, set[float]] = {}
        for part in explanation.parts:
            if prefix in part.cause and (layer is None or part.layer == layer) and \
                    (where != "same-core" or not part.cause.startswith("guest")):
                by_cause.setdefault(part.cause.split(" (")[0], set()).add((part.sample_t_ns - start) / 1e9)
        # ours is the task named in the most bursts (another developer's stressor on this machine may show too)
        times = sorted(max(by_cause.values(), key=lambda named: len(_grouped(sorted(named))), default=set()))
        bursts = _grouped(times)
        gaps = [later - earlier for earlier, later in zip(bursts, bursts[1:], strict=False)]
        period = every_s + 7 * offset
        found[where] = {"period_s": period, "bursts": len(bursts), "first_s": bursts[0] if bursts else None,
                        "last_s": bursts[-1] if bursts else None, "largest_gap_s": max(gaps, default=0.0)}
    return found


def _grouped(times: list[float]) -> list[float]:
    """Outlier times (sorted) less than a second apart as one burst each (its first)."""
    return [t for i, t in enumerate(times) if i == 0 or t - times[i - 1] > 1.0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(ENVIRONMENTS), default="qemu")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between an interferer's bursts")
    parser.add_argument("--burst", type=int, default=500, help="each burst's length, ms (it must stand out of the "
                        "run's own outliers: a TCG guest on a loaded host has hundreds above 250 ms in 30 min)")
    parser.add_argument("--top", type=int, default=400, help="outliers explained (the bursts must be among them)")
    parser.add_argument("--interval", type=int, default=2000, help="the timer probe's period, us")
    parser.add_argument("--cpu", type=int, default=LAST_CPU, help="the measured (v)CPU's host CPU (qemu, host)")
    parser.add_argument("--out", type=Path, help="results directory (default: a temporary one, kept)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"rtvirt-soak-explain-{args.env}-"))
    path = out / "soak.toml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario(args.env, args.minutes, args.every, args.burst, args.interval, args.top, args.cpu))
    load_before = os.getloadavg()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rtvirt", "run", str(path), "--out", str(out), "--no-progress",
                           "--no-report", "--json"], capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    peak_rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    try:
        [run] = json.loads(done.stdout)["runs"].values()
    except (ValueError, KeyError) as exc:
        sys.exit(f"soak: the campaign did not say how it went ({exc}): {done.stderr[-2000:]}")
    run_dir = out / "runs" / str(run["run_id"])
    _, layers, interferers = ENVIRONMENTS[args.env]
    found = bursts_found(run_dir, interferers, args.every)
    from rtvirt.explain.stored import read_explanation

    explanation = read_explanation(run_dir)
    assert explanation is not None
    print(f"soak-explain {args.env}: {args.minutes:g} min run ({run['status']}), {elapsed / 60:.1f} min wall, "
          f"load average {load_before[0]:.1f} before / {os.getloadavg()[0]:.1f} after; "
          f"{explanation.outliers} outliers above {explanation.threshold_ns / 1e6:g} ms, "
          f"{len({p.rank for p in explanation.parts})} explained; campaign peak RSS {peak_rss_mib:.0f} MiB")
    missing = False
    for where, numbers in found.items():
        expected = int(args.minutes * 60 // numbers["period_s"])
        missing |= numbers["bursts"] < expected or numbers["largest_gap_s"] > 1.5 * numbers["period_s"]
        print(f"  {where} interferer (every {numbers['period_s']:g} s): {numbers['bursts']} bursts named of "
              f"{expected} expected, first at {numbers['first_s']} s, last at {numbers['last_s']} s, largest gap "
              f"{numbers['largest_gap_s']:.1f} s")
    lost = False
    for layer in explanation.layers:
        state = "seen" if layer.seen else f"not seen: {layer.why_not}"
        print(f"  layer {layer.layer}: {state}; dropped events {layer.dropped_events}")
        for note in layer.notes:
            if "flight recorder" in note or "segments" in note or "dropped" in note or LOST.search(note):
                print(f"    {note[:400]}")
            lost |= bool(LOST.search(note))
        lost |= layer.layer in layers and not layer.seen
    sys.exit(1 if missing or lost else 0)


if __name__ == "__main__":
    main()
