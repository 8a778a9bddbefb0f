"""The qemu kind on a KVM host reached over SSH, end to end against a real Debian OpenSSH server on a loopback port
(tests/sshd_server.py) with QEMU under TCG there: a campaign whose QEMU, stressor and images live under that
sshd, its manifest recording what the KVM host had in force; Ctrl-C, a lost connection and kill -9 + --resume
leaving no QEMU behind; bad input (an unreachable host, a host without /dev/kvm) failing its run by name while
every other run is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RAN, RTVIRT, assert_ran, run_cli
from sshd_server import SshServer, descendants, free_port, process_name

from rtvirt.campaign import CampaignState, run_campaign
from rtvirt.scenario import parse_scenario
from rtvirt.store import load_run
from rtvirt.stream import read_stream

pytestmark = [pytest.mark.vm, pytest.mark.xdist_group("kvm-remote")]

CPU = max(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def server() -> Iterator[SshServer]:
    with SshServer() as sshd:
        yield sshd


class NoKvmServer(SshServer):
    """sshd in a mount namespace of its own where /dev/kvm is an empty file: a KVM host without KVM."""

    def _spawn(self) -> bool:
        empty = self.dir / "no-kvm"
        empty.write_text("")
        script = 'mount --bind "$1" /dev/kvm && shift && exec "$@"'
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                      str(empty), "/usr/sbin/sshd", "-D", "-e", "-f", str(self.dir / "sshd_config")],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=(self.dir / "sshd.log").open("ab"), start_new_session=True)
        return self._wait_listening()


def environment_toml(server: SshServer, remote_dir: Path, name: str = "kvmbox", accel: str = "auto",
                     host: str | None = None) -> str:
    host = host or f"{server.user}@127.0.0.1:{server.port}"
    return (f'[[environments]]\nkind = "qemu"\nname = "{name}"\nhost = "{host}"\ncpus = "{CPU}"\n'
            f'accel = "{accel}"\nremote_dir = "{remote_dir}"\n'
            f'ssh = {{ known_hosts = "{server.known_hosts}", identity_file = "{server.client_key}" }}\n')


def scenario_text(environments: str, duration: str = "2s", disturbances: str = "") -> str:
    return (f'name = "kvm-remote"\nduration = "{duration}"\nrun_timeout = "4m"\n\n'
            f'[workload]\nprobe = "timer"\nparams = {{ interval = "1ms" }}\n\n{environments}\n'
            f'[[disturbances]]\nname = "solo"\n{disturbances}')


def qemus_of(remote_dir: Path) -> list[str]:
    """QEMUs of this machine started for ``remote_dir`` (their -chardev paths lie in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"qemu-system") and str(remote_dir).encode() in cmdline:
                found.append(entry.name)
    return found


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_campaign_on_a_kvm_host_over_ssh_runs_its_qemu_and_stressors_there(server: SshServer,
                                                                              tmp_path: Path) -> None:
    remote = tmp_path / "kvmhost"
    scenario = tmp_path / "kvm.toml"
    scenario.write_text(scenario_text(environment_toml(server, remote), disturbances=(
        '[[disturbances]]\nname = "same-core"\n[[disturbances.stressors]]\nstressor = "cpu"\n'
        'where = "same-core"\nparams = { priority = 50, slice = "2ms", period = "10ms" }\n')))
    seen: set[str] = set()  # what ran under the sshd: the KVM host's side
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            assert server.proc is not None
            seen.update(process_name(pid) for pid in descendants(server.proc.pid))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"), "--no-report", "--json",
                         timeout=600)
    finally:
        done.set()
        watcher.join()
    assert_ran(result)  # a TCG guest's timer overruns periods on a loaded host: a short run is a run
    assert "qemu-system-x86" in seen and "rtvirt-stress" in seen, seen  # QEMU and the stressor ran over there
    manifests = {m.manifest["campaign"]["disturbance"]: m.manifest
                 for m in map(load_run, (tmp_path / "results" / "runs").iterdir())}
    assert set(manifests) == {"solo", "same-core"}
    for manifest in manifests.values():
        assert manifest["status"] in RAN, manifest["campaign"]
        detail = manifest["environment_detail"]
        assert detail["host"] == f"{server.user}@127.0.0.1:{server.port}"
        # this machine's /dev/kvm emulates (no VMX or SVM): auto chose TCG there, and says why
        assert detail["acceleration"] == "tcg" and "neither VMX nor SVM" in detail["acceleration_reason"]
        kvm_host = detail["kvm_host"]
        assert kvm_host["where"] == detail["host"] and kvm_host["kernel"] == os.uname().release
        assert kvm_host["accelerates"] is False and "halt_poll_ns" in kvm_host["modules"]["kvm"]
        assert detail["qemu"].startswith("QEMU emulator version")
        assert detail["vcpu_threads"]["0"]["host_cpu"] == CPU
        # read there once a second, the last reading while its vCPU thread lived
        assert detail["vcpu_cpu_seconds"] > 0 and detail["vcpu_cpu_seconds_after_boot"] >= 0, detail
        assert manifest["delivery"]["via"].startswith("a FIFO on") and manifest["delivery"]["guest_said"] \
            == "confirmed"
        assert manifest["system"]["platform"]["kvm_host"]["kernel"] == os.uname().release
        assert manifest["summary"]["all"]["samples"] > 300
    (stress,) = manifests["same-core"]["campaign"]["stressor_results"]
    assert stress["command"][0].startswith(str(remote))  # our agent, copied into the KVM host's remote_dir
    assert stress["parts"][0]["bogo_ops"] > 0
    # the images were copied once, by content; every QEMU's directory is gone
    images = sorted(p.name for p in (remote / "images").iterdir())
    assert len(images) == 2 and all(len(name.split("-", 1)[0]) == 12 for name in images), images
    assert list((remote / "qemu").iterdir()) == [] and qemus_of(remote) == []


def _start_long_run(server: SshServer, tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    remote = tmp_path / "kvmhost"
    scenario = tmp_path / "long.toml"
    scenario.write_text(scenario_text(environment_toml(server, remote, accel="tcg"), duration="6s"))
    results = tmp_path / "results"
    proc = subprocess.Popen([*RTVIRT, "run", str(scenario), "--out", str(results), "--no-report", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(p.stat().st_size > 4000 for p in results.glob("runs/*/samples.rtvs"))
             or proc.poll() is not None, 300, "the remote guest never streamed")
    assert proc.poll() is None, proc.communicate()
    assert qemus_of(remote)
    return proc, remote, results


def test_ctrl_c_stops_the_remote_qemu_and_keeps_the_samples(server: SshServer, tmp_path: Path) -> None:
    proc, remote, results = _start_long_run(server, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (run,) = [load_run(p) for p in (results / "runs").iterdir()]
    assert run.manifest["campaign"]["outcome"] == "interrupted" and run.manifest["summary"]["all"]["samples"] > 0
    wait_for(lambda: not qemus_of(remote), 30, "the remote QEMU outlived Ctrl-C")
    assert list((remote / "qemu").iterdir()) == []


def test_a_lost_connection_ends_the_remote_qemu_and_fails_the_run_by_name(server: SshServer, tmp_path: Path) -> None:
    proc, remote, results = _start_long_run(server, tmp_path)
    assert server.kill_sessions() >= 1  # as if the network had gone
    wait_for(lambda: not qemus_of(remote), 30, "the remote QEMU outlived its connection (its watchdog)")
    _, err = proc.communicate(timeout=180)
    (run,) = [load_run(p) for p in (results / "runs").iterdir()]
    reason = run.manifest["campaign"]["reason"]
    assert "connection to the KVM host" in reason and "was lost" in reason, reason
    assert read_stream(run.path / "samples.rtvs").records.size > 100  # the samples received are kept
    assert list((remote / "qemu").iterdir()) == []  # its directory went once rtvirt reconnected


def test_kill_9_leaves_no_remote_qemu_and_resume_finishes(server: SshServer, tmp_path: Path) -> None:
    proc, remote, results = _start_long_run(server, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    wait_for(lambda: not qemus_of(remote), 30, "the remote QEMU outlived a killed rtvirt")
    assert len(list((remote / "qemu").iterdir())) == 1  # left for the next rtvirt to reclaim
    resumed = run_cli("run", "--resume", "--out", str(results), "--no-report", "--no-progress", timeout=600)
    assert_ran(resumed)
    assert "QEMU directory" in resumed.stdout + resumed.stderr  # reclaimed, and said so
    outcomes = sorted(load_run(p).manifest["campaign"]["outcome"] for p in (results / "runs").iterdir())
    redone = [outcome for outcome in outcomes if outcome != "killed"]
    assert len(outcomes) == 2 and len(redone) == 1 and redone[0] in RAN  # the killed run's samples kept beside its twin
    assert list((remote / "qemu").iterdir()) == [] and qemus_of(remote) == []


def test_bad_kvm_hosts_fail_their_runs_by_name_and_the_others_are_kept(server: SshServer, tmp_path: Path) -> None:
    with NoKvmServer() as no_kvm:
        text = scenario_text("[[environments]]\nkind = \"host\"\n"
                             + environment_toml(server, tmp_path / "a", name="unreachable",
                                                host=f"{server.user}@127.0.0.1:{free_port()}")
                             + environment_toml(no_kvm, tmp_path / "b", name="no-kvm", accel="kvm")
                             + environment_toml(no_kvm, tmp_path / "c", name="no-kvm-auto"), duration="1s")
        scenario = parse_scenario(text, "bad.toml")
        state = CampaignState.create(tmp_path, scenario.name, text, "bad.toml", 1.0)
        outcomes = run_campaign(scenario, state, tmp_path, show_progress=False, write_report=False).outcomes
    assert outcomes["host/solo/-/r1"].status in RAN
    assert outcomes["unreachable/solo/-/r1"].status == "failed"
    assert "cannot connect" in outcomes["unreachable/solo/-/r1"].reason
    assert outcomes["no-kvm/solo/-/r1"].status == "failed"
    assert "accel 'kvm' requested but /dev/kvm is missing or not accessible on" in outcomes["no-kvm/solo/-/r1"].reason
    # auto on that host falls back to TCG and says why
    auto = load_run(tmp_path / "runs" / outcomes["no-kvm-auto/solo/-/r1"].run_id).manifest
    assert auto["status"] in RAN, auto["campaign"]
    assert auto["environment_detail"]["acceleration_reason"].startswith("/dev/kvm is missing or not accessible on")
    assert len([p for p in (tmp_path / "runs").iterdir() if (p / "manifest.json").exists()]) == 4


def test_bad_host_text_is_refused_with_exit_2(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(scenario_text('[[environments]]\nkind = "qemu"\nhost = "a@b@c;reboot"\n'))
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"))
    assert result.returncode == 2 and "host" in result.stderr and "Traceback" not in result.stderr


def test_an_image_is_looked_for_on_the_kvm_host_once_a_campaign_though_each_use_touches_it(
        server: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Staging a guest image costs the KVM host a command only at its first use in a campaign (a KVM lab under TCG
    pays 0.1-0.2 s for each), and this machine one hash of it: a cached image's every use refreshes its mtime
    (mark_used), which once made every run look for both images again. An image rebuilt as the cache does (a new
    file renamed into place), even of the same size, is a new copy."""
    from rtvirt.environments.qemu import where
    from rtvirt.fileio import mark_used, write_atomically
    from rtvirt.remote.agents import TargetLink

    hashed: list[Path] = []
    real_digest = where.file_digest

    def counted_digest(path: Path) -> str:
        hashed.append(path)
        return real_digest(path)

    monkeypatch.setattr(where, "file_digest", counted_digest)
    host = where.RemoteQemuHost(TargetLink(server.target(), str(tmp_path / "remote")))
    connection = host.transport
    commands: list[str] = []
    real_run = connection.run

    def counted(argv, *args, **kwargs):  # type: ignore[no-untyped-def]
        commands.append(" ".join(argv)[:80])
        return real_run(argv, *args, **kwargs)

    connection.run = counted  # type: ignore[method-assign]
    image = tmp_path / "vmlinux.elf"
    image.write_bytes(b"kernel" * 1000)
    try:
        first = host.stage(image)
        copied = len(commands)
        time.sleep(0.05)
        mark_used(image)
        assert host.stage(image) == first and len(commands) == copied, commands
        assert hashed == [image]
        write_atomically(image, b"KERNEL" * 1000)
        second = host.stage(image)
    finally:
        connection.close()
    assert copied >= 2 and len(commands) > copied and second != first, commands  # looked for, then put
    assert Path(first).read_bytes() == b"kernel" * 1000 and Path(second).read_bytes() == b"KERNEL" * 1000
    assert hashed == [image, image]


def test_the_remote_vcpu_cpu_time_keeps_its_last_sum_when_a_vcpu_thread_ends_before_qemu() -> None:
    """The script a KVM host runs for the vCPU threads' CPU time, run here on a process whose busy thread ends 1.5 s
    before the process does (QEMU's vCPU threads exit before its main thread): its sums never fall back (they
    fell to 0 once the thread was gone: the KVM lab's runs recorded 0.0 s of vCPU time, and a negative time after
    the boot)."""
    from rtvirt.environments.qemu.where import _CPU_TIMES

    child = subprocess.Popen([sys.executable, "-c", (
        "import threading, time\n"
        "def busy():\n    end = time.monotonic() + 1.5\n    while time.monotonic() < end: pass\n"
        "thread = threading.Thread(target=busy); thread.start(); print(thread.native_id, flush=True)\n"
        "thread.join(); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        tid = child.stdout.readline().strip()
        script = subprocess.Popen(["sh", "-c", _CPU_TIMES, "rtvirt-cpu-times", str(child.pid), tid],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(4.5)  # the thread's 1.5 s and three readings after it
        ended = script.poll() is not None
        script.kill()
        said = script.communicate()[0].split()
    finally:
        child.kill()
        child.wait()
    ticks = [int(line) for line in said[1:]]
    assert ticks and ticks[-1] > 0 and ticks == sorted(ticks), said
    assert ended  # the readings stop with the thread


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
