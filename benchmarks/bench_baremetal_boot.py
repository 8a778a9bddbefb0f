"""Boot to first sample of the bare-metal guest (goal: <= 2 s under TCG, milliseconds under KVM).

Boots the guest through the qemu environment (QMP placement included, as a campaign run does) with
the timer probe, and polls the stream file until its first whole record lands. Prints per boot:
  wall      QEMU started -> first record in the host's file (what a campaign waits)
  in-guest  the guest's own clock: first sample's t_ns (TSC since the VM's reset, in ns)
and the median against the goal as a ratio (< 1 meets it). TCG timings are emulation, not hardware.

    .venv/bin/python benchmarks/bench_baremetal_boot.py [--boots 5] [--accel tcg]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rtvirt.environments.qemu import QemuConfig, QemuEnvironment
from rtvirt.environments.sched import SchedPolicy
from rtvirt.procs import Supervisor
from rtvirt.stream import StreamReader

GOAL_S = 2.0


def _boot(work: Path, accel: str, index: int) -> tuple[float, float]:
    out = work / f"boot-{index}.rtvs"
    config = QemuConfig(kind="qemu", accel=accel, guest="baremetal", vcpu_sched=SchedPolicy(policy="other"))
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, work / f"vm-{index}")
        try:
            started = time.monotonic()
            launched = env.launch("rtvirt-probe", ["timer", "--duration=300000000", "--interval=1000000"], out)
            reader = StreamReader(out)
            first = None
            while first is None:
                new = reader.poll()
                if new.size:
                    first = time.monotonic() - started
                    in_guest = int(new["t_ns"][0]) / 1e9
                elif launched.poll() is not None:
                    raise SystemExit(f"the guest ended before its first sample: {env.console_text()[-1000:]}")
                else:
                    time.sleep(0.002)
            launched.proc.wait(timeout=60)  # type: ignore[union-attr]
        finally:
            env.close()
    return first, in_guest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boots", type=int, default=5)
    parser.add_argument("--accel", choices=("tcg", "kvm"), default="tcg")
    args = parser.parse_args()
    walls, guests = [], []
    with tempfile.TemporaryDirectory(prefix="rtvirt-bench-boot-") as tmp:
        for index in range(args.boots):
            wall, in_guest = _boot(Path(tmp), args.accel, index)
            walls.append(wall)
            guests.append(in_guest)
            print(f"boot {index}: wall {wall * 1000:7.1f} ms   in-guest {in_guest * 1000:7.1f} ms")
    median = statistics.median(walls)
    print(f"median boot-to-first-sample ({args.accel}): {median * 1000:.1f} ms wall, "
          f"{statistics.median(guests) * 1000:.1f} ms in-guest; "
          f"ratio to the {GOAL_S:.0f} s goal: {median / GOAL_S:.3f}")


if __name__ == "__main__":
    main()
