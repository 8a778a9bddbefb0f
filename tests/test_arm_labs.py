"""The ARM labs (issue 41): the KVM lab and the Xen lab as an emulated Cortex-A72 board with a GICv2, from Debian's
arm64 packages, picked by ``arch = "aarch64"`` on the environment; and the guest-isolation study on them.

One campaign (a subset of the built-in guest-isolation-arm: qsort, solo and beside the spinning Linux guest on the
same and on the other core, under Xen and under KVM) is interrupted twice on its way: Ctrl-C while the Xen lab's
first run streams, then kill -9 while the KVM lab's first run streams; ``--resume`` finishes it. The checks read what
each step left (nothing running, the interrupted run's samples kept) and the finished campaign (every run complete,
what was emulated in every manifest, one report with the Xen and KVM rows). Nothing here compares timings (nested
under TCG on an emulated Arm CPU they are not representative).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from conftest import RTVIRT, has_samples, run_cli

from rtvirt.environments.guest_image import cache_dir
from rtvirt.environments.kvmlab.lab import LAB_ROOT as KVM_LAB_ROOT
from rtvirt.environments.libvirt import LibvirtConfig, LibvirtEnvironment
from rtvirt.environments.xen.lab import LAB_ROOT as XEN_LAB_ROOT
from rtvirt.errors import InputError
from rtvirt.procs import Supervisor
from rtvirt.results.report import write_report
from rtvirt.scenario import builtin_scenarios
from rtvirt.scenario.loader import parse_scenario
from rtvirt.store import load_run

EMULATED = "QEMU virt board, CPU cortex-a72, GICv2, emulated by TCG"
DISTURBANCES = ("solo", "spin-same-core", "spin-other-core")


def _study_subset() -> str:
    """guest-isolation-arm's qsort group on both ARM labs, once, 10 s a run: six runs, two lab boots."""
    document = tomllib.loads(builtin_scenarios()["guest-isolation-arm"])
    document["repetitions"] = 1
    document["duration"] = "10s"
    document["groups"] = [group for group in document["groups"] if group["name"] == "qsort"]
    return tomli_w.dumps(document)


def _labs_of(owner: int) -> list[Path]:
    """The lab directories (both kinds) whose rtvirt is ``owner``."""
    found = []
    for root in (cache_dir() / KVM_LAB_ROOT, cache_dir() / XEN_LAB_ROOT):
        for lab in sorted(root.glob("lab-*")) if root.exists() else []:
            try:
                if (lab / "owner.pid").read_text() == str(owner):
                    found.append(lab)
            except FileNotFoundError:
                continue
    return found


def _qemus(lab: Path) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"{lab}/"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _wait_streaming(results: Path, proc: subprocess.Popen[str], pattern: str, timeout: float) -> None:
    """Until a run matching ``pattern`` has streamed samples (the probe is running in the guest): records, not just
    the stream's header, which alone is several hundred bytes."""
    deadline = time.monotonic() + timeout
    while not any(has_samples(p) for p in results.glob(f"runs/*{pattern}*/samples.rtvs")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)


_CAMPAIGN: dict[str, Any] = {}


@pytest.fixture(scope="session")
def arm_campaign(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The study subset on both ARM labs, interrupted by Ctrl-C and by kill -9 and resumed to its end: what each
    step left, and the finished campaign's results directory and summary."""
    if _CAMPAIGN:
        return _CAMPAIGN
    work = tmp_path_factory.mktemp("arm-labs")
    (work / "study.toml").write_text(_study_subset())
    results = work / "results"
    argv = [*RTVIRT, "run", "--no-report", "--out", str(results), "--no-progress"]
    # Ctrl-C while the Xen lab's first run streams
    first = subprocess.Popen([*argv, str(work / "study.toml")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    _wait_streaming(results, first, "xen-arm_solo", 1500)
    (xen_lab,) = _labs_of(first.pid)
    _CAMPAIGN["ctrl_c_lab_ran"] = bool(_qemus(xen_lab))
    first.send_signal(signal.SIGINT)
    try:
        _, err = first.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        first.kill()
        pytest.fail(f"rtvirt did not end within 600 s of Ctrl-C: {first.communicate()[1][-3000:]}")
    _CAMPAIGN.update(ctrl_c_status=first.returncode, ctrl_c_err=err[-3000:],
                     ctrl_c_left=[str(lab) for lab in _labs_of(first.pid)] + [str(p) for p in _qemus(xen_lab)],
                     interrupted_runs=[load_run(path.parent).manifest for path in results.glob("runs/*/manifest.json")])
    # kill -9 while the KVM lab's first run streams (the Xen runs, resumed, are done by then)
    second = subprocess.Popen([*argv, "--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_streaming(results, second, "kvm-arm_solo", 2400)
    killed_labs = _labs_of(second.pid)
    second.kill()
    second.wait()
    until = time.monotonic() + 60
    while any(_qemus(lab) for lab in killed_labs) and time.monotonic() < until:
        time.sleep(0.5)
    _CAMPAIGN.update(killed_labs=killed_labs, qemus_after_kill=[p for lab in killed_labs for p in _qemus(lab)])
    # --resume reclaims what the killed campaign left and finishes the campaign
    finished = run_cli("run", "--no-report", "--resume", "--out", str(results), "--no-progress", "--json",
                       timeout=2400)
    _CAMPAIGN.update(results=results, status=finished.returncode, err=finished.stderr[-3000:],
                     summary=json.loads(finished.stdout[finished.stdout.index("{"):]) if "{" in finished.stdout
                     else {})
    return _CAMPAIGN


def _manifest(campaign: dict[str, Any], key: str) -> dict[str, Any]:
    run = campaign["summary"]["runs"][key]
    assert run["status"] == "complete", run
    return load_run(campaign["results"] / "runs" / run["run_id"]).manifest  # type: ignore[no-any-return]


@pytest.mark.vm
@pytest.mark.timeout(5400)
def test_ctrl_c_and_kill_9_leave_nothing_running_and_resume_finishes_the_campaign(
        arm_campaign: dict[str, Any]) -> None:
    assert arm_campaign["ctrl_c_lab_ran"]
    assert arm_campaign["ctrl_c_status"] == 130, arm_campaign["ctrl_c_err"]
    assert arm_campaign["ctrl_c_left"] == []  # the Xen lab's directory and QEMU went with Ctrl-C
    (interrupted,) = [m for m in arm_campaign["interrupted_runs"] if m["campaign"]["outcome"] == "interrupted"]
    assert interrupted["summary"]["all"]["samples"] > 0  # the streamed samples were kept
    # kill -9: the labs' QEMUs died with rtvirt (PR_SET_PDEATHSIG); --resume removed their directories
    assert arm_campaign["killed_labs"] and arm_campaign["qemus_after_kill"] == []
    assert not any(lab.exists() for lab in arm_campaign["killed_labs"])
    assert arm_campaign["status"] == 0, arm_campaign["err"]
    runs = arm_campaign["summary"]["runs"]
    assert {key for key in runs} == {f"qsort/{system}/{d}/{'-' if d == 'solo' else 'stress-first'}/r1"
                                      for system in ("xen-arm", "kvm-arm") for d in DISTURBANCES}
    assert all(run["status"] == "complete" for run in runs.values()), runs


@pytest.mark.vm
@pytest.mark.timeout(5400)
def test_every_run_says_what_was_emulated_and_runs_on_arm_kvm_and_arm_xen(arm_campaign: dict[str, Any]) -> None:
    for disturbance in DISTURBANCES:
        order = "-" if disturbance == "solo" else "stress-first"
        kvm = _manifest(arm_campaign, f"qsort/kvm-arm/{disturbance}/{order}/r1")
        lab = kvm["environment_detail"]["kvm_lab"]
        # the lab's kernel started at EL2 with its KVM and a vGIC on the emulated GICv2
        assert lab["arch"] == "aarch64" and lab["emulated"] == EMULATED and lab["gic_version"] == 2, lab
        assert lab["kernel"].endswith("-arm64") and lab["kvm_module"] == "kvm (built in)"
        assert {"All CPU(s) started at EL2", "Hyp mode initialized successfully"} <= set(lab["kernel_said"]), lab
        assert kvm["environment_detail"]["domain_type"] == "kvm"
        assert "<gic version='2'/>" in kvm["environment_detail"]["domain_xml"]
        assert kvm["environment_detail"]["guest_kernel"].endswith("-arm64")
        xen = _manifest(arm_campaign, f"qsort/xen-arm/{disturbance}/{order}/r1")
        detail = xen["environment_detail"]
        assert detail["lab"]["arch"] == "aarch64" and detail["lab"]["emulated"] == EMULATED, detail["lab"]
        assert detail["applied"]["type"] == "pvh" and detail["guest_uname"].startswith("6.1.0-")
        assert detail["guest_kernel"].endswith("-arm64")
        for manifest, what in ((kvm, "nested KVM under TCG"), (xen, "nested Xen under TCG")):
            assert any(what in w and EMULATED in w for w in manifest["system"]["warnings"]), manifest["system"]
            assert manifest["summary"]["all"]["samples"] > 0
    # the stressor domU ran on the Xen pCPU its disturbance placed it on: the measuring domU's, or the other one
    for disturbance, pcpu in (("spin-same-core", "1"), ("spin-other-core", "0")):
        detail = _manifest(arm_campaign, f"qsort/xen-arm/{disturbance}/stress-first/r1")["environment_detail"]
        assert detail["applied"]["vcpu_list"][0]["hard_affinity"] == "1"
        (stressor,) = detail["disturbing_domus"]
        assert [vcpu["hard_affinity"] for vcpu in stressor["vcpu_list"]] == [pcpu], stressor


@pytest.mark.vm
@pytest.mark.timeout(5400)
def test_one_report_has_the_arm_xen_and_kvm_rows_of_the_study(arm_campaign: dict[str, Any]) -> None:
    results = arm_campaign["results"]
    report = write_report(results, results / "report.md", "markdown").read_text()
    assert "Guest-isolation study" in report
    # the increase table: each system's spinning runs against its own solo run, a row per system and placement
    # (the outliers table before it has a row per run, solo ones too)
    table = report[report.index("## Guest-isolation study: increase"):].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|") and "qsort" in line]
    increase = [row for row in rows if "spin-" in row and row.rstrip(" |").endswith(("xen-arm", "kvm-arm"))]
    systems = {row.rstrip(" |").rsplit("|", 1)[-1].strip() for row in increase}
    assert systems == {"xen-arm", "kvm-arm"}, rows
    assert len(increase) == 4, increase


# ---- without a lab: the one key, what it refuses, the domain an ARM lab's libvirtd is given ----------------------

def _scenario(environment: str) -> str:
    return f'name = "arm"\nduration = "1s"\n[workload]\nprobe = "timer"\n[[environments]]\n{environment}\n'


def test_arch_aarch64_is_the_one_key_that_puts_a_scenario_on_the_arm_labs() -> None:
    scenario = parse_scenario(_scenario('kind = "xen"\narch = "aarch64"') +
                              '[[environments]]\nkind = "libvirt"\nname = "k"\nhost = "lab"\narch = "aarch64"\n')
    xen, kvm = scenario.environments
    assert (xen.arch, xen.mode) == ("aarch64", "pvh")  # Xen on Arm: PVH, no need to say so
    assert kvm.arch == "aarch64" and kvm.lab.key("aarch64") != kvm.lab.key("x86_64")  # a lab of its own


@pytest.mark.parametrize(("environment", "path", "message"), [
    ('kind = "libvirt"\narch = "aarch64"', "environments[0]", 'host = "lab" boots one'),
    ('kind = "libvirt"\nhost = "lab"\narch = "aarch64"\nlab = { accel = "kvm" }', "environments[0]",
     "an aarch64 lab is emulated"),
    ('kind = "libvirt"\nhost = "lab"\narch = "mips"', "environments[0].arch", "'x86_64' or 'aarch64'"),
    ('kind = "xen"\narch = "aarch64"\nmode = "pv"', "environments[0]", "Xen on Arm runs every domU as PVH"),
    ('kind = "xen"\narch = "aarch64"\nwhere = "dom0"', "environments[0]", "an aarch64 Xen is a lab"),
    ('kind = "xen"\narch = "aarch64"\nscheduler = "arinc653"', "environments[0]", "no rtvirt-a653"),
])
def test_what_the_arm_labs_cannot_do_is_refused_naming_the_field(environment: str, path: str, message: str) -> None:
    with pytest.raises(InputError) as error:
        parse_scenario(_scenario(environment))
    assert path in str(error.value) and message in str(error.value), str(error.value)


@pytest.mark.parametrize("guest", ["linux", "baremetal"])
def test_an_arm_domain_is_the_virt_board_with_the_labs_gicv2_and_its_pl011(tmp_path: Path, guest: str) -> None:
    config = LibvirtConfig.model_validate({"kind": "libvirt", "name": "k", "host": "lab", "arch": "aarch64",
                                           "guest": guest, "pin": False})
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(config, supervisor, tmp_path)
        env._type = {"type": "kvm"}
        env._baremetal_cmdline = "timer --duration=1000000"
        xml = ET.fromstring(env._domain_xml("/k", None if guest == "baremetal" else "/i", True))
    os_type = xml.find("os/type")
    assert os_type is not None and os_type.attrib == {"arch": "aarch64", "machine": "virt"}
    assert xml.find("features/gic").attrib == {"version": "2"}  # type: ignore[union-attr]
    assert xml.find("features/acpi") is None  # Arm powers off through PSCI
    if guest == "linux":
        assert xml.findtext("os/cmdline", "").startswith("console=ttyAMA0 ")
    else:  # the aarch64 bare-metal kernel's virtio console is on virtio-mmio
        controller = xml.find("devices/controller[@type='virtio-serial']")
        assert controller is not None and controller.find("address").attrib == {"type": "virtio-mmio"}  # type: ignore[union-attr]
