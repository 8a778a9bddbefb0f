"""Throughput of the guest -> host sample channel (virtio-serial into a chardev file).

Runs the selftest probe (synthetic samples at a set rate) three ways and prints samples/s and drops:
  host      the agent writing straight to a host file: the reference, no channel in between
  guest     the agent inside the QEMU guest, samples leaving over virtio-serial, at 1 M samples/s
  guest-max the same as fast as the guest can produce them (--rate=0)
The goal: >= 1 M samples/s from the guest without a single drop. Under TCG the guest CPU is emulated,
so guest-max is bounded by emulation speed, not by the channel.

    .venv/bin/python benchmarks/bench_guest_stream.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from rtvirt.agents import agent_path
from rtvirt.environments.qemu import QemuConfig, QemuEnvironment
from rtvirt.environments.sched import SchedPolicy
from rtvirt.procs import Supervisor
from rtvirt.stream import read_stream


def _figures(path: Path, label: str, wall: float) -> dict[str, float]:
    stream = read_stream(path)
    t = stream.records["t_ns"]
    span = (int(t.max()) - int(t.min())) / 1e9 if t.size > 1 else float("nan")
    rate = stream.records.size / span if span else float("nan")
    print(f"{label:10s} samples={stream.records.size:>10d} dropped={stream.total_dropped:>8d} "
          f"end={stream.end_reason} span={span:6.2f}s rate={rate / 1e6:7.3f} M samples/s "
          f"({rate * 32 / 1e6:6.1f} MB/s) wall={wall:5.1f}s")
    return {"rate": rate, "dropped": stream.total_dropped, "samples": stream.records.size}


def _host(seconds: float, rate: int, work: Path) -> dict[str, float]:
    out = work / "host.rtvs"
    argv = [str(agent_path("rtvirt-probe")), "selftest", f"--rate={rate}", f"--duration={int(seconds * 1e9)}",
            "--affinity=0", f"--out={out}"]
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return _figures(out, "host", time.monotonic() - started)


def _guest(seconds: float, rate: int, work: Path, label: str) -> dict[str, float]:
    out = work / f"{label}.rtvs"
    config = QemuConfig(kind="qemu", vcpus=2, memory=512, pin=False, vcpu_sched=SchedPolicy(policy="other"))
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, work / label)
        try:
            started = time.monotonic()
            launched = env.launch("rtvirt-probe", ["selftest", f"--rate={rate}", f"--duration={int(seconds * 1e9)}",
                                                   "--affinity=0"], out)
            launched.follow(timeout=600)
            problem = env.check()
            if problem:
                raise SystemExit(f"{label}: {problem}\n{env.console_text()[-2000:]}")
            accel = env.describe()["acceleration"]
        finally:
            env.close()
    figures = _figures(out, label, time.monotonic() - started)
    figures["accel"] = accel  # type: ignore[assignment]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-guest-") as directory:
        work = Path(directory)
        host = _host(args.seconds, 1_000_000, work)
        guest = _guest(args.seconds, 1_000_000, work, "guest")
        fastest = _guest(args.seconds, 0, work, "guest-max")
    print(f"acceleration: {guest['accel']}")
    print(f"guest / host rate at 1 M/s: {guest['rate'] / host['rate']:.3f}; guest drops: {int(guest['dropped'])}")
    print(f"guest-max / 1 M/s goal: {fastest['rate'] / 1e6:.2f}x")
    goal_met = guest["rate"] >= 0.99e6 and guest["dropped"] == 0
    print("goal >= 1 M samples/s without loss:", "MET" if goal_met else "NOT MET")


if __name__ == "__main__":
    main()
