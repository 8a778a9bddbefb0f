"""The KVM lab (a real KVM host: Debian's kernel with kvm-amd, Debian's QEMU and libvirtd, booted in QEMU under
TCG here) driven by the libvirt kind over SSH, beside the Xen lab in one campaign of the guest-isolation study.

Lab boots are few: one `rtvirt run` (one KVM lab boot, one Xen lab boot) runs every guest the checks below read;
Ctrl-C costs one boot, kill -9 + --resume with a lab that dies three (the dead lab is booted again for the
campaign's later runs, and the run it died under is run again there), a lab that cannot boot none, an explained
libvirt domain beside a host task one. Nothing here compares timings (nested under TCG they are not
representative): the manifests, the report's rows and what is left running are checked.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from conftest import (
    FIFO_TASK_ON_THE_VCPUS_PCPU,
    RAN,
    RTVIRT,
    assert_given_host_tsc_rate,
    assert_ran,
    fifo_task_named_and_exits_counted,
    run_cli,
)

from rtvirt.environments.base import SharedResources
from rtvirt.environments.guest_image import cache_dir
from rtvirt.environments.kvmlab.config import KvmLabConfig
from rtvirt.environments.kvmlab.lab import LAB_ROOT, KvmLab, open_kvm_lab
from rtvirt.environments.lab_cpus import KernelSymbols
from rtvirt.environments.lab_machine import CPU_DUMP_MARK, MAX_REBOOTS
from rtvirt.errors import InputError
from rtvirt.results.report import write_report
from rtvirt.scenario import builtin_scenarios
from rtvirt.scenario.loader import parse_scenario
from rtvirt.store import load_run

# the study's subset the suite runs: the bare-metal guest on both labs, solo and beside the spinning stressor
# guest (a Linux guest of each hypervisor); Debian's kernel and its PREEMPT_RT kernel on the KVM lab, solo
KEPT = {"xen-baremetal", "kvm-baremetal", "kvm-linux", "kvm-linux-rt"}


def _study_subset() -> str:
    """guest-isolation-xen-kvm with the kept environments and a qemu guest in the KVM lab, one repetition: two
    groups, seven runs."""
    document = tomllib.loads(builtin_scenarios()["guest-isolation-xen-kvm"])
    document["repetitions"] = 1
    document["duration"] = "10s"  # a few qsort iterations of 1.2 M elements under nested TCG
    document["environments"] = [env for env in document["environments"] if env["name"] in KEPT]
    # rtvirt's own QEMU in the same lab boot, over SSH (the qemu kind's host = "lab")
    document["environments"].append({"kind": "qemu", "name": "kvm-qemu", "host": "lab", "boot_timeout": "10m"})
    qsort = document["groups"][0]
    document["groups"] = [{**qsort, "environments": ["xen-baremetal", "kvm-baremetal"]},
                          {**qsort, "name": "guests", "environments": ["kvm-linux", "kvm-linux-rt", "kvm-qemu"],
                           "disturbances": ["solo"]}]
    return tomli_w.dumps(document)


def _summary(output: str) -> dict[str, Any]:
    return json.loads(output[output.index("{"):])  # type: ignore[no-any-return]


def _owner(lab: Path) -> str | None:
    """The pid that owns ``lab`` (None: its directory went meanwhile, another test's lab closing)."""
    try:
        return (lab / "owner.pid").read_text()
    except FileNotFoundError:
        return None


def _lab_dirs(owner: int) -> list[Path]:
    root = cache_dir() / LAB_ROOT
    return [lab for lab in sorted(root.glob("lab-*")) if _owner(lab) == str(owner)] if root.exists() else []


def _lab_qemus(lab: Path) -> list[int]:
    """The pids of QEMUs running ``lab`` (their command line names its directory)."""
    found = subprocess.run(["pgrep", "-f", f"{lab}/"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def _wait_for_samples(results: Path, proc: subprocess.Popen[str], size: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(p.stat().st_size > size for p in results.glob("runs/*/samples.rtvs")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)


_CAMPAIGN: dict[str, Any] = {}


@pytest.fixture(scope="session")
def kvm_lab_campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One KVM lab boot and one Xen lab boot for every run of _study_subset(); (results dir, campaign summary)."""
    if not _CAMPAIGN:
        work = tmp_path_factory.mktemp("kvm-lab")
        (work / "study.toml").write_text(_study_subset())
        result = run_cli("run", "--no-report", str(work / "study.toml"), "--out", str(work / "results"),
                         "--no-progress", "--json", timeout=2400)
        assert_ran(result)
        _CAMPAIGN.update(results=work / "results", summary=_summary(result.stdout))
    return _CAMPAIGN["results"], _CAMPAIGN["summary"]


def _lab_build(lab: dict[str, Any], boots: dict[int, float]) -> str:
    """What a run's lab is, apart from which boot of the campaign it ran in: a lab that stalls under a run is booted
    again and the run made again (seen in CI: the lab's CPU 0 in a soft lockup inside the nested guest's QEMU for
    nine minutes), at most twice, each later boot saying why the earlier stopped. ``boots`` collects each boot's
    time by its number: two labs booted for one campaign would both be its first boot, at different times."""
    boot = lab["boot_of_campaign"]
    assert len(lab["earlier_boots_stopped"]) == boot - 1 <= 2 and all(lab["earlier_boots_stopped"]), lab
    assert boots.setdefault(boot, lab["boot_seconds"]) == lab["boot_seconds"], (boots, lab)
    return json.dumps({k: v for k, v in lab.items()
                       if k not in ("boot_of_campaign", "earlier_boots_stopped", "boot_seconds")}, sort_keys=True)


def _manifest(campaign: tuple[Path, dict[str, Any]], key: str) -> dict[str, Any]:
    results, summary = campaign
    run = summary["runs"][key]
    assert run["status"] in RAN, run
    return load_run(results / "runs" / run["run_id"]).manifest  # type: ignore[no-any-return]


@pytest.mark.vm
@pytest.mark.timeout(2700)
def test_linux_preempt_rt_and_bare_metal_guests_run_under_the_labs_kvm(
        kvm_lab_campaign: tuple[Path, dict[str, Any]]) -> None:
    facts: list[str] = []
    boots: dict[int, float] = {}
    for key, guest in (("guests/kvm-linux/solo/-/r1", "linux"), ("guests/kvm-linux-rt/solo/-/r1", "linux-rt"),
                       ("qsort/kvm-baremetal/solo/-/r1", "baremetal")):
        manifest = _manifest(kvm_lab_campaign, key)
        detail = manifest["environment_detail"]
        # libvirt in the lab, its socket forwarded over rtvirt's SSH link to the lab (the lab's key and its pinned
        # host key), picked KVM itself
        assert detail["host"] == "lab" and detail["domain_type"] == "kvm", detail
        assert detail["domain_type_reason"] == "the KVM lab offers KVM"
        assert re.fullmatch(r"root@127\.0\.0\.1:\d+:/run/libvirt/libvirt-sock \(over rtvirt's SSH\)",
                            detail["libvirtd"]), detail["libvirtd"]
        assert "<cpu mode='host-passthrough'" in detail["domain_xml"]
        lab = detail["kvm_lab"]
        # the manifest says KVM: kvm-amd with nested paging, the lab's kernel, its QEMU and libvirt versions
        assert lab["kvm_module"] == "kvm-amd" and lab["nested_paging"] is True, lab
        # a stalled lab panics (then rtvirt boots it again): its kernel took the options, as it reads them back
        assert lab["stall_panics"] == {"softlockup_panic": 1, "panic_on_rcu_stall": 1, "watchdog_thresh": 30,
                                       "panic": -1, "rcu_cpu_stall_timeout": 60}, lab
        assert lab["kernel"].endswith("-amd64") and lab["qemu"].startswith("QEMU emulator version ")
        assert lab["emulator"].startswith("QEMU emulator version ")  # (this machine's QEMU, emulating the lab)
        assert detail["hypervisor"] in lab["qemu"] and detail["libvirt"] == lab["libvirt"]
        assert detail["guest"] == guest and manifest["summary"]["all"]["samples"] > 0
        assert any("nested KVM under" in w for w in manifest["system"]["warnings"])
        facts.append(_lab_build(lab, boots))
    assert _manifest(kvm_lab_campaign, "guests/kvm-linux-rt/solo/-/r1")["environment_detail"]["preempt_rt"] is True
    assert len(set(facts)) == 1  # one lab for the campaign


@pytest.mark.vm
@pytest.mark.timeout(2700)
def test_a_booted_lab_keeps_its_kernels_symbols_to_name_where_a_hung_labs_cpus_were(
        kvm_lab_campaign: tuple[Path, dict[str, Any]]) -> None:
    """The campaign's lab (nokaslr) left its kernel's text symbols beside the root image, whole: they name an
    address in its kernel as a hang's report would (tests/test_lab_cpus.py reads a real QEMU's registers)."""
    (kallsyms,) = (cache_dir() / "kvm-lab").glob("kallsyms-x86_64-*.txt")
    lines = kallsyms.read_text().splitlines()
    by_name = {line.split()[2]: int(line.split()[0], 16) for line in lines}
    assert by_name["_stext"] == 0xffffffff81000000  # where the kernel was linked: nokaslr took
    # whole: to the end of the kernel's text and of its init text (about 50,000 symbols, 2 MB)
    assert len(lines) > 40_000 and by_name["_stext"] < by_name["_etext"] < by_name["_einittext"], len(lines)
    symbols = KernelSymbols.read(kallsyms)
    assert symbols.name(by_name["default_idle"] + 0xb) == "default_idle+0xb"
    assert symbols.name(by_name["_einittext"] + 0x100000) == "not the lab kernel's"


@pytest.mark.vm
@pytest.mark.timeout(2700)
def test_rtvirts_own_qemu_runs_a_guest_under_the_labs_kvm_over_ssh(
        kvm_lab_campaign: tuple[Path, dict[str, Any]]) -> None:
    manifest = _manifest(kvm_lab_campaign, "guests/kvm-qemu/solo/-/r1")
    detail = manifest["environment_detail"]
    # QEMU started over SSH in the lab, with KVM there (nested paging); the lab's boot is the libvirt runs' own
    assert detail["host"] == "lab" and detail["acceleration"] == "kvm", detail
    libvirt_lab = _manifest(kvm_lab_campaign, "guests/kvm-linux/solo/-/r1")["environment_detail"]["kvm_lab"]
    boots: dict[int, float] = {}
    assert _lab_build(detail["kvm_lab"], boots) == _lab_build(libvirt_lab, boots), (detail["kvm_lab"], libvirt_lab)
    assert detail["kvm_host"]["accelerates"] is True, detail["kvm_host"]
    assert detail["qemu"] in libvirt_lab["qemu"]
    # the lab runs under TCG: the guest boots its kernel's ELF (a bzImage would decompress itself emulated)
    assert detail["realtime"]["kernel_file"] == "ELF (PVH entry)"
    # and through qboot, not SeaBIOS, whose device probing is nested exits there
    assert detail["realtime"]["firmware"].startswith("qboot (/usr/share/qemu/qboot.rom)"), detail["realtime"]
    # the lab's kernel took its TSC's rate from this host (tcg_clock); its KVM gives the nested guest its own
    assert_given_host_tsc_rate(detail["kvm_host"]["cmdline"])
    assert detail["realtime"]["guest_tsc"] == "the guest's own"
    assert detail["guest"] == "linux" and manifest["summary"]["all"]["samples"] > 0
    # its vCPU thread's CPU time, read in the lab while the thread lived (3 of 5 lab runs said 0.0 s before)
    assert detail["vcpu_cpu_seconds"] > 0 and detail["vcpu_cpu_seconds_after_boot"] >= 0, detail
    assert manifest["system"]["platform"]["kvm_host"]["kernel"] == libvirt_lab["kernel"]
    assert any("nested KVM under" in w for w in manifest["system"]["warnings"])


@pytest.mark.vm
@pytest.mark.timeout(2700)
def test_the_same_guest_and_stressor_on_xen_and_kvm_make_one_report_with_both_rows(
        kvm_lab_campaign: tuple[Path, dict[str, Any]]) -> None:
    results, summary = kvm_lab_campaign
    for system in ("xen", "kvm"):
        solo = _manifest(kvm_lab_campaign, f"qsort/{system}-baremetal/solo/-/r1")
        spun = _manifest(kvm_lab_campaign, f"qsort/{system}-baremetal/spin-same-core/stress-first/r1")
        assert solo["environment_detail"]["guest"] == spun["environment_detail"]["guest"] == "baremetal"
        assert [(u["stressor"], u["where"]) for u in spun["campaign"]["stressors"]] == [("cpu", "other-vm")]
    xen = _manifest(kvm_lab_campaign, "qsort/xen-baremetal/solo/-/r1")["environment_detail"]
    assert xen["where"] == "lab" and xen["applied"]["type"] == "pvh"
    report = write_report(results, results / "report.md", "markdown").read_text()
    rows = [line for line in report.splitlines() if line.startswith("|") and "qsort" in line]
    increase = [row for row in rows if "spin-same-core" in row and row.rstrip(" |").endswith(("xen-baremetal",
                                                                                              "kvm-baremetal"))]
    # the increase table: each system's spinning run against its own solo run, a row per system
    systems = {row.rstrip(" |").rsplit("|", 1)[-1].strip() for row in increase}
    assert systems == {"xen-baremetal", "kvm-baremetal"}, rows
    assert summary["scenario"] == "guest-isolation-xen-kvm"


@pytest.mark.vm
@pytest.mark.timeout(900)
def test_ctrl_c_leaves_no_lab_and_keeps_the_streamed_samples(tmp_path: Path) -> None:
    scenario = tmp_path / "long.toml"
    scenario.write_text('name = "kvm-lab-ctrl-c"\nduration = "2m"\n[workload]\nprobe = "timer"\n'
                        'params = { interval = "1ms" }\n[[environments]]\nkind = "libvirt"\nname = "lab"\n'
                        'host = "lab"\nguest = "baremetal"\n')
    results = tmp_path / "results"
    proc = subprocess.Popen([*RTVIRT, "run", "--no-report", str(scenario), "--out", str(results), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_samples(results, proc, 5_000, 600)
    (lab,) = _lab_dirs(proc.pid)
    assert _lab_qemus(lab)
    proc.send_signal(signal.SIGINT)
    try:  # the bare-metal guest writes out what it holds, the domain and the lab go: minutes under nested TCG
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"rtvirt did not end within 600 s of Ctrl-C: {proc.communicate()[1][-3000:]}")
    assert proc.returncode == 130, err[-2000:]
    assert not lab.exists() and _lab_qemus(lab) == []
    state = json.loads(next(results.glob("campaigns/*/state.json")).read_text())
    (entry,) = state["runs"].values()
    assert (results / "runs" / entry["run_id"] / "manifest.json").exists(), (entry, err[-3000:])
    manifest = load_run(results / "runs" / entry["run_id"]).manifest
    assert manifest["campaign"]["outcome"] == "interrupted" and manifest["summary"]["all"]["samples"] > 100


@pytest.mark.vm
@pytest.mark.timeout(1500)
def test_kill_9_then_resume_reclaims_the_lab_and_a_run_whose_lab_dies_is_run_again_on_a_fresh_boot(
        tmp_path: Path) -> None:
    scenario = tmp_path / "two.toml"
    scenario.write_text('name = "kvm-lab-kill"\nduration = "4s"\nrun_timeout = "10m"\n[workload]\nprobe = "timer"\n'
                        'params = { interval = "1ms" }\n'
                        '[[environments]]\nkind = "libvirt"\nname = "first"\nhost = "lab"\nguest = "baremetal"\n'
                        '[[environments]]\nkind = "libvirt"\nname = "second"\nhost = "lab"\nguest = "baremetal"\n'
                        '[[environments]]\nkind = "libvirt"\nname = "third"\nhost = "lab"\nguest = "baremetal"\n')
    results = tmp_path / "results"
    proc = subprocess.Popen([*RTVIRT, "run", "--no-report", str(scenario), "--out", str(results), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_samples(results, proc, 2_000, 600)
    (lab,) = _lab_dirs(proc.pid)
    proc.kill()
    proc.wait()
    # the lab's QEMU dies with rtvirt (PR_SET_PDEATHSIG); its directory is left for --resume to reclaim
    until = time.monotonic() + 30
    while _lab_qemus(lab) and time.monotonic() < until:
        time.sleep(0.5)
    assert _lab_qemus(lab) == [] and lab.exists()
    resumed = subprocess.Popen([*RTVIRT, "run", "--no-report", "--resume", "--out", str(results), "--no-progress",
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the resumed campaign reclaims the dead lab, boots its own and finishes the first run; once the second's
    # domain has started (its console is being read), its lab dies under it (its QEMU killed)
    deadline = time.monotonic() + 900
    while True:
        assert resumed.poll() is None and time.monotonic() < deadline, resumed.communicate()[1][-3000:]
        labs = _lab_dirs(resumed.pid)
        started = list(results.glob("runs/*second_solo*/work/console.log"))
        if labs and started:
            break
        time.sleep(0.2)
    assert not lab.exists()
    (second_lab,) = labs
    (killed_under,) = (console.parent.parent.name for console in started)
    for pid in _lab_qemus(second_lab):
        subprocess.run(["kill", "-9", str(pid)], check=False)
    # the campaign boots the lab again (minutes under nested TCG) and runs the second run again in it
    seen = {second_lab}
    while resumed.poll() is None and time.monotonic() < deadline:
        seen.update(_lab_dirs(resumed.pid))
        time.sleep(0.5)
    out, err = resumed.communicate(timeout=60)
    assert_ran(subprocess.CompletedProcess(resumed.args, resumed.returncode, out, err))
    runs = _summary(out)["runs"]
    assert all(runs[key]["status"] in RAN for key in ("first/solo/-/r1", "second/solo/-/r1", "third/solo/-/r1")), runs
    assert "again second/solo/-/r1: its lab stopped under it" in err, err[-3000:]
    # each lost attempt stays, failed, naming the lab's end (the killed one: QEMU's exit; a lab that stalled on its
    # own under this machine's load, seen in suites: its silence, or the panic its stall set off), with the dead
    # lab's console (its directory went)
    state = json.loads(next(results.glob("campaigns/*/state.json")).read_text())
    lost_ids = state["runs"]["second/solo/-/r1"]["lost"]
    assert killed_under in lost_ids, (killed_under, lost_ids)
    all_lost = [lost_id for run in state["runs"].values() for lost_id in run.get("lost", [])]
    for lost_id in all_lost:
        lost = json.loads((results / "runs" / lost_id / "manifest.json").read_text())["campaign"]
        ended = ("QEMU exited",) if lost_id == killed_under else ("it stopped answering", "the lab's kernel panicked")
        assert lost["outcome"] == "failed" and lost["platform_lost"].startswith(
            tuple(f"the KVM lab stopped: {why}" for why in ended)), lost
    console = (results / "runs" / killed_under / "work" / KvmLab.console_kept).read_text(errors="replace")
    assert "RTVIRT-KVM-LAB-READY" in console and "RTVIRT-LAB-ALIVE" in console, console[-2000:]
    # the second run's last attempt and the third ran in fresh boots, which say why the earlier ones stopped
    facts = {key: load_run(results / "runs" / runs[key]["run_id"]).manifest["environment_detail"]["kvm_lab"]
             for key in ("second/solo/-/r1", "third/solo/-/r1")}
    # (a lab that stopped under the first run, as one did in a suite of 2026-12-01, is a boot before the second's;
    # one that stopped under the third, as in that night's CI, a boot after it: the last run's boot counts them all)
    for key, fact in facts.items():
        assert fact["boot_of_campaign"] == len(fact["earlier_boots_stopped"]) + 1, (key, facts)
    stopped = facts["second/solo/-/r1"]["earlier_boots_stopped"]
    assert any("QEMU exited" in why for why in stopped), facts
    assert facts["third/solo/-/r1"]["earlier_boots_stopped"][:len(stopped)] == stopped, facts
    assert facts["third/solo/-/r1"]["boot_of_campaign"] >= len(all_lost) + 1, (facts, all_lost)
    assert len(seen) >= 2 and all(not made.exists() and _lab_qemus(made) == [] for made in seen), seen


# a VM started and ended in the lab, with the kernel's text rewrites counted meanwhile: a kprobe on the function that
# makes them, enabled beforehand (enabling it rewrites ftrace's call sites and, for the trace's record of command
# lines, the scheduler's tracepoints: 12 rewrites of its own), its kprobes not optimised (that rewrites text too)
_VM_STARTED_AND_ENDED = (
    "cd /sys/kernel/tracing && echo > trace && "
    "qemu-system-x86_64 -accel kvm -machine q35 -cpu host -m 16 -S -display none -nodefaults -daemonize "
    "-pidfile /tmp/vm.pid && sleep 3 && kill $(cat /tmp/vm.pid) && sleep 4 && grep -c ' rewrite:' trace || true")


@pytest.mark.vm
@pytest.mark.timeout(900)
def test_a_paused_vm_holds_kvms_static_keys_so_a_vms_start_and_end_rewrite_no_kernel_text() -> None:
    """The lab's key-holder VM (its init starts it, paused, for the lab's lifetime) keeps KVM's static keys at one,
    so the first VM's start and the last's end no longer rewrite kernel text (preempt_notifier_key in __schedule,
    where a lab stalled: docs/environments-kvm-lab.md). Counted in a real lab, with the holder and after it ends."""
    # one lab CPU: without the holder each VM rewrites kernel text, which under TCG can leave a second emulated CPU
    # running the text from before for good (the stall the holder prevents): this test's lab, with two, once sat
    # past 300 s in a VM's start and end once the holder was gone. One CPU never runs stale text of its own rewrite.
    with SharedResources() as shared:
        lab = open_kvm_lab(KvmLabConfig.model_validate({"accel": "tcg", "pcpus": 1}), "x86_64", shared)

        def run(script: str) -> str:
            return lab.connection.run(["sh", "-c", script], timeout=300).check(script[:60]).stdout.strip()

        holder = run("tr '\\0' ' ' < /proc/$(cat /run/rtvirt-key-holder.pid)/cmdline")
        assert holder.startswith("qemu-system-x86_64 -name rtvirt-key-holder -accel kvm ") and " -S " in holder
        run("echo 0 > /proc/sys/debug/kprobes-optimization && cd /sys/kernel/tracing && "
            "echo 'p:rewrite text_poke_bp_batch' > kprobe_events && echo 1 > events/kprobes/rewrite/enable")
        held = [int(run(_VM_STARTED_AND_ENDED)) for _ in range(2)]
        run("kill $(cat /run/rtvirt-key-holder.pid) && sleep 4")
        unheld = [int(run(_VM_STARTED_AND_ENDED)) for _ in range(2)]
    # with the holder, none; without it, the same rewrites each time (measured here: 4)
    assert held == [0, 0] and unheld[0] == unheld[1] > 0, (held, unheld)


@pytest.mark.vm
@pytest.mark.timeout(600)
def test_a_lab_that_cannot_boot_fails_its_runs_naming_why_and_keeps_the_others(tmp_path: Path) -> None:
    # ten seconds are not enough for the lab under TCG (its libvirtd alone probes QEMU for longer)
    scenario = tmp_path / "slow.toml"
    scenario.write_text('name = "kvm-lab-no-boot"\nduration = "1s"\n[workload]\nprobe = "timer"\n'
                        '[[environments]]\nkind = "host"\nname = "here"\n'
                        '[[environments]]\nkind = "libvirt"\nname = "lab1"\nhost = "lab"\n'
                        'lab = { accel = "tcg", boot_timeout = "10s" }\n'
                        '[[environments]]\nkind = "libvirt"\nname = "lab2"\nhost = "lab"\n'
                        'lab = { accel = "tcg", boot_timeout = "10s" }\n')
    result = run_cli("run", "--no-report", str(scenario), "--out", str(tmp_path / "results"), "--no-progress",
                     "--json", timeout=500)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    runs = _summary(result.stdout)["runs"]
    assert runs["here/solo/-/r1"]["status"] in RAN
    # a boot that hangs is tried again, up to the campaign's bound; then every run that needs the lab fails at
    # once, naming the last hang (the second is not booted again)
    for key in ("lab1/solo/-/r1", "lab2/solo/-/r1"):
        assert runs[key]["status"] == "failed", runs[key]
        reason = runs[key]["reason"]
        # the hung boot's console is kept where the reason says, right after what failed
        said = re.search(r"^the lab stopped (\d) times in this campaign and is not booted again; the last time: "
                         r"kvm lab: the lab did not come up within 10s \(the boot's console: (/\S+\.log)\); "
                         r"QEMU saw its CPUs \(3 looks 0.5 s apart\): CPU 0 at ", reason)
        assert said is not None and said.group(1) == str(MAX_REBOOTS + 1), reason
        # each CPU's place as QEMU saw it: an address, named where the lab's kernel symbols know it (kept from an
        # earlier boot of this lab kernel), and how busy its QEMU thread was
        # the kept console ends with that clause whole (the run's reason is bounded) and the registers QEMU dumped;
        # what the reason quotes of the console's end (if the bound kept it) is in the console before them
        kept_text = Path(said.group(2)).read_text()
        console, _, registers = kept_text.partition(CPU_DUMP_MARK)
        places = re.findall(r"CPU (\d) at (?:\d places: )?[0-9a-f]+[^;]*?, CPL \d, interrupts o(?:n|ff)(?:, halted)?, "
                            r"its QEMU thread busy \d+ %", registers.split("\n---", 1)[0])
        assert places == ["0", "1"], registers[:1000]
        assert registers.count("CPU#1") == 3 and re.search(r"[RE]IP=[0-9a-f]+", registers), kept_text[-2000:]
        kept = " ".join(console.split())  # (a run's reason has its spaces collapsed)
        quoted = re.search(r"; console: (.*?)(?:\.\.\.)?$", reason)
        lines = [] if quoted is None or quoted.group(1) == "empty" else quoted.group(1).split(" | ")
        assert [line for line in lines[:-1] if line not in kept] == [], kept  # (the last line may be cut)


@pytest.mark.vm
@pytest.mark.quiet  # as the lab campaign (conftest.py QUIET_FIXTURES): 77-119 s here, 231-267 s beside the others
@pytest.mark.timeout(1500)
def test_a_libvirt_domain_in_the_lab_is_explained_by_the_labs_vm_and_kvm_layers(tmp_path: Path) -> None:
    """A libvirt domain over qemu+ssh:// in the lab, explained: the lab's tracefs over SSH (VM and KVM layers), the
    clock exchange on a pipe channel whose host half runs in the lab, and a same-core SCHED_FIFO 50 task run in
    the lab (not on this machine) on the vCPU's pCPU, named as what ran while the vCPU did not."""
    scenario = tmp_path / "explained.toml"
    scenario.write_text('''name = "libvirt-lab-explained"
duration = "3s"
run_timeout = "15m"
[workload]
probe = "timer"
params = { interval = "1ms" }
[[environments]]
kind = "libvirt"
name = "lab-kvm"
host = "lab"
vcpu_sched = { policy = "fifo", priority = 1 }
boot_timeout = "10m"
''' + FIFO_TASK_ON_THE_VCPUS_PCPU + '''
[explain]
threshold = "1ms"
layers = ["vm", "kvm"]
''')
    results = tmp_path / "results"
    result = run_cli("run", "--no-report", str(scenario), "--out", str(results), "--no-progress", timeout=1400)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    (run_dir,) = (results / "runs").iterdir()
    manifest = load_run(run_dir).manifest
    detail = manifest["environment_detail"]
    assert manifest["status"] in RAN, manifest["campaign"]  # (short: the periods a starved vCPU's probe missed)
    assert detail["domain_type"] == "kvm" and detail["kvm_lab"]["kvm_module"] == "kvm-amd", detail["kvm_lab"]
    # the clock port is a pipe channel: its FIFOs are in the lab, its host half ran there
    assert re.search(r"<channel type='pipe'>\s*<source path='/tmp/rtvirt-clock\.\w{8}/clock'/>\s*"
                     r"<target type='virtio' name='rtvirt\.clock'", detail["domain_xml"]), detail["domain_xml"]
    assert manifest["explain"]["layers"] == {"vm": "seen", "kvm": "seen"}, manifest["explain"]

    explained = json.loads(run_cli("explain", str(run_dir), "--json", check=True).stdout)
    layers = {layer["layer"]: layer for layer in explained["layers"]}
    assert any(note.startswith("guest clock aligned at start and end") for note in layers["vm"]["notes"]), \
        layers["vm"]["notes"]
    # the stressor ran in the lab: the lab's trace names it on the vCPU's pCPU, at its policy and priority
    exits = fifo_task_named_and_exits_counted(explained)
    assert {"hlt", "msr"} <= set(exits) and exits["hlt"]["reason"] == "HLT", sorted(exits)


@pytest.mark.parametrize(("table", "path", "message"), [
    # a host is local, lab, user@host[:port] or an ~/.ssh/config alias: nothing a shell or ssh would read
    ('host = "cloud; reboot"', "environments[0].host", "String should match pattern"),
    ('host = "-oProxyCommand=x"', "environments[0].host", "String should match pattern"),
    ('host = "lab"\nuri = "qemu:///system"', "environments[0]", "give either host or uri"),
    ('lab = { pcpus = 2 }', "environments[0]", 'add host = "lab"'),
    ('host = "lab"\nlab = { pcpus = 0 }', "environments[0].lab.pcpus", "greater than or equal to 1"),
    ('host = "lab"\nlab = { arch = "aarch64" }', "environments[0].lab.arch", "Extra inputs are not permitted"),
    ('host = "lab"\narch = "mips"', "environments[0].arch", "'x86_64' or 'aarch64'"),
    ('host = "lab"\nssh = { connect_timeout = 5 }', "environments[0]", 'ssh is for host = "user@host[:port]"'),
    ('ssh = { proxy_jump = "a;b" }', "environments[0].ssh.proxy_jump", "String should match pattern"),
])
def test_malformed_host_and_lab_tables_are_rejected_with_their_field_path(table: str, path: str,
                                                                        message: str) -> None:
    text = f'name = "bad"\nduration = "1s"\n[workload]\nprobe = "timer"\n[[environments]]\nkind = "libvirt"\n{table}\n'
    with pytest.raises(InputError) as error:
        parse_scenario(text)
    assert path in str(error.value) and message in str(error.value)


def test_a_libvirt_kvm_host_over_ssh_is_reached_by_rtvirts_link_with_its_ssh_options() -> None:
    """host = "user@host" of the libvirt kind: one SSH link per host and campaign, made with the environment's
    ``ssh`` options (the tests of test_env_libvirt.py use it for real, over a local sshd)."""
    from rtvirt.environments import SharedResources
    from rtvirt.environments.libvirt.reach import host_link, libvirtd_of

    scenario = parse_scenario('name = "ok"\nduration = "1s"\n[workload]\nprobe = "timer"\n[[environments]]\n'
                              'kind = "libvirt"\nhost = "root@bench-kvm:2222"\n'
                              'ssh = { known_hosts = "/etc/bench/known_hosts", proxy_jump = "me@gate" }\n')
    (env,) = scenario.environments
    with SharedResources() as shared:
        link = host_link(env, shared)
        assert link is not None and not env.local
        assert (link.target.user, link.target.host, link.target.port) == ("root", "bench-kvm", 2222)
        assert str(link.target.known_hosts) == "/etc/bench/known_hosts" and link.target.proxy_jump == "me@gate"
        forwarded = libvirtd_of(env, shared)
        assert forwarded is not None and forwarded.link is link  # nothing connects before a domain needs it
        assert forwarded.place() == "root@bench-kvm:2222:/run/libvirt/libvirt-sock (over rtvirt's SSH)"


@pytest.mark.parametrize("kind", ["libvirt", "qemu"])
def test_disturbing_guests_run_in_the_measured_guests_lab(kind: str, tmp_path: Path) -> None:
    """The key of the lab a disturbing guest opens is its measured guest's: a lab table re-read from a Python dump
    read its boot timeout (5 minutes, held in ns) as 3e11 seconds, so the COTS study's TP5/TP6 KVM rows booted a
    second lab beside the first for their disturbing guests."""
    from rtvirt.environments import ENVIRONMENTS, SharedResources
    from rtvirt.environments.qemu.config import QemuConfig
    from rtvirt.procs import Supervisor

    if kind == "libvirt":  # the COTS study's own
        scenario = parse_scenario(builtin_scenarios()["cots-hypervisor"], "cots-hypervisor.toml")
        measured: Any = next(env for env in scenario.environments if env.kind == "libvirt" and env.host == "lab")
    else:
        measured = QemuConfig.model_validate({"kind": "qemu", "name": "rt", "host": "lab", "memory": 1024,
                                              "lab": {"memory": 4608, "boot_timeout": "7m"}})
    with Supervisor() as supervisor, SharedResources() as shared:
        disturbing: Any = ENVIRONMENTS[kind](measured, supervisor, tmp_path, shared).stressor_guest(1, (0,))
    assert disturbing.config.lab == measured.lab
    assert disturbing.config.lab.key(disturbing.config.arch) == measured.lab.key(measured.arch)
