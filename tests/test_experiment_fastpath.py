"""The experiment's fast ``shared`` path (experiment/fastpath.py) against the whole-model path (configure_model +
analyse_model, what `rtvirt analyze` runs): the same verdict and every task's response bound to the nanosecond,
on random systems of every scheduler the fast path answers, fp and EDF guests, implicit and constrained
deadlines, with and without switch overheads, 2 VMs per pCPU and one VM per pCPU."""

from __future__ import annotations

import json

import pytest

from rtvirt.analysis.design import DESIGNABLE, configure_model
from rtvirt.experiment.fastpath import FAST_SCHEDULERS, fast_shared
from rtvirt.experiment.questions import run_chunk, shared_interfaces
from rtvirt.experiment.spec import parse_experiment
from rtvirt.experiment.systems import draw_plain, system_model


def _plan(guest: str, pcpus: int, overheads: bool, schedulers: list[str]):  # type: ignore[no-untyped-def]
    return parse_experiment({
        "name": "fast", "seed": 11,
        "grid": {"utilization": [0.3, 0.6, 0.8, 0.95], "vms": 4, "tasks_per_vm": [3, 5], "pcpus": pcpus,
                 "guest_scheduler": guest, "deadlines": ["implicit", "constrained"]},
        "questions": {"schedulers": schedulers, "context_switch": "4us" if overheads else 0,
                      "vm_switch": "15us" if overheads else 0}}, "fast")


@pytest.mark.parametrize(("guest", "pcpus", "overheads"),
                         [("fp", 2, False), ("fp", 2, True), ("fp", 4, True), ("edf", 2, True), ("edf", 4, False)])
def test_fast_path_equals_whole_model_analysis(guest: str, pcpus: int, overheads: bool) -> None:
    labels = sorted(FAST_SCHEDULERS - ({"partitioned"} if pcpus < 4 else set()))
    assert set(DESIGNABLE) - FAST_SCHEDULERS == {"arinc653"}
    plan = _plan(guest, pcpus, overheads, labels)
    compared = accepted = 0
    for point in plan.points():
        for index in range(3 if guest == "edf" else 6):
            system = draw_plain(plan.seed, point, index)
            model = system_model(system, point, index, plan.questions)
            interfaces = shared_interfaces(system, point.server_period, point.spare)
            given = [i for i in interfaces if i is not None]
            assert len(given) == point.vms
            shared = {(f"vm{vm}", 0): i for vm, i in enumerate(given)}
            for label in labels:
                fast = fast_shared(label, system, given, guest, plan.questions.context_switch,
                                   plan.questions.vm_switch)
                whole = configure_model(model, label, shared)
                assert fast is not None and whole.analysis is not None
                expected = {(r.vm, r.task): r.wcrt for r in whole.analysis.tasks}
                got = {(f"vm{vm}", f"t{vm + k * point.vms}"): bound
                       for vm, bounds in enumerate(fast.bounds) for k, bound in enumerate(bounds)}
                assert got == expected, (label, point, index)
                assert fast.accepted == whole.schedulable, (label, point, index)
                quick = fast_shared(label, system, given, guest, plan.questions.context_switch,
                                    plan.questions.vm_switch, verdict_only=True)
                assert quick is not None and quick.accepted == whole.schedulable, (label, point, index)
                compared += 1
                accepted += fast.accepted
    # both verdicts occur, so the comparison covers accepted and rejected systems
    assert 0 < accepted < compared


def test_fast_records_equal_whole_model_records() -> None:
    """run_chunk's records (what the store gets) are the same with the fast path on and off, arinc653 (answered
    by the whole model either way) included."""
    plan = _plan("fp", 2, True, sorted(DESIGNABLE.keys() - {"partitioned"}))
    document = json.dumps(plan.model_dump(mode="json"))
    for point in (0, 5, 12):
        assert run_chunk(document, point, 0, 6, fast=True) == run_chunk(document, point, 0, 6, fast=False)
