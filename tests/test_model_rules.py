"""The model's cross-field rules (model/loader.py check_model): each broken rule is refused naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from rtvirt.errors import InputError
from rtvirt.model import model_from_dict


def _model(scheduler: str = "fifo", vcpus: list[dict[str, Any]] | None = None,
           tasks: list[dict[str, Any]] | None = None, **more: Any) -> dict[str, Any]:
    """A one-VM model on two pCPUs whose pieces each case replaces."""
    hypervisor = {"scheduler": scheduler, "pcpus": 2} | more.pop("hypervisor", {})
    vm = {"name": "rt", "vcpu": vcpus or [{}], "task": tasks if tasks is not None else
          [{"name": "ctl", "period": "5ms", "execution": "1ms"}]} | more.pop("vm", {})
    return {"hypervisor": hypervisor, "vm": [vm, *more.pop("others", [])], **more}


CASES = {
    "arinc653 without its table": (_model("arinc653"), "hypervisor.arinc653", "needs [hypervisor.arinc653]"),
    "a tick outside deadline": (_model(hypervisor={"enforcement": {"tick": "4ms"}}), "hypervisor.enforcement.tick",
                                "only the deadline scheduler"),
    "a phase past the tick": (_model("deadline", hypervisor={"enforcement": {"tick": "4ms", "phase": "4ms"}}),
                              "hypervisor.enforcement.phase", "shorter than the tick"),
    "a VM name twice": (_model(others=[{"name": "rt"}]), "vm[1].name", "'rt' is used twice"),
    "a CPU past pcpus": (_model(vcpus=[{"affinity": [3]}]), "vm[0].vcpu[0].affinity", "CPU 3 does not exist"),
    "partitioned, two CPUs": (_model("partitioned", vcpus=[{"affinity": [0, 1]}]), "vm[0].vcpu[0].affinity",
                              "exactly one CPU per vCPU"),
    "partitioned, one CPU twice": (_model("partitioned", vcpus=[{"affinity": [1]}, {"affinity": [1]}]),
                                   "vm[0].vcpu[1].affinity", "CPU 1 already belongs to vm[0].vcpu[0]"),
    "a server without budget": (_model(hypervisor={"server": "deferrable"}, vcpus=[{"period": "5ms"}]),
                                "vm[0].vcpu[0]", "the deferrable server needs budget and period"),
    "sedf without slice": (_model("sedf", vcpus=[{"period": "5ms"}]), "vm[0].vcpu[0].slice",
                           "the sedf scheduler needs slice"),
    "budget over period": (_model(vcpus=[{"budget": "6ms", "period": "5ms"}]), "vm[0].vcpu[0].budget",
                           "budget is larger than period"),
    "slice over period": (_model(vcpus=[{"slice": "6ms", "period": "5ms"}]), "vm[0].vcpu[0].slice",
                          "slice is larger than period"),
    "a zero period": (_model(vcpus=[{"period": 0}]), "vm[0].vcpu[0].period", "period must be larger than 0"),
    "an RTDS budget under 10 us": (_model("rtds", vcpus=[{"budget": "5us", "period": "1ms"}]),
                                   "vm[0].vcpu[0].budget", "at least 10us"),
    "deadline runtime without period": (_model("deadline", vcpus=[{"runtime": "1ms"}]), "vm[0].vcpu[0].period",
                                        "needs period with runtime"),
    "deadline past period": (_model("deadline", vcpus=[{"runtime": "1ms", "deadline": "6ms", "period": "5ms"}]),
                             "vm[0].vcpu[0]", "runtime <= deadline <= period"),
    "a window past the frame": (_model("arinc653", hypervisor={"arinc653": {"major_frame": "10ms"}},
                                       vcpus=[{"affinity": [0], "windows": [{"start": "8ms", "length": "3ms"}]}]),
                                "vm[0].vcpu[0].windows[0]", "ends after the major frame"),
    "windows overlapping on a CPU": (_model("arinc653", hypervisor={"arinc653": {"major_frame": "10ms"}},
                                            vcpus=[{"affinity": [0], "windows": [{"start": 0, "length": "3ms"}]},
                                                   {"affinity": [0], "windows": [{"start": "2ms", "length": "1ms"}]}]),
                                     "vm[0].vcpu[1].windows[0]", "overlaps another window on CPU 0"),
    "a task name twice": (_model(tasks=[{"name": "a", "period": "5ms", "execution": "1ms"}] * 2),
                          "vm[0].task[1].name", "'a' is used twice in VM 'rt'"),
    "a task on a missing vCPU": (_model(tasks=[{"name": "a", "vcpu": 1, "period": "5ms", "execution": "1ms"}]),
                                 "vm[0].task[0].vcpu", "has 1 vCPU(s)"),
    "periodic without period": (_model(tasks=[{"name": "a", "execution": "1ms"}]), "vm[0].task[0].period",
                                "needs a period larger than 0"),
    "sporadic without interarrival": (_model(tasks=[{"name": "a", "type": "sporadic", "execution": "1ms"}]),
                                      "vm[0].task[0].min_interarrival", "needs min_interarrival"),
    "sporadic, max below min": (_model(tasks=[{"name": "a", "type": "sporadic", "min_interarrival": "5ms",
                                               "max_interarrival": "4ms", "execution": "1ms"}]),
                                "vm[0].task[0].max_interarrival", "below min_interarrival"),
    "sporadic with a period": (_model(tasks=[{"name": "a", "type": "sporadic", "min_interarrival": "5ms",
                                              "period": "5ms", "execution": "1ms"}]),
                               "vm[0].task[0].period", "uses min_interarrival, not period"),
    "an event task with a period": (_model(tasks=[{"name": "a", "type": "event", "period": "5ms",
                                                   "execution": "1ms"}],
                                           chain=[{"name": "c", "period": "5ms", "stages": ["rt/a"]}]),
                                    "vm[0].task[0].period", "released by its chain"),
    "a zero execution": (_model(tasks=[{"name": "a", "period": "5ms", "execution": 0}]), "vm[0].task[0].execution",
                         "execution time must be larger than 0"),
    "execution min over max": (_model(tasks=[{"name": "a", "period": "5ms", "execution": {
        "distribution": "uniform", "min": "2ms", "max": "1ms"}}]), "vm[0].task[0].execution", "0 < min <= max"),
    "normal without stdev": (_model(tasks=[{"name": "a", "period": "5ms", "execution": {
        "distribution": "normal", "min": "1ms", "max": "2ms", "mean": "1500us"}}]), "vm[0].task[0].execution",
        "needs mean and stdev"),
    "a gap on a missing vCPU": (_model(vm={"gap": {"vcpu": 2}}), "vm[0].gap.vcpu", "has 1 vCPU(s)"),
    "a stage that is no event task": (_model(chain=[{"name": "c", "period": "5ms", "stages": ["rt/ctl"]}]),
                                      "chain[0].stages[0]", "'rt/ctl' is not an event task"),
    "a stage in two chains": (_model(tasks=[{"name": "a", "type": "event", "execution": "1ms"}],
                                     chain=[{"name": "c", "period": "5ms", "stages": ["rt/a"]},
                                            {"name": "d", "period": "5ms", "stages": ["rt/a"]}]),
                              "chain[1].stages[0]", "already a stage of a chain"),
    "an event task in no chain": (_model(tasks=[{"name": "a", "type": "event", "execution": "1ms"}]),
                                  "vm[0].task[0].type", "'rt/a' is not a stage of any chain"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_broken_rule_is_refused_naming_its_field(case: str) -> None:
    data, field, message = CASES[case]
    with pytest.raises(InputError) as refused:
        model_from_dict(data)
    assert f"{field}: " in str(refused.value) and message in str(refused.value), str(refused.value)


def test_a_model_keeping_every_rule_is_accepted() -> None:
    model = model_from_dict(_model("arinc653", hypervisor={"arinc653": {"major_frame": "10ms"}},
                                   vcpus=[{"affinity": [0], "windows": [{"start": 0, "length": "3ms"}]},
                                          {"affinity": [0], "windows": [{"start": "3ms", "length": "2ms"}]}],
                                   tasks=[{"name": "a", "type": "event", "execution": "1ms"},
                                          {"name": "b", "vcpu": 1, "type": "sporadic", "min_interarrival": "5ms",
                                           "execution": "1ms"}],
                                   chain=[{"name": "c", "period": "5ms", "stages": ["rt/a"]}]))
    assert [vcpu.windows[0].start for vcpu in model.vm[0].vcpu] == [0, 3_000_000]
