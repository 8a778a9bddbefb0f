"""``rtvirt design``: budget search, emitted configuration, and the command."""

from __future__ import annotations

import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from conftest import run_cli

from rtvirt.analysis.deploy import kvm_script, libvirt_cputune, model_toml, scenario_toml, xen_commands
from rtvirt.analysis.design import design_model
from rtvirt.analysis.system import analyse_model
from rtvirt.model import model_from_dict
from rtvirt.scenario.loader import parse_scenario

US = 1_000


def two_vms(scheduler: str = "fifo") -> Any:
    return model_from_dict({
        "name": "pair",
        "hypervisor": {"scheduler": scheduler, "pcpus": 2},
        "vm": [{"name": "ctl", "vcpu": [{"affinity": [1]}],
                "task": [{"name": "loop", "period": "1ms", "execution": "100us", "priority": 2}]},
               {"name": "log", "vcpu": [{"affinity": [1]}],
                "task": [{"name": "write", "period": "10ms", "execution": "1ms"}]},
               {"name": "web", "vcpu": [{"affinity": [1]}], "load": 0.8}]})


def test_rtds_design_finds_the_smallest_budget() -> None:
    design = design_model(two_vms(), "rtds")
    assert design.schedulable and design.model is not None
    ctl = next(v for v in design.vcpus if v.vm == "ctl")
    assert ctl.budget is not None and ctl.period is not None and ctl.period <= 1000 * US
    # Γ(250 us, 34 us): blackout 432 us, then ⌈100/34⌉ = 3 budgets: 432 + 2·250 + 32 = 964 us <= 1 ms;
    # with 33 us the fourth budget is needed (1185 us). The search lands exactly on the edge.
    assert (ctl.budget, ctl.period) == (34 * US, 250 * US)

    def with_budget(budget: int) -> bool:
        vms = [vm.model_copy(update={"vcpu": [vm.vcpu[0].model_copy(update={"budget": budget})]})
               if vm.name == "ctl" else vm for vm in design.model.vm]
        analysis = analyse_model(design.model.model_copy(update={"vm": vms}))
        return next(t for t in analysis.tasks if t.vm == "ctl").schedulable

    assert with_budget(ctl.budget) and not with_budget(ctl.budget - US)
    web = next(v for v in design.vcpus if v.vm == "web")
    assert not web.realtime and "extratime" in web.note


def test_infeasible_designs_say_why() -> None:
    overloaded = model_from_dict({
        "hypervisor": {"scheduler": "fifo", "pcpus": 1},
        "vm": [{"name": f"v{i}", "vcpu": [{"affinity": [0]}],
                "task": [{"name": "t", "period": "1ms", "execution": "600us"}]} for i in range(2)]})
    design = design_model(overloaded, "deadline")
    assert not design.schedulable
    assert any("over-subscribed" in p or "no budget" in p for p in design.problems)
    partitioned = design_model(overloaded, "partitioned")
    assert not partitioned.schedulable and "one pCPU per vCPU" in partitioned.problems[0]


def test_emitted_configuration() -> None:
    model = two_vms()
    rtds = design_model(model, "rtds")
    ctl = next(v for v in rtds.vcpus if v.vm == "ctl")
    xen = xen_commands(rtds)
    assert f"xl sched-rtds -d ctl -v 0 -p {ctl.period // US} -b {ctl.budget // US}" in xen
    assert "xl vcpu-pin ctl 0 1" in xen and "xl cpupool-create" in xen and "-e 1" in xen
    deadline = design_model(model, "deadline")
    d_ctl = next(v for v in deadline.vcpus if v.vm == "ctl")
    script = kvm_script(deadline)
    assert (f"chrt --deadline --sched-runtime {d_ctl.budget} --sched-deadline {d_ctl.period} "
            f"--sched-period {d_ctl.period} -p 0") in script
    fifo = design_model(model, "fifo-periodic")
    tune = ET.fromstring(libvirt_cputune(fifo, "ctl"))
    assert tune.tag == "cputune"
    assert tune.find("vcpupin").attrib == {"vcpu": "0", "cpuset": "1"}
    assert tune.find("vcpusched").attrib["scheduler"] == "fifo"
    # ctl's server period (250us) is below libvirt's vcpu_period minimum, which libvirt drops silently
    assert tune.find("vcpu_quota") is None and "vcpu_period minimum" in libvirt_cputune(fifo, "ctl")
    log_tune = ET.fromstring(libvirt_cputune(fifo, "log"))
    assert int(log_tune.findtext("vcpu_period") or 0) >= 1000 and int(log_tune.findtext("vcpu_quota") or 0) > 0
    assert "chrt -f -p 90" in kvm_script(fifo) and "cpu.max" in kvm_script(fifo)
    # The scenario validates against the scenario schema; the designed model round-trips exactly.
    scenario = parse_scenario(scenario_toml(deadline, model))
    assert scenario.environments[0].vcpu_sched.policy == "deadline"
    assert scenario.environments[0].vcpu_sched.runtime == d_ctl.budget
    assert model_from_dict(tomllib.loads(model_toml(deadline.model))) == deadline.model


def test_design_cli(tmp_path: Path, results_dir: Path) -> None:
    path = tmp_path / "pair.toml"
    path.write_text(model_toml(two_vms()))
    out = tmp_path / "configs"
    result = run_cli("design", str(path), "-s", "rtds", "-s", "deadline", "--out", str(out),
                     "--results", str(results_dir), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["proven"] == ["rtds", "deadline"]
    assert sorted(p.name for p in (out / "rtds").iterdir()) == sorted(
        ["xen.sh", "kvm.sh", "libvirt-ctl.xml", "libvirt-log.xml", "libvirt-web.xml", "scenario.toml",
         "scenario-libvirt.toml", "pair-rtds.toml"])
    assert "scenario-libvirt.toml" not in {p.name for p in (out / "deadline").iterdir()}
    manifest = json.loads((Path(document["path"]) / "manifest.json").read_text())
    assert manifest["source"] == "analysis" and manifest["analysis"]["kind"] == "design"
    assert all(t["schedulable"] for t in manifest["analysis"]["tasks"])
    # The designed model is a model file: `rtvirt analyze` proves it.
    again = run_cli("analyze", str(out / "rtds" / "pair-rtds.toml"), "--results", str(results_dir), "--strict")
    assert again.returncode == 0, again.stdout + again.stderr
    bad = run_cli("design", str(path), "-s", "nonsense", "--results", str(results_dir))
    assert bad.returncode == 2 and "nonsense" in bad.stderr


def test_design_and_analyze_agree_on_a_psedf_models_own_parameters() -> None:
    """esc-psedf.toml under PSEDF: the search, one vCPU at a time, proves no budget for every wheel (the holistic
    chain analysis has no bound below the driver's deferrable server), while the whole model's phased-chain
    analysis proves the model's own slices; design used to say "not proven" where analyze said every deadline
    is met."""
    from rtvirt.model import load_model

    model = load_model(Path(__file__).parent.parent / "examples" / "models" / "esc-psedf.toml")
    analysed = analyse_model(model)
    assert analysed.schedulable and all(task.schedulable for task in analysed.tasks)
    design = design_model(model, "psedf")
    assert design.schedulable, design.problems
    own = {(v.vm, v.vcpu): v for v in design.vcpus if v.note.startswith("the model's own")}
    assert {vm.name for vm in model.vm if any(t for t in vm.task)} == {name for name, _ in own}
    for vm in model.vm:
        if (vm.name, 0) in own:
            assert own[(vm.name, 0)].budget == vm.vcpu[0].slice and own[(vm.name, 0)].period == vm.vcpu[0].period
    # a scheduler the model does not run still gets only what its search proves
    assert all(not v.note.startswith("the model's own") for v in design_model(model, "sedf").vcpus)
