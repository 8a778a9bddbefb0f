"""The qemu environment: the guest image, safe job passing, and a real TCG guest streaming samples."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import assert_given_host_tsc_rate

from rtvirt.environments.console_log import CONSOLE_HEAD_BYTES, CONSOLE_TAIL_BYTES, bound_console_file, keep_console
from rtvirt.environments.guest_image import EXIT_MARK, READY_MARK, GuestJob, job_archive
from rtvirt.environments.qemu import TCG_WARNING, QemuConfig, QemuEnvironment
from rtvirt.environments.qemu import environment as qemu_environment
from rtvirt.environments.sched import SchedPolicy, apply_policy
from rtvirt.environments.tcg_clock import clock_failure, host_cycles_khz
from rtvirt.errors import RunError
from rtvirt.procs import Supervisor
from rtvirt.stream import read_stream


def _entries(archive: bytes) -> dict[str, bytes]:
    """Parse a newc cpio archive (independently of the writer) into name -> data."""
    entries, offset = {}, 0
    while True:
        assert archive[offset:offset + 6] == b"070701"
        fields = [int(archive[offset + 6 + 8 * i: offset + 14 + 8 * i], 16) for i in range(13)]
        size, name_size = fields[6], fields[11]
        name_start = offset + 110
        name = archive[name_start:name_start + name_size - 1].decode()
        data_start = name_start + name_size + (-(110 + name_size) % 4)
        if name == "TRAILER!!!":
            return entries
        entries[name] = archive[data_start:data_start + size]
        offset = data_start + size + (-size % 4)


def test_job_archive_passes_argv_verbatim_without_a_shell() -> None:
    nasty = ["/rtvirt/bin/rtvirt-probe", "timer", "--x=$(reboot)", "; poweroff -f", "a b\n`id`", "'\""]
    archive = _entries(job_archive(GuestJob(nasty), [GuestJob(["/rtvirt/bin/rtvirt-stress", "cpu"], 3, 7)]))
    assert archive["rtvirt/jobs/main.argv"].split(b"\0")[:-1] == [a.encode() for a in nasty]
    assert archive["rtvirt/jobs/bg-0.delay"] == b"3\n" and archive["rtvirt/jobs/bg-0.limit"] == b"7\n"


@pytest.mark.parametrize("argv", [[], ["relative/path"], ["/bin/x", "nul\0byte"], ["/a=b"]])
def test_job_archive_rejects_unsafe_commands(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        job_archive(GuestJob(argv))


def test_deadline_policy_needs_runtime_and_period() -> None:
    with pytest.raises(ValueError, match="runtime and period"):
        SchedPolicy(policy="deadline")
    policy = SchedPolicy(policy="deadline", runtime="200us", period="1ms")
    assert policy.describe() == "deadline:200000/1000000ns"


@pytest.mark.vm
def test_tcg_guest_boots_and_streams_timer_samples_to_the_host(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    config = QemuConfig(kind="qemu", cpus=(cpu,), accel="tcg", vcpu_sched=SchedPolicy(policy="other"))
    out = tmp_path / "samples.rtvs"
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, tmp_path / "vm")
        try:
            launched = env.launch("rtvirt-probe", ["timer", "--duration=1000000000", "--interval=1000000",
                                                   "--affinity=0"], out)
            launched.follow(timeout=240)
            assert env.check() is None, env.console_text()[-2000:]
            description = env.describe()
            delivery = env.delivery()
        finally:
            env.close()
    stream = read_stream(out)
    assert stream.end_reason == "complete" and stream.total_dropped == 0
    # the end-of-stream handshake: the host confirmed, and the agent heard it confirm every record it wrote
    assert launched.confirmation == "sent"
    assert delivery["guest_said"] == "confirmed" and delivery["guest_records"] == stream.records.size
    # every 1 ms period of the second is a sample or a counted overrun: a starved TCG guest misses many (in a
    # suite run its vCPU did not run for 1.15 s, leaving 5 samples and 995 overruns)
    overruns = stream.stats[(0, "overruns")]
    assert stream.records.size >= 2 and stream.records.size + overruns == 1000, (stream.records.size, overruns)
    assert description["acceleration"] == "tcg" and env.warnings() == [TCG_WARNING]
    assert description["vcpu_threads"]["0"]["host_cpu"] == cpu
    assert description["boot_seconds"] is not None
    # its kernel took its TSC's rate from the host (tcg_clock): the agent in the guest measured its cycle counter
    # against the guest's clock at that rate, within the 1 % the kernel's own refinement may move it
    assert_given_host_tsc_rate(description["realtime"]["guest_tsc"])
    assert abs(stream.header["cycles_hz"] / (host_cycles_khz() * 1000) - 1) < 0.01, stream.header["cycles_hz"]
    # the guest's console stays in its work directory, as printable text, to its last words
    kept = (tmp_path / "vm" / "console.log").read_text()
    assert READY_MARK in kept and f"{EXIT_MARK} 0" in kept and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", kept)


@pytest.mark.vm
def test_a_guest_whose_clock_runs_fast_fails_its_run_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the suite once met by chance (a loaded host, a libvirt domain's kernel calibrating its TSC at 80 MHz
    # for a 2445 MHz counter: latencies 30 times too long), made on purpose: the kernel is given that rate.
    wrong = f"tsc_early_khz={host_cycles_khz() // 30}"
    monkeypatch.setattr(qemu_environment, "tsc_kernel_args", lambda *_: [wrong])
    cpu = max(os.sched_getaffinity(0))
    config = QemuConfig(kind="qemu", cpus=(cpu,), accel="tcg", vcpu_sched=SchedPolicy(policy="other"))
    with Supervisor() as supervisor:
        env = QemuEnvironment(config, supervisor, tmp_path / "vm")
        try:
            launched = env.launch("rtvirt-probe", ["timer", "--duration=1000000000"], tmp_path / "samples.rtvs")
            with pytest.raises(RunError, match=r"the guest's clock ran fast: \d+\.\d s of uptime when it was ready, "
                                               r"\d+\.\d s after the host started it \(at least (\d+\.\d) times "
                                               r"real time\)"
                               ) as failed:
                launched.follow(timeout=240, watch=env.check)
        finally:
            env.close()
    assert env.describe()["realtime"]["guest_tsc"] == wrong
    assert float(re.search(r"at least (\d+\.\d) times", str(failed.value)).group(1)) > 5  # type: ignore[union-attr]


def test_a_ready_line_says_whether_the_guests_clock_kept_time() -> None:
    linux = "rtvirt: ports\nRTVIRT-READY 3.27 0.01\nmore"
    assert clock_failure(linux, since_launch_s=5.0) is None
    assert "3.3 s of uptime when it was ready, 1.0 s after" in (clock_failure(linux, since_launch_s=1.0) or "")
    # the bare-metal guest's counter runs from its vCPU's reset, before a paused QEMU is resumed: not an uptime
    assert clock_failure("RTVIRT-READY 161270000 us after reset (TSC invariant)", since_launch_s=5.3) is None
    lab = "RTVIRT-KVM-LAB-READY 40.00 12.00"
    assert clock_failure(lab, 30.0) is None  # another mark than the guests'
    assert clock_failure(lab, 30.0, mark="RTVIRT-KVM-LAB-READY") is not None
    assert clock_failure("RTVIRT-READY", 0.1) is None  # no uptime yet: nothing to say


def test_a_console_is_kept_bounded_to_its_beginning_and_end_as_printable_text(tmp_path: Path) -> None:
    """A guest that floods its console (or writes terminal escapes into it) leaves a bounded, harmless copy: its
    boot and its last words, with how much was left out between them."""
    console = tmp_path / "console.log"
    middle = b"\x1b[2J\x07flood\r\n" * 200_000
    original = b"Linux version 6.1 boot\n" + middle + b"Out of memory: Killed process 42 (rtvirt-stress)\n"
    console.write_bytes(original)
    bound_console_file(console)
    kept = console.read_text()
    assert kept.startswith("Linux version 6.1 boot\n") and kept.endswith("Killed process 42 (rtvirt-stress)\n")
    left_out = int(re.search(r"\[rtvirt: (\d+) bytes of this console left out here\]", kept)[1])  # type: ignore[index]
    assert left_out == len(original) - CONSOLE_HEAD_BYTES - CONSOLE_TAIL_BYTES
    assert len(kept.encode()) < CONSOLE_HEAD_BYTES + CONSOLE_TAIL_BYTES + 100
    assert "\x1b" not in kept and "\x07" not in kept and "\r" not in kept and "?[2J?flood\n" in kept
    keep_console(tmp_path / "short.log", b"ok\x1b]0;title\x07\n")  # a small one whole, cleaned
    assert (tmp_path / "short.log").read_text() == "ok?]0;title?\n"
    bound_console_file(tmp_path / "never-written.log")  # a guest that never started: nothing, no error
    assert not (tmp_path / "never-written.log").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="real-time policies need root")
def test_policies_are_applied_for_real_and_deadline_refusals_are_explained() -> None:
    with Supervisor() as supervisor:
        free = supervisor.start(["sleep", "30"])
        apply_policy(free.pid, SchedPolicy(policy="deadline", runtime="100us", period="10ms"))
        assert os.sched_getscheduler(free.pid) == 6  # SCHED_DEADLINE
        fifo = supervisor.start(["sleep", "30"])
        apply_policy(fifo.pid, SchedPolicy(policy="fifo", priority=7))
        assert os.sched_getscheduler(fifo.pid) == os.SCHED_FIFO
        assert os.sched_getparam(fifo.pid).sched_priority == 7
        pinned = supervisor.start(["sleep", "30"])
        os.sched_setaffinity(pinned.pid, {max(os.sched_getaffinity(0))})
        if len(os.sched_getaffinity(0)) > 1:
            with pytest.raises(RunError, match="root domain"):
                apply_policy(pinned.pid, SchedPolicy(policy="deadline", runtime="100us", period="10ms"))
    # pinned deadline vCPUs are accepted: they get an exclusive cpuset (tests/test_host.py runs one)
    assert QemuConfig(kind="qemu", vcpu_sched=SchedPolicy(policy="deadline", runtime="100us", period="1ms")).pin


def test_qemu_and_libvirt_keep_the_emulator_off_every_vcpus_cpu(tmp_path: Path) -> None:
    """One placement rule for both kinds: QEMU's other threads go where no vCPU is pinned, else with the vCPUs."""
    from rtvirt.environments.libvirt import LibvirtConfig, LibvirtEnvironment
    from rtvirt.environments.qemu import default_emulator_cpus

    assert default_emulator_cpus((1, 2), {0, 1, 2, 3}) == (0, 3)
    assert default_emulator_cpus((0, 1), {0, 1}) == (0, 1)
    online = sorted(os.sched_getaffinity(0))
    with Supervisor() as supervisor:
        for vcpus in (1, 2):
            cpus = online[-vcpus:] if len(online) >= vcpus else online
            qemu = QemuEnvironment(QemuConfig(kind="qemu", vcpus=vcpus, cpus=cpus), supervisor, tmp_path / "q")
            libvirt = LibvirtEnvironment(LibvirtConfig(kind="libvirt", vcpus=vcpus, cpus=cpus), supervisor,
                                         tmp_path / "l")
            expected = tuple(c for c in online if c not in cpus) or tuple(sorted(set(cpus)))
            assert qemu.emulator_cpus() == libvirt.emulator_cpus() == expected
