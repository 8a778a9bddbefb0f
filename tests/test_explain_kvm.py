"""The KVM layer (explain.kvm) on stretches of a real trace: Debian 6.1's kvm-amd nested under TCG
(tests/kvm_host.py) running a Linux guest's timer probe beside a SCHED_FIFO stressor on the vCPU's pCPU. Its exits
are named by one table for both vendors, a halt is cut where its LAPIC timer fired, the VM layer's "vCPU not
running" wins inside an exit, and exits are counted per reason (the kernel's own histogram where it has one)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import FIFO_TASK_ON_THE_VCPUS_PCPU, RAN, fifo_task_named_and_exits_counted, run_cli
from kvm_host import NestedKvmHost

from rtvirt.explain.attribute import WINDOW, attribute
from rtvirt.explain.kvm import (
    exit_name,
    exit_statistics,
    exit_symbols,
    hist_counts,
    kvm_occupancies,
    read_kvm_events,
)
from rtvirt.explain.model import LayerTrace
from rtvirt.explain.tracefs import parse_trace
from rtvirt.explain.vm import VmThreads, read_events, vcpu_occupancies
from rtvirt.remote import connect
from rtvirt.store import load_run

VCPU_TID, QEMU_PID = 209, 203

# an interrupt exit (the guest's LAPIC timer, vector 236) during which the stressor's FIFO 50 worker took the
# vCPU's pCPU for 12.8 ms, then the interrupt is injected and the vCPU enters the guest
PREEMPTED = """\
       CPU 0/KVM-209     (    203) [001] d.... 303.420572: hrtimer_expire_entry: hrtimer=0000000050a58ab6 function=apic_timer_fn [kvm] now=303420557970
       CPU 0/KVM-209     (    203) [001] d.... 303.420729: kvm_exit: vcpu 0 reason interrupt rip 0xffffffff81a487a2 info1 0x0000000000000000 info2 0x0000000000000000 intr_info 0x00000000 error_code 0x00000000
       CPU 0/KVM-209     (    203) [001] d.... 303.420762: kvm_apic_accept_irq: apicid 0 vec 236 (Fixed|edge)
       CPU 0/KVM-209     (    203) [001] d.... 303.420862: sched_switch: prev_comm=CPU 0/KVM prev_pid=209 prev_prio=98 prev_state=R ==> next_comm=rtvirt-stress next_pid=232 next_prio=49
   rtvirt-stress-232     (    230) [001] d.... 303.433700: sched_switch: prev_comm=rtvirt-stress prev_pid=232 prev_prio=49 prev_state=S ==> next_comm=CPU 0/KVM next_pid=209 next_prio=98
       CPU 0/KVM-209     (    203) [001] d.... 303.433854: kvm_inj_virq: IRQ 0xec
       CPU 0/KVM-209     (    203) [001] d.... 303.433905: kvm_entry: vcpu 0, rip 0xffffffff81a487a2
       CPU 0/KVM-209     (    203) [001] d.... 303.433918: kvm_wait_lapic_expire: vcpu 0: delta 89932207 (late)
       CPU 0/KVM-209     (    203) [001] d.... 303.434183: kvm_exit: vcpu 0 reason msr rip 0xffffffff8107e914 info1 0x0000000000000001 info2 0x0000000000000000 intr_info 0x000000ec error_code 0x00000000
       CPU 0/KVM-209     (    203) [001] d.... 303.434250: kvm_entry: vcpu 0, rip 0xffffffff8107e916
"""
# a halt: the vCPU's thread sleeps, ksoftirqd runs, the LAPIC timer fires, and 3.7 ms later the vCPU enters
HALTED = """\
       CPU 0/KVM-209     (    203) [001] d.... 287.218392: kvm_exit: vcpu 0 reason hlt rip 0xffffffff81a592ea info1 0x0000000000000000 info2 0x0000000000000000 intr_info 0x00000000 error_code 0x00000000
       CPU 0/KVM-209     (    203) [001] d.... 287.222970: sched_switch: prev_comm=CPU 0/KVM prev_pid=209 prev_prio=98 prev_state=S ==> next_comm=ksoftirqd/1 next_pid=21 next_prio=120
     ksoftirqd/1-21      (     21) [001] d.... 287.223038: hrtimer_expire_entry: hrtimer=00000000b4183b2f function=tick_sched_timer now=287223032900
     ksoftirqd/1-21      (     21) [001] d.... 287.223101: hrtimer_expire_entry: hrtimer=0000000050a58ab6 function=apic_timer_fn [kvm] now=287223032900
     ksoftirqd/1-21      (     21) [001] d.... 287.226764: sched_switch: prev_comm=ksoftirqd/1 prev_pid=21 prev_prio=120 prev_state=R ==> next_comm=CPU 0/KVM next_pid=209 next_prio=98
       CPU 0/KVM-209     (    203) [001] d.... 287.226952: kvm_vcpu_wakeup: wait time 8404010 ns, polling valid
       CPU 0/KVM-209     (    203) [001] d.... 287.226967: kvm_apic_accept_irq: apicid 0 vec 236 (Fixed|edge)
       CPU 0/KVM-209     (    203) [001] d.... 287.227072: kvm_inj_virq: IRQ 0xec
       CPU 0/KVM-209     (    203) [001] d.... 287.227105: kvm_entry: vcpu 0, rip 0xffffffff81a592eb
       CPU 0/KVM-209     (    203) [001] d.... 287.227116: kvm_wait_lapic_expire: vcpu 0: delta -474073 (early)
"""
US = 1000


def _events(text: str) -> list:  # type: ignore[type-arg]
    return list(parse_trace(text.splitlines()))


def test_exit_reasons_of_intel_and_amd_have_one_name() -> None:
    assert exit_name("intr")[0] == exit_name("interrupt")[0] == exit_name("EXTERNAL_INTERRUPT")[0] \
        == "EXTERNAL_INTERRUPT"
    assert exit_name("hlt")[0] == exit_name("HLT")[0] == "HLT"
    assert exit_name("npf")[0] == exit_name("EPT_VIOLATION")[0] == "EPT_VIOLATION"
    assert exit_name("msr")[0] == exit_name("MSR_WRITE")[0] == "MSR"
    assert exit_name("io")[0] == "IO_INSTRUCTION" and exit_name("vintr")[0] == "INTERRUPT_WINDOW"
    assert exit_name("pause")[0] == exit_name("PAUSE_INSTRUCTION")[0] == "PAUSE_INSTRUCTION"
    assert exit_name("PF excp") == ("EXCEPTION_NMI", "a #PF exception in the guest")
    assert exit_name("vmgexit")[0] == "VMGEXIT"  # unknown: its own name, uppercased


def test_an_exit_preempted_by_a_fifo_task_is_the_exit_around_what_the_vm_layer_names() -> None:
    events = _events(PREEMPTED)
    trace = read_kvm_events(events)
    found = kvm_occupancies(trace, {0: VCPU_TID})
    interrupt, msr = found
    assert interrupt.cause == "vCPU exited for EXTERNAL_INTERRUPT (interrupt)" and interrupt.kind == "vm-exit"
    assert interrupt.duration_ns == 13_176 * US
    assert interrupt.detail["injected"] == "236" and interrupt.detail["accepted_vectors"] == "236"
    assert interrupt.detail["lapic_expire_delta_tsc"] == "89932207"  # traced after its entry: still its own
    assert msr.cause == "vCPU exited for MSR (msr)" and "lapic_expire_delta_tsc" not in msr.detail
    # with the VM layer, which outranks it: the window reads exit, then the stressor, then the exit again
    vm = vcpu_occupancies(read_events(events), VmThreads("guest", {0: VCPU_TID}, QEMU_PID))
    window = np.array([(interrupt.start_ns, interrupt.end_ns, 0, interrupt.duration_ns)], dtype=WINDOW)
    explained = attribute(window, [LayerTrace("vm", True, occupancies=vm), LayerTrace("kvm", True, occupancies=found)],
                          threshold_ns=0, threshold_rule="test", outliers=1)
    parts = [(part.layer, part.cause, part.duration_ns // US) for part in explained.parts]
    assert parts == [("kvm", "vCPU exited for EXTERNAL_INTERRUPT (interrupt)", 133),
                     ("vm", "vCPU not running: rtvirt-stress/232 ran", 12_838),
                     ("kvm", "vCPU exited for EXTERNAL_INTERRUPT (interrupt)", 205)]
    assert sum(duration for _, _, duration in parts) == interrupt.duration_ns // US


def test_a_halt_is_cut_where_its_lapic_timer_fired() -> None:
    trace = read_kvm_events(_events(HALTED))
    asleep, woken = kvm_occupancies(trace, {0: VCPU_TID})
    assert asleep.cause == "vCPU halted (hlt): its timer had not fired" and asleep.kind == "vcpu-halted"
    assert woken.cause == "vCPU halted (hlt): back in the guest after its timer fired" and woken.kind == "timer-wake"
    assert asleep.end_ns == woken.start_ns == 287_223_101 * US
    assert woken.detail["after_timer_ns"] == woken.duration_ns == 4_004 * US
    assert woken.detail["halt"] == "wait 8404010" and woken.detail["lapic_expire_delta_tsc"] == "-474073"
    # a halt whose timer never fired on its pCPU is woken by what the LAPIC accepted
    trace.timers.clear()
    (halt,) = kvm_occupancies(trace, {0: VCPU_TID})
    assert halt.cause == "vCPU halted (hlt) (woken by vector 236)" and halt.duration_ns == 8_713 * US


def test_exits_are_not_paired_across_a_stretch_the_recorder_did_not_keep() -> None:
    trace = read_kvm_events(_events(PREEMPTED))
    trace.resumes = {1: [303_425_000 * US]}  # the kept trace resumes inside the first exit
    assert [o.detail["raw_reason"] for o in kvm_occupancies(trace, {0: VCPU_TID})] == ["msr"]


def test_exits_are_counted_and_timed_per_reason_and_the_kernels_count_wins() -> None:
    trace = read_kvm_events(_events(PREEMPTED + HALTED))
    rows = {row["raw_reason"]: row for row in exit_statistics(trace, {0: VCPU_TID}, None)}
    assert set(rows) == {"interrupt", "msr", "hlt"}
    assert rows["interrupt"]["count"] == rows["interrupt"]["timed"] == 1
    assert rows["interrupt"]["total_ns"] == rows["interrupt"]["max_ns"] == 13_176 * US
    assert rows["hlt"]["reason"] == "HLT" and rows["hlt"]["mean_ns"] == 8_713 * US
    counted = {(VCPU_TID, "msr"): 5559, (VCPU_TID, "interrupt"): 7, (4242, "msr"): 9}  # 4242: not this VM's
    rows = {row["raw_reason"]: row for row in exit_statistics(trace, {0: VCPU_TID}, counted)}
    assert rows["msr"]["count"] == 5559 and rows["msr"]["timed"] == 1 and rows["interrupt"]["count"] == 7


def test_the_kernels_histogram_of_exits_is_read_with_the_names_of_its_own_format() -> None:
    path = Path("/sys/kernel/tracing/events/kvm/kvm_exit/format")
    if not path.exists():
        pytest.fail("this test reads the kvm_exit format of the machine's kernel (tracefs and KVM are set up here)")
    symbols = exit_symbols(path.read_text())
    assert symbols[1][1] == "EXTERNAL_INTERRUPT" and symbols[1][12] == "HLT"  # VMX
    assert symbols[2][0x078] == "hlt" and symbols[2][0x400] == "npf" and symbols[2][0x040 + 14] == "PF excp"  # SVM
    assert symbols[2][0x060] in ("interrupt", "intr")
    hist = ("# event histogram\n#\n# trigger info: hist:keys=common_pid,isa,exit_reason:vals=hitcount:sort=hitcount\n"
            "#\n\n{ common_pid:        209, isa:          2, exit_reason:        124 } hitcount:       5559\n"
            "{ common_pid:        209, isa:          2, exit_reason:        120 } hitcount:        149\n"
            "{ common_pid:        210, isa:          1, exit_reason:          1 } hitcount:          3\n\n"
            "Totals:\n    Hits: 5711\n    Entries: 3\n    Dropped: 0\n")
    assert hist_counts(hist, symbols) == {(209, "msr"): 5559, (209, "hlt"): 149, (210, "EXTERNAL_INTERRUPT"): 3}


# ---- on a real KVM host: kvm-amd nested under TCG (tests/kvm_host.py), reached over SSH -------------------------


@pytest.fixture(scope="module")
def kvm_host() -> Iterator[NestedKvmHost]:
    with NestedKvmHost() as host:
        yield host


@pytest.mark.vm
@pytest.mark.timeout(900)  # 59 s alone here, 101 s beside two CPU hogs; the suite's parallel phase loads it more
@pytest.mark.skipif(os.geteuid() != 0, reason="the KVM host is booted with this machine's root file system shared")
def test_a_fifo_task_on_the_vcpus_pcpu_is_named_and_its_vms_exits_are_counted(kvm_host: NestedKvmHost,
                                                                             tmp_path: Path) -> None:
    """The acceptance of the KVM layer: a Linux guest's timer probe under real KVM (nested), a SCHED_FIFO 50
    stressor on the KVM host's pCPU of its vCPU: the explanation names the stressor as what ran while the vCPU
    was not running, names exits by their reason, and counts the run's exits per reason."""
    scenario = tmp_path / "kvm.toml"
    scenario.write_text(f'''name = "kvm-explained"
duration = "3s"
run_timeout = "15m"

[workload]
probe = "timer"
params = {{ interval = "1ms" }}

[[environments]]
kind = "qemu"
name = "kvm"
cpus = "1"
vcpu_sched = {{ policy = "fifo", priority = 1 }}
boot_timeout = "10m"
{kvm_host.environment_fields()}
{FIFO_TASK_ON_THE_VCPUS_PCPU}
[explain]
threshold = "1ms"
layers = ["vm", "kvm"]
''')
    results = tmp_path / "results"
    try:  # (within the test's own timeout, so that a run that hangs says why)
        result = run_cli("run", str(scenario), "--out", str(results), "--no-report", timeout=780)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe KVM host's console ends:\n{kvm_host.console_text()[-3000:]}") from None
    assert result.returncode == 0, result.stderr
    (run_dir,) = (results / "runs").iterdir()
    manifest = load_run(run_dir).manifest
    detail = manifest["environment_detail"]
    assert manifest["status"] in RAN, manifest["campaign"]  # short: periods the starved vCPU's probe missed
    assert detail["acceleration"] == "kvm" and detail["acceleration_reason"].startswith("kvm_amd on a CPU with SVM")
    assert detail["kvm_host"]["modules"]["kvm_amd"]["npt"] == "Y" and "halt_poll_ns" in detail["kvm_host"][
        "modules"]["kvm"]
    assert detail["realtime"]["guest_cpu"]["tsc_deadline"] is True  # KVM's LAPIC has one; TCG's CPU has none
    assert detail["realtime"]["kernel_file"] == "bzImage"
    assert isinstance(detail["realtime"]["tsc"]["vcpu0"]["offset"], int)  # KVM's debugfs, as trace-cmd reads it
    assert manifest["explain"]["layers"] == {"vm": "seen", "kvm": "seen"}, manifest["explain"]

    explained = json.loads(run_cli("explain", str(run_dir), "--json", check=True).stdout)
    # the summary's one line per culprit: the stressor's task, in the VM layer (its parts name the vCPU it held);
    # the exits counted by the KVM host's kernel (its hist trigger)
    exits = fifo_task_named_and_exits_counted(explained)
    assert any(row["layer"] == "kvm" and row["cause"].startswith(("vCPU exited for ", "vCPU halted ("))
               for row in explained["summary"])
    (kvm_layer,) = [layer for layer in explained["layers"] if layer["layer"] == "kvm"]
    assert {"hlt", "msr", "npf"} <= set(exits), sorted(exits)  # SVM's own names, counted
    assert all(row["count"] >= row["timed"] > 0 for row in exits.values() if row["timed"])
    assert exits["hlt"]["reason"] == "HLT" and exits["npf"]["reason"] == "EPT_VIOLATION"
    assert any(note.startswith("KVM's tsc-offset (guest TSC = host TSC + offset): vcpu0: ")
               for note in kvm_layer["notes"])

    text = run_cli("explain", str(run_dir), check=True).stdout
    assert "VM exits by reason" in text and "HLT (hlt)" in text and "rtvirt-stress/" in text
    report = run_cli("report", str(results), "--out", str(tmp_path / "report.md"), "--format", "markdown",
                     check=True)
    assert report.returncode == 0 and "VM exits by reason" in (tmp_path / "report.md").read_text()
    left = connect(kvm_host.target())
    try:  # nothing of the run is left on the KVM host: no QEMU, no tracefs instance
        assert kvm_host.qemus_besides_the_holder(left) == []
        assert "rtvirt-" not in left.run(["ls", "/sys/kernel/tracing/instances"]).stdout
    finally:
        left.close()
