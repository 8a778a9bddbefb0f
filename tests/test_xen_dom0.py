"""rtvirt inside a Xen host's dom0 (`where = "dom0"`: xl as a local command, the local stream relay, teardown),
for real on a machine without Xen: a Xen lab boots with this machine's root file system shared read-only into its
dom0 (virtio-9p) plus a writable results directory; the test chroots into the share there and runs the real
`rtvirt run` of a small xen scenario with `where = "auto"`, which must detect dom0. One lab boot of its own (the
9p shares and a 3-pCPU machine whose dom0 has two vCPUs), one campaign: a complete run in an RTDS cpupool with
dom0 cut to one vCPU, then a long run stopped by SIGTERM once it streams. Results are checked on this side.

Python under TCG-nested Xen is slow (interpreter start and imports take minutes when the host is loaded): this
is the suite's slowest single test for that reason, not for what it measures.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RAN
from xen_lab_shares import LabShare, SharingXenLab

from rtvirt.environments.base import SharedResources
from rtvirt.environments.lab_machine import booted, open_lab
from rtvirt.environments.xen import XenLabConfig, is_dom0, local_domu_files
from rtvirt.store import load_run
from rtvirt.stream import read_stream

ROOT = "/mnt/hostroot"  # where dom0 mounts the "hostroot" share (tests/xen_lab_shares.py: /mnt/<tag>)
VENV_RTVIRT = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "rtvirt"
SCENARIO = """
name = "xen-in-dom0"
duration = "3s"
run_timeout = "15m"

[[workloads]]
name = "timer"
probe = "timer"
params = { interval = "1ms" }

# our bare-metal kernel as the domU (PVH): what is checked is dom0's side, and it boots in 3 s where a Linux domU
# took 27 s under nested TCG
[[environments]]
kind = "xen"
name = "rtds"
guest = "baremetal"
dom0_vcpus = 1
scheduler = "rtds"
rtds = { period = "10ms", budget = "9ms" }

[[environments]]
kind = "xen"
name = "long"
guest = "baremetal"
dom0_vcpus = 1

[[disturbances]]
name = "alone"

[[groups]]
name = "complete"
workload = "timer"
environments = ["rtds"]
disturbances = ["alone"]

[[groups]]
name = "stopped"
workload = "timer"
environments = ["long"]
disturbances = ["alone"]
duration = "10m"
"""

# dom0 side: the host's tree as a root, with dom0's own /proc, /sys, /dev, xenfs, xenstored's socket and the
# toolstack's state directories bound in, a tmpfs on /run for what must be writable (HOME, TMPDIR; not on /tmp,
# which may hold the checkout under test), the results share over its own (existing, read-only) host path ($1).
# matplotlib gets the host's font cache (building one under TCG takes minutes).
CHROOT_SETUP = r"""set -e
R=/mnt/hostroot
mount -t tmpfs tmpfs $R/run
mkdir -p $R/run/lock $R/run/xen $R/run/xenstored
mount -o bind /proc $R/proc
mount -t xenfs xenfs $R/proc/xen
mount -o bind /sys $R/sys
mount -o bind /dev $R/dev
mount -o bind /dev/pts $R/dev/pts
mount -o bind /var/run/xenstored $R/run/xenstored
mount -o bind /var/lib/xen $R/var/lib/xen
mount -o bind /var/log/xen $R/var/log/xen
mkdir -p $R/run/home/.cache $R/run/tmp
mount -o bind /mnt/results "$R$1"
cp -r $R/root/.cache/matplotlib $R/run/home/.cache/ 2>/dev/null || true
"""
# started in the background: rtvirt's pid and, once it ends, its exit status land in the results share
START = r"""cd /
chroot /mnt/hostroot /usr/bin/env -i PATH=/usr/lib/xen-4.17/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/run/home TMPDIR=/run/tmp RTVIRT_CACHE="$2" PYTHONDONTWRITEBYTECODE=1 \
  "$3" run "$1/scenario.toml" --out "$1/results" --no-progress --json \
  > /mnt/results/stdout 2> /mnt/results/stderr &
echo $! > /mnt/results/pid
wait $!
echo $? > /mnt/results/status
"""


def _online_vcpus(vcpu_list: str) -> int:
    return sum(1 for line in vcpu_list.splitlines()[1:] if line.split() and "p" not in line.split()[4])


def _wait_for(what: str, ready: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)
    return found


@pytest.fixture(scope="module")
def dom0_campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Boot the lab, run the campaign inside its dom0, SIGTERM its second run; what was seen, for the tests."""
    work = tmp_path_factory.mktemp("xen-dom0")
    (work / "scenario.toml").write_text(SCENARIO)
    _, initramfs = local_domu_files()  # cached here first: the shared tree is read-only in dom0
    seen: dict[str, Any] = {"work": work}
    started = time.monotonic()
    with SharedResources() as shared:
        config = XenLabConfig.model_validate({"pcpus": 3, "memory": 2560, "dom0_memory": 1024})
        shares = (LabShare("hostroot", Path("/")), LabShare("results", work, writable=True))

        def boot(earlier: list[str]) -> SharingXenLab:
            return booted(SharingXenLab(config, 2, shared.supervisor, shares, earlier))

        # booted as a campaign boots its lab: a boot that hangs is booted again, its hang report kept
        lab = open_lab(shared, "xen-dom0-test", boot, lambda made: made)
        for hang in lab.earlier:  # (in CI's output, where a passing test's prints are not)
            warnings.warn(f"the dom0 test's Xen lab was booted again: {hang}", stacklevel=1)
        try:
            dom0 = lab.connection
            seen["boot_seconds"] = lab.boot_seconds

            def xl(*args: str) -> str:
                return str(dom0.run(["xl", *args], timeout=300).check(f"xl {args[0]}").stdout)

            seen["vcpus_before"] = _online_vcpus(xl("vcpu-list", "0"))
            dom0.run(["sh", "-c", CHROOT_SETUP, "setup", str(work)], timeout=300).check("chroot setup")
            launcher = dom0.spawn(["sh", "-c", START, "start", str(work), str(initramfs.parents[1]),
                                   str(VENV_RTVIRT)], None)
            # the second run streams: its domU is up, dom0 has one vCPU, the first run's pool is gone
            def second_stream() -> Path | None:
                # rtvirt must still be running: an early exit fails here with its stderr, not after the timeout
                assert not (work / "status").exists(), f"rtvirt in dom0 ended early: {(work / 'stderr').read_text()}"
                runs = work / "results" / "runs"
                return next((p for p in runs.glob("*long*/samples.rtvs") if p.stat().st_size > 4096),
                            None) if runs.exists() else None

            stream = _wait_for("the second run's samples", second_stream, timeout=1500)
            seen["during"] = {"domains": xl("list"), "pools": xl("cpupool-list"),
                              "vcpus": _online_vcpus(xl("vcpu-list", "0"))}
            seen["stream_bytes_at_sigterm"] = stream.stat().st_size
            pid = (work / "pid").read_text().strip()
            dom0.run(["kill", "-TERM", pid]).check("kill -TERM rtvirt")
            _wait_for("rtvirt's exit after SIGTERM", lambda: (work / "status").exists() and
                      (work / "status").read_text().strip(), timeout=900)
            seen["status"] = int((work / "status").read_text())
            seen["stdout"] = (work / "stdout").read_text()
            seen["stderr"] = (work / "stderr").read_text()
            seen["after"] = {"domains": xl("list"), "pools": xl("cpupool-list"),
                             "vcpus": _online_vcpus(xl("vcpu-list", "0")),
                             "processes": dom0.run(["ps", "-o", "args"]).stdout}
            launcher.wait(120)
            seen["seconds"] = round(time.monotonic() - started)
            yield seen
        finally:
            lab.close()


def _runs(seen: dict[str, Any]) -> dict[str, Any]:
    summary = json.loads(seen["stdout"][seen["stdout"].index("{"):])
    return summary["runs"]  # type: ignore[no-any-return]


@pytest.mark.vm
@pytest.mark.timeout(2400)
def test_rtvirt_in_dom0_runs_xl_locally_and_stores_the_samples(dom0_campaign: dict[str, Any]) -> None:
    seen = dom0_campaign
    print(f"xen-dom0: lab boot {seen['boot_seconds']} s, whole test {seen['seconds']} s")
    run = _runs(seen)["complete/rtds/alone/-/r1"]
    assert run["status"] in RAN, (run, seen["stderr"][-2000:])
    manifest = load_run(seen["work"] / "results" / "runs" / run["run_id"]).manifest
    assert manifest["summary"]["all"]["samples"] > 100 and manifest["summary"]["all"]["dropped"] == 0
    print(f"xen-dom0: complete run {manifest['summary']['all']}")
    detail = manifest["environment_detail"]
    # where = "auto" found /proc/xen/capabilities saying control_d (this side is no dom0)
    # (detail["lab"] is the config's table only: a lab's record would name its hypervisor)
    assert detail["where"] == "dom0" and "hypervisor" not in detail["lab"] and not is_dom0()
    platform = manifest["system"]["platform"]
    assert platform["kind"] == "xen" and platform["xl_info"]["xen_major"] == "4"
    assert "credit2" in platform["xl_info"]["xen_scheduler"]
    applied = detail["applied"]
    assert applied["pool"].startswith("rtvirt-rtds-") and applied["domain"].startswith("rtvirt-rtds-measure-")
    assert [(r["Period"], r["Budget"]) for r in applied["sched_rtds"]] == [("10000", "9000")]
    # pinned to the last of the lab's three pCPUs (dom0 keeps 0 and 1), as xl reports it
    assert [v["hard_affinity"] for v in applied["vcpu_list"]] == ["2"]


@pytest.mark.vm
@pytest.mark.timeout(2400)
def test_dom0_vcpus_are_cut_for_the_campaign_and_restored(dom0_campaign: dict[str, Any]) -> None:
    seen = dom0_campaign
    assert seen["vcpus_before"] == 2
    assert seen["during"]["vcpus"] == 1  # xl vcpu-set 0 1 (dom0_vcpus = 1)
    assert seen["after"]["vcpus"] == 2, seen["after"]


@pytest.mark.vm
@pytest.mark.timeout(2400)
def test_sigterm_in_dom0_keeps_the_samples_and_leaves_no_domain_pool_or_relay(dom0_campaign: dict[str, Any]) -> None:
    seen = dom0_campaign
    # while the second run streamed: its domain existed, the first run's cpupool was already removed
    assert "rtvirt-long-measure-" in seen["during"]["domains"]
    assert "rtvirt-" not in seen["during"]["pools"]
    run = _runs(seen)["stopped/long/alone/-/r1"]
    assert run["status"] == "interrupted", run
    assert seen["status"] != 0
    stream = read_stream(seen["work"] / "results" / "runs" / run["run_id"] / "samples.rtvs")
    assert stream.records.size > 0
    assert (seen["work"] / "results" / "runs" / run["run_id"] / "samples.rtvs").stat().st_size >= \
        seen["stream_bytes_at_sigterm"]
    # teardown: only dom0 and Pool-0 remain, no listener or rtvirt process left in dom0
    domains = [line.split()[0] for line in seen["after"]["domains"].splitlines()[1:] if line.split()]
    pools = [line.split()[0] for line in seen["after"]["pools"].splitlines()[1:] if line.split()]
    assert domains == ["Domain-0"] and pools == ["Pool-0"], seen["after"]
    assert "nc -l" not in seen["after"]["processes"] and "rtvirt run" not in seen["after"]["processes"]
