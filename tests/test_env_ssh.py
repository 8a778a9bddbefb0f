"""SSH targets end to end against a real Debian OpenSSH server on a loopback port (tests/sshd_server.py):
probes and stressors through it, host keys verified, a connection killed mid-run, a target rebooting
mid-run, scenarios with two targets, hooks and inside stressors, a lab of targets from an inventory (one
probe, or a scenario matrix interrupted and resumed), and the aarch64 agents under qemu-aarch64."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RAN, RTVIRT, run_cli
from sshd_server import REMOTE_BIN, SshServer, descendants, our_agents_running, process_name

from rtvirt.params import cpu_list
from rtvirt.stream import StreamReader
from rtvirt.sysaudit import audit_system

# one worker for the file and tests/test_target_labgrid.py: their targets are this machine, and the tests check
# machine-wide that no agent runs from /var/tmp/rtvirt and which stream copies are left there
pytestmark = pytest.mark.xdist_group("ssh-targets")


@pytest.fixture(scope="module")
def server() -> Iterator[SshServer]:
    with SshServer() as sshd:
        yield sshd


@pytest.fixture(scope="module")
def second_server() -> Iterator[SshServer]:
    with SshServer() as sshd:
        yield sshd


def target_args(server: SshServer, alias: str = "board") -> list[str]:
    return ["--target", alias, "--ssh-config", str(server.ssh_config(alias))]


def wait_streaming(proc: subprocess.Popen[str], results: Path, min_bytes: int = 20_000) -> None:
    """Wait until a run of ``proc`` under ``results`` has streamed more than ``min_bytes`` (60 s at most)."""
    deadline = time.monotonic() + 60
    while not any(p.stat().st_size > min_bytes for p in results.glob("runs/*/samples.rtvs")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def manifest_of(results: Path) -> dict:
    (path,) = results.glob("runs/*/manifest.json")
    return json.loads(path.read_text())


def test_probe_timer_over_ssh(server: SshServer, results_dir: Path) -> None:
    result = run_cli("probe", "timer", *target_args(server), "--duration", "1s", "--interval", "1ms",
                     "--results", str(results_dir), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "complete"
    assert 300 < summary["summary"]["all"]["samples"] <= 1001
    manifest = manifest_of(results_dir)
    audit = manifest["target"]["audit"]
    assert audit["arch"] == os.uname().machine
    assert audit["kernel"] == os.uname().release  # the target is this machine behind sshd
    for key in ("preemption", "isolcpus", "governors", "idle_states", "virtualization"):
        assert key in audit
    # the kernel's HZ read over the connection (its config, gzip'd or in /boot) is this machine's own
    assert audit["scheduler_tick"]["hz"] == audit_system()["scheduler_tick"]["hz"] is not None
    assert manifest["target"]["connection"] == "kept" and manifest["target"]["leftovers"] == []
    assert our_agents_running() == []


def test_user_at_host_port_form(server: SshServer, results_dir: Path) -> None:
    text = f"{server.user}@127.0.0.1:{server.port}"
    result = run_cli("probe", "timer", "--target", text, "--known-hosts", str(server.known_hosts),
                     "--identity", str(server.client_key), "--duration", "300ms", "--results", str(results_dir),
                     "--json")
    assert result.returncode == 0, result.stderr
    assert manifest_of(results_dir)["target"]["label"] == text


def test_host_key_mismatch_is_refused(server: SshServer, tmp_path: Path, results_dir: Path) -> None:
    impostor = tmp_path / "known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    algo, key = (tmp_path / "other.pub").read_text().split()[:2]
    impostor.write_text(f"[127.0.0.1]:{server.port} {algo} {key}\n")
    result = run_cli("probe", "timer", "--target", f"{server.user}@127.0.0.1:{server.port}", "--known-hosts",
                     str(impostor), "--identity", str(server.client_key), "--duration", "1s",
                     "--results", str(results_dir))
    assert result.returncode == 2, result.stderr
    assert "host key is not trusted" in result.stderr and "Traceback" not in result.stderr
    assert not list(results_dir.glob("runs/*/samples.parquet"))


def test_bad_target_text_exit_2(results_dir: Path) -> None:
    result = run_cli("probe", "timer", "--target", "a@b@c;rm", "--duration", "1s", "--results", str(results_dir))
    assert result.returncode == 2 and "--target" in result.stderr and "Traceback" not in result.stderr


def test_stress_over_ssh(server: SshServer) -> None:
    result = run_cli("stress", "cpu", *target_args(server), "--duration", "1s", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["end"] == "complete" and summary["parts"][0]["bogo_ops"] > 0
    assert 0.8e9 < summary["elapsed_ns"] < 5e9
    assert our_agents_running() == []


def test_the_local_files_of_a_remote_stressor_killed_with_its_rtvirt_are_removed_by_the_next_one(
        server: SshServer) -> None:
    """kill -9 of rtvirt leaves the directory where its remote stressor's output arrived: the next stressor over
    SSH removes it, and its agent on the target ended with the connection."""
    temp = Path(tempfile.gettempdir())
    killed = subprocess.Popen([*RTVIRT, "stress", "cpu", *target_args(server), "--duration", "0", "--no-progress"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (left := list(temp.glob(f"rtvirt-remote-stress-{killed.pid}-*"))) or not our_agents_running():
            if killed.poll() is not None:
                pytest.fail(f"rtvirt stress ended (status {killed.returncode}): {killed.communicate()[1][-2000:]}")
            assert time.monotonic() < deadline, f"no directory named after rtvirt {killed.pid} or no agent in 60 s"
            time.sleep(0.1)
        killed.kill()
        killed.wait(10)
        assert all(path.exists() for path in left)  # what kill -9 left
        result = run_cli("stress", "cpu", *target_args(server), "--duration", "1s", "--json")
        assert result.returncode == 0, result.stderr
        assert not any(path.exists() for path in left)
        gone = time.monotonic() + 10
        while our_agents_running() and time.monotonic() < gone:
            time.sleep(0.05)
        assert our_agents_running() == []
    finally:
        killed.kill()
        killed.wait(10)


def test_connection_killed_mid_run_keeps_samples_and_fetches_copy(server: SshServer, results_dir: Path) -> None:
    copies_before = set(Path("/var/tmp/rtvirt/runs").glob("timer-*"))
    args = [*RTVIRT, "probe", "timer", *target_args(server), "--duration", "20s", "--interval", "1ms",
            "--results", str(results_dir), "--json"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_streaming(proc, results_dir)
        assert server.kill_sessions() >= 1  # as if the network had gone
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    manifest = manifest_of(results_dir)
    assert manifest["status"] == "partial"
    assert manifest["target"]["connection"] == "lost"
    assert "fetched after reconnecting" in manifest["target"]["recovered"]
    (stream_path,) = results_dir.glob("runs/*/samples.rtvs")
    stream = StreamReader(stream_path).finish()
    assert stream.records.size == manifest["summary"]["all"]["samples"] > 500
    assert stream.complete  # the copy ends with the agent's own END record: nothing was lost at the tail
    assert manifest["target"]["leftovers"] == []
    assert our_agents_running() == []
    assert set(Path("/var/tmp/rtvirt/runs").glob("timer-*")) <= copies_before  # removed once fetched


def test_target_rebooting_mid_run_keeps_samples_and_reconnects(tmp_path: Path) -> None:
    """The target goes down (its sshd, the sessions and our agent SIGKILLed at once) and comes back 3 s later
    on the same address: rtvirt keeps what it received, retries until it can reconnect, fetches the agent's
    copy and stores the run as partial."""
    results = tmp_path / "results"
    with SshServer() as board:  # its own server: it is rebooted
        args = [*RTVIRT, "probe", "timer", *target_args(board), "--duration", "30s", "--interval", "1ms",
                "--results", str(results), "--json"]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_streaming(proc, results)
            assert our_agents_running()
            board.down()  # sessions first, then the agent under them: nothing flushes, nothing says goodbye
            (stream_path,) = results.glob("runs/*/samples.rtvs")
            snapshot = tmp_path / "received.rtvs"
            shutil.copyfile(stream_path, snapshot)
            gone = time.monotonic() + 10  # a SIGKILLed process takes a moment to go on a loaded machine
            while our_agents_running() and time.monotonic() < gone:
                time.sleep(0.05)
            assert our_agents_running() == []
            time.sleep(3)
            assert proc.poll() is None  # still trying to reconnect
            board.up()
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert "was lost mid-run" in err
    manifest = manifest_of(results)
    assert manifest["status"] == "partial" and manifest["target"]["connection"] == "lost"
    assert "fetched after reconnecting" in manifest["target"]["recovered"], manifest["target"]
    received = StreamReader(snapshot).finish().records.size
    assert manifest["summary"]["all"]["samples"] >= received > 500  # every sample received kept
    assert manifest["target"]["leftovers"] == []
    assert not [p for p in Path("/var/tmp/rtvirt/runs").glob("timer-*") if p.stat().st_mtime > time.time() - 120]


def test_target_not_back_within_the_bound_gives_up(tmp_path: Path) -> None:
    """A target that stays down: the campaign retries for reconnect_timeout, then keeps what it received."""
    results = tmp_path / "results"
    with SshServer() as board:
        scenario = tmp_path / "down.toml"
        scenario.write_text(f'name = "down"\nduration = "20s"\n[workload]\nprobe = "timer"\n'
                            f'[[environments]]\nkind = "ssh"\nname = "board"\nreconnect_timeout = 2\n'
                            f'{_fields_toml(board)}')
        proc = subprocess.Popen([*RTVIRT, "run", str(scenario), "--out", str(results), "--no-progress"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_streaming(proc, results)
            board.down()
            went = time.monotonic()
            out, err = proc.communicate(timeout=120)
            waited = time.monotonic() - went
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, err
    assert waited < 15, waited  # 2 s of retries, not the 20 s run nor a hang
    (manifest,) = [json.loads(p.read_text()) for p in results.glob("runs/*/manifest.json")]
    assert manifest["status"] == "partial" and manifest["summary"]["all"]["samples"] > 500
    assert "could not be fetched" in manifest["campaign"]["reason"], manifest["campaign"]
    gone = time.monotonic() + 10
    while our_agents_running() and time.monotonic() < gone:
        time.sleep(0.05)
    assert our_agents_running() == []


def test_aarch64_agent_runs_under_qemu_user(tmp_path: Path) -> None:
    from rtvirt.agents import agent_path

    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    assert qemu, "scripts/setup.sh installs qemu-user-static"
    probe = agent_path("rtvirt-probe", "aarch64")
    assert probe.read_bytes()[:20][18] == 183  # ELF e_machine EM_AARCH64
    from rtvirt.probes import PROBES

    out = tmp_path / "s.rtvs"
    timer = PROBES["timer"]
    argv = timer.command(timer.params(duration="300ms", interval="1ms", rt=False, mlock=False), str(probe))
    subprocess.run([qemu, *argv, f"--out={out}"], check=True, timeout=120, capture_output=True)
    stream = StreamReader(out).finish()
    assert stream.complete and stream.records.size > 50
    stress = agent_path("rtvirt-stress", "aarch64")
    done = subprocess.run([qemu, str(stress), "cpu", "--duration=200000000"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"bogo_ops"' in done.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def _probe_running_here() -> bool:
    return any(line.endswith("/rtvirt-probe") for line in our_agents_running())


@contextlib.contextmanager
def cpus_of_rtvirt_while_probing() -> Iterator[set[str]]:
    """The CPU lists (Cpus_allowed_list) of every thread of the rtvirt commands this test started, read while
    our probe agent runs on the target (this machine); a reading counts when the agent ran before and after it."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if not _probe_running_here():
                continue
            found = set()
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    if b"-m\0rtvirt\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        for task in Path(f"/proc/{pid}/task").iterdir():
                            found |= {line.split(":", 1)[1].strip() for line in (task / "status").read_text()
                                      .splitlines() if line.startswith("Cpus_allowed_list:")}
            if _probe_running_here():
                seen.update(found)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def _fields_toml(server: SshServer) -> str:
    return (f'host = "127.0.0.1"\nport = {server.port}\nuser = "{server.user}"\n'
            f'identity_file = "{server.client_key}"\nknown_hosts = "{server.known_hosts}"\n')


def test_scenario_two_targets_and_hooks(server: SshServer, second_server: SshServer, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    scenario = tmp_path / "two-targets.toml"
    scenario.write_text(f'''
name = "two-targets"
duration = "3s"
run_timeout = "2m"

[timeline]
settle = "0.2s"

[workload]
probe = "timer"
params = {{ interval = "1ms" }}

[[environments]]
kind = "ssh"
name = "board"
{_fields_toml(server)}
[[environments.disturbers]]
{_fields_toml(second_server)}
[[disturbances]]
name = "solo"

[[disturbances]]
name = "other-target"
events = [{{ at = "0.3s", action = "stress-on" }}, {{ at = "2.8s", action = "stress-off" }}]
[[disturbances.stressors]]
stressor = "cpu"
where = "other-vm"

[[disturbances]]
name = "on-target"
[[disturbances.stressors]]
stressor = "cpu"
where = "other-core"

[[disturbances]]
name = "inside-target"
[[disturbances.stressors]]
stressor = "cpu"
where = "inside"

[hooks]
control = {{ {_fields_toml(second_server).strip().replace(chr(10), ", ")} }}
[[hooks.before_campaign]]
argv = ["touch", "{marks}/campaign-start"]
[[hooks.before_run]]
argv = ["mkdir", "{marks}/before-{{environment}}-{{disturbance}}-{{repetition}}"]
[[hooks.after_run]]
argv = ["touch", "{marks}/after-{{run_id}}"]
[[hooks.after_campaign]]
argv = ["touch", "{marks}/campaign-end"]
''')
    results = tmp_path / "results"
    seen_on_second: set[str] = set()  # what ran under the second target's sshd (the "other target")
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            assert second_server.proc is not None
            seen_on_second.update(process_name(pid) for pid in descendants(second_server.proc.pid))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with cpus_of_rtvirt_while_probing() as rtvirt_cpus:
            result = run_cli("run", str(scenario), "--out", str(results), "--json", timeout=300)
    finally:
        done.set()
        watcher.join()
    assert result.returncode == 0, result.stderr
    # the target is this machine: rtvirt kept its threads off the CPU measured there (its last) while it measured
    measured = max(os.sched_getaffinity(0))
    assert rtvirt_cpus == {cpu_list(set(os.sched_getaffinity(0)) - {measured})}, rtvirt_cpus
    manifests = [json.loads(p.read_text()) for p in results.glob("runs/*/manifest.json")]
    assert "rtvirt-stress" in seen_on_second and "rtvirt-probe" not in seen_on_second, \
        (seen_on_second, [m["timeline"] for m in manifests])
    assert sorted(m["campaign"]["disturbance"] for m in manifests) == ["inside-target", "on-target", "other-target",
                                                                       "solo"]
    for manifest in manifests:
        # short: the timer probe on this (loaded) machine overran periods, which is not what this test checks
        assert manifest["status"] in RAN, manifest["campaign"]
        assert manifest["system"]["platform"]["target"]["arch"] == os.uname().machine
        assert any(f"own threads kept to CPUs {cpu_list(set(os.sched_getaffinity(0)) - {measured})}, off the "
                   f"measured {measured}" in warning for warning in manifest["system"]["warnings"])
        assert [h["argv"][0] for h in manifest["hooks"]] == ["mkdir", "touch"]
        assert all(h["status"] == 0 for h in manifest["hooks"])
        assert {h["on"] for h in manifest["hooks"]} == {f"{second_server.user}@127.0.0.1:{second_server.port}"}
        assert (marks / f"after-{manifest['run_id']}").exists()
    (beside,) = [m for m in manifests if m["campaign"]["disturbance"] == "on-target"]
    (result,) = beside["campaign"]["stressor_results"]
    assert result["engine"] == "native" and result["parts"][0]["bogo_ops"] > 0
    assert result["command"][0].startswith(REMOTE_BIN)  # it ran on the target, from our copied agent
    (inside,) = [m for m in manifests if m["campaign"]["disturbance"] == "inside-target"]
    (result,) = inside["campaign"]["stressor_results"]  # inside the measured target: on all its CPUs
    assert result["command"][0].startswith(REMOTE_BIN) and result["bogo_ops"] > 0
    assert len(result["cpus"]) == inside["system"]["platform"]["target"]["cpus"] == len(os.sched_getaffinity(0))
    names = sorted(p.name for p in marks.iterdir())
    assert "before-board-solo-1" in names and "before-board-other-target-1" in names
    assert "campaign-start" in names and "campaign-end" in names
    assert our_agents_running() == []


def test_lab_of_targets_from_inventory(server: SshServer, second_server: SshServer, tmp_path: Path) -> None:
    inventory = tmp_path / "lab.toml"
    inventory.write_text(f'[[targets]]\nname = "ecu-a"\n{_fields_toml(server)}\n'
                         f'[[targets]]\nname = "ecu-b"\n{_fields_toml(second_server)}\n'
                         f'[[targets]]\nname = "gone"\nhost = "127.0.0.1"\nport = 1\nconnect_timeout = 3\n'
                         f'known_hosts = "{server.known_hosts}"\n')
    results = tmp_path / "results"
    result = run_cli("lab", str(inventory), "--set", "interval=1ms", "-D", "2s", "--results", str(results), "--json",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    by_name = {t["name"]: t for t in outcome["targets"]}
    assert by_name["ecu-a"]["status"] == by_name["ecu-b"]["status"] == "complete"
    assert by_name["gone"]["status"] == "failed" and "cannot connect" in by_name["gone"]["reason"]
    manifests = {m["config"]: m for m in (json.loads(p.read_text()) for p in results.glob("runs/*/manifest.json"))}
    assert set(manifests) == {"ecu-a", "ecu-b"}
    # measured at the same time: the two runs overlap (each lasted 2 s)
    starts = sorted(m["stream_header"]["start_realtime_ns"] for m in manifests.values())
    assert starts[1] - starts[0] < 2e9
    report = Path(outcome["report"]).read_text()
    assert "ecu-a" in report and "ecu-b" in report
    assert our_agents_running() == []


def test_lab_inventory_errors_exit_2(tmp_path: Path) -> None:
    inventory = tmp_path / "lab.toml"
    inventory.write_text('[[targets]]\nname = "a"\nhost = "x;rm -rf"\n')
    result = run_cli("lab", str(inventory), "-D", "1s")
    assert result.returncode == 2 and "targets[0].host" in result.stderr and "lab.toml:3" in result.stderr


def test_proxy_jump_from_ssh_config(second_server: SshServer, tmp_path: Path) -> None:
    with SshServer() as jump:  # its own server: any session on it is this test's hop
        _run_through_jump(jump, second_server, tmp_path)


def _run_through_jump(server: SshServer, second_server: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts.read_text() + second_server.known_hosts.read_text())
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jump\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
        f"  IdentityFile {server.client_key}\n  UserKnownHostsFile {known}\n"
        f"Host board\n  HostName 127.0.0.1\n  Port {second_server.port}\n  User {second_server.user}\n"
        f"  IdentityFile {second_server.client_key}\n  UserKnownHostsFile {known}\n  ProxyJump jump\n")
    # a stray client of an earlier test may still be retrying the port this fresh server reuses: only a session
    # that appears during this run counts as the hop
    before = set(server.session_pids())
    args = [*RTVIRT, "probe", "timer", "--target", "board", "--ssh-config", str(config), "--duration", "3s",
            "--results", str(tmp_path / "results"), "--json"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("results/runs/*/samples.rtvs")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        assert set(server.session_pids()) - before, "the connection to the target did not go through the jump host"
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "complete"


def test_campaign_run_on_a_dropped_target_keeps_its_samples(server: SshServer, tmp_path: Path) -> None:
    scenario = tmp_path / "drop.toml"
    scenario.write_text(f'name = "drop"\nduration = "10s"\n[workload]\nprobe = "timer"\n'
                        f'[[environments]]\nkind = "ssh"\nname = "board"\n{_fields_toml(server)}')
    results = tmp_path / "results"
    proc = subprocess.Popen([*RTVIRT, "run", str(scenario), "--out", str(results), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_streaming(proc, results)
        assert server.kill_sessions() >= 1
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err  # a failed run: the campaign says so
    (manifest,) = [json.loads(p.read_text()) for p in results.glob("runs/*/manifest.json")]
    assert manifest["status"] == "partial" and manifest["summary"]["all"]["samples"] > 500
    assert manifest["campaign"]["outcome"] == "failed"
    reason = manifest["campaign"]["reason"]
    assert "was lost" in reason and "fetched after reconnecting" in reason
    assert our_agents_running() == []


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_agent_never_outlives_rtvirt(server: SshServer, tmp_path: Path, signal_name: str) -> None:
    """SIGTERM: rtvirt stops the agent and keeps the samples; SIGKILL: the session ends with rtvirt, and so
    does the agent (--watch-stdin), with nobody left to ask it."""
    import signal

    results = tmp_path / "results"
    proc = subprocess.Popen([*RTVIRT, "probe", "timer", *target_args(server), "--duration", "60s",
                             "--results", str(results), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_streaming(proc, results, 5_000)
        assert our_agents_running()
        proc.send_signal(getattr(signal, signal_name))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 20
    while our_agents_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert our_agents_running() == []
    if signal_name == "SIGKILL":  # its copy stays until the next rtvirt on the target cleans up
        assert list(Path("/var/tmp/rtvirt/runs").glob("timer-*"))
        again = run_cli("probe", "timer", *target_args(server), "--duration", "200ms", "--results", str(results))
        assert again.returncode == 0, again.stderr
        assert not list(Path("/var/tmp/rtvirt/runs").glob("timer-*"))
        cleaned = [json.loads(p.read_text())["target"]["leftovers_before"]
                   for p in results.glob("runs/*/manifest.json")]
        assert any("stream copy" in item for found in cleaned for item in found)
    if signal_name == "SIGTERM":
        summary = json.loads(out)
        assert summary["status"] == "partial" and summary["end_reason"] == "signal", err
        assert summary["summary"]["all"]["samples"] > 100


LAB_SCENARIO = '''
name = "lab-matrix"
duration = "1.5s"
repetitions = 2
[hooks]
[[hooks.before_run]]
argv = ["true"]
environments = ["board"]    # renamed with the environment
[workload]
probe = "timer"
params = { interval = "1ms" }
[[environments]]
kind = "ssh"
name = "board"
host = "placeholder"        # each target of the inventory takes its place
[[disturbances]]
name = "solo"
[[disturbances]]
name = "beside"
[[disturbances.stressors]]
stressor = "cpu"
where = "other-core"
[timeline]
start_order = ["test-first", "stress-first"]
'''


def _lab_matrix_files(server: SshServer, second_server: SshServer, tmp_path: Path) -> tuple[Path, Path, Path]:
    """The inventory of two targets (ecu-a, ecu-b), LAB_SCENARIO, and where the results go."""
    inventory = tmp_path / "lab.toml"
    inventory.write_text(f'[[targets]]\nname = "ecu-a"\n{_fields_toml(server)}\n'
                         f'[[targets]]\nname = "ecu-b"\n{_fields_toml(second_server)}\n')
    scenario = tmp_path / "lab-matrix.toml"
    scenario.write_text(LAB_SCENARIO)
    return inventory, scenario, tmp_path / "results"


def test_lab_runs_a_scenario_matrix_on_every_target_and_resumes(server: SshServer, second_server: SshServer,
                                                                tmp_path: Path) -> None:
    import signal

    inventory, scenario, results = _lab_matrix_files(server, second_server, tmp_path)
    args = [*RTVIRT, "lab", str(inventory), "--scenario", str(scenario), "--results", str(results), "--json"]
    # interrupted once every target has finished a run: Ctrl-C stops both campaigns, --resume finishes them
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len({json.loads(p.read_text())["environment"] for p in results.glob("runs/*/manifest.json")}) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        # each target's campaign is a process of its own, in a session of its own (the lab forwards Ctrl-C)
        campaigns = _campaign_processes(proc.pid)
        assert len(campaigns) == 2 and all(os.getsid(pid) == pid for pid in campaigns), campaigns
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "--resume" in err
    assert our_agents_running() == []
    first = {t["name"]: t for t in json.loads(out)["targets"]}
    assert all(t["interrupted"] for t in first.values()), first
    result = run_cli("lab", str(inventory), "--scenario", str(scenario), "--results", str(results), "--resume",
                     "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    for name, target in ((t["name"], t) for t in outcome["targets"]):
        assert target["campaign_id"] == first[name]["campaign_id"]  # the same campaign, continued
        # the whole matrix: solo and beside (two start orders), two repetitions each
        assert sorted(target["runs"]) == sorted(f"{name}/{d}/{o}/r{r}" for d, o in
                                                (("solo", "-"), ("beside", "test-first"), ("beside", "stress-first"))
                                                for r in (1, 2)), target["runs"]
        # every run finished (short: the timer on this loaded machine overran periods, counted as overruns)
        assert set(target["runs"].values()) <= set(RAN), target["runs"]
    manifests = [json.loads(p.read_text()) for p in results.glob("runs/*/manifest.json")]
    by_target: dict[str, list[dict]] = {}
    for manifest in manifests:
        if manifest["status"] in RAN:  # the finished runs, not the interrupted one's partial samples
            by_target.setdefault(manifest["environment"], []).append(manifest)
    assert {name: len(runs) for name, runs in by_target.items()} == {"ecu-a": 6, "ecu-b": 6}
    for name, runs in by_target.items():
        port = server.port if name == "ecu-a" else second_server.port
        assert all(m["environment_detail"]["port"] == port for m in runs)
    # at the same time: each target's first run overlaps the other's
    starts = sorted(min(m["stream_header"]["start_realtime_ns"] for m in runs) for runs in by_target.values())
    assert starts[1] - starts[0] < 1.5e9
    report = Path(outcome["report"]).read_text()
    assert "ecu-a" in report and "ecu-b" in report
    assert our_agents_running() == []


def _campaign_processes(lab_pid: int) -> list[int]:
    """The lab's campaign processes (its children running rtvirt.campaign.labworker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == lab_pid and b"rtvirt.campaign.labworker" in command:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_lab_takes_its_campaigns_along_and_they_stop_their_agents(server: SshServer,
                                                                           second_server: SshServer,
                                                                           tmp_path: Path) -> None:
    import signal

    inventory, scenario, results = _lab_matrix_files(server, second_server, tmp_path)
    scratch_before = set(Path(tempfile.gettempdir()).glob("rtvirt-lab-*"))
    proc = subprocess.Popen([*RTVIRT, "lab", str(inventory), "--scenario", str(scenario), "--results", str(results)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(campaigns := _campaign_processes(proc.pid)) < 2 or our_agents_running() == []:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    # the kernel sends each campaign SIGTERM (PR_SET_PDEATHSIG): it stops its run as Ctrl-C does and ends
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in campaigns) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in campaigns)
    assert our_agents_running() == []
    # the campaigns' outcomes had no reader: the last campaign removed the lab's scratch directory
    assert set(Path(tempfile.gettempdir()).glob("rtvirt-lab-*")) <= scratch_before
    states = [json.loads(p.read_text()) for p in results.glob("campaigns/*/state.json")]
    assert len(states) == 2 and not any(state["finished"] for state in states)


def test_lab_scenario_refuses_other_kinds(tmp_path: Path) -> None:
    inventory = tmp_path / "lab.toml"
    inventory.write_text('[[targets]]\nname = "a"\nhost = "127.0.0.1"\nport = 1\n')
    result = run_cli("lab", str(inventory), "--scenario", "default", "--results", str(tmp_path / "r"))
    assert result.returncode == 2 and "environments[0].kind" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("lab", str(inventory), "--scenario", "default", "-D", "1s")
    assert result.returncode == 2 and "--duration" in result.stderr
    result = run_cli("lab", str(inventory), "--scenario", "default", "--resume", "--scale", "0.1")
    assert result.returncode == 2 and "--scale" in result.stderr
    result = run_cli("lab", str(inventory), "--resume")
    assert result.returncode == 2 and "--resume" in result.stderr and "--scenario" in result.stderr


def test_merge_stream_copy_keeps_the_longer_of_two_agreeing_streams(tmp_path: Path) -> None:
    """The received stream and the agent's copy on the target: one is a prefix of the other, never different."""
    from rtvirt.errors import RunError
    from rtvirt.remote import merge_stream_copy

    local, fetched = tmp_path / "samples.rtvs", tmp_path / "copy.rtvs"
    local.write_bytes(b"abcdef")
    fetched.write_bytes(b"abcdefgh")  # the agent wrote on after the connection went
    assert merge_stream_copy(local, fetched) == 2 and local.read_bytes() == b"abcdefgh"
    fetched.write_bytes(b"abc")  # killed with its target (a reboot) before its copy caught up
    assert merge_stream_copy(local, fetched) == 0 and local.read_bytes() == b"abcdefgh"
    fetched.write_bytes(b"abXdefghij")
    with pytest.raises(RunError, match="differs"):
        merge_stream_copy(local, fetched)
    assert local.read_bytes() == b"abcdefgh" and not fetched.exists()


@pytest.mark.quiet  # it names what ran on the measured CPU: another test's stressor there would be named too
def test_probe_explain_on_a_target_names_what_ran_there_and_leaves_its_tracefs_as_found(
        server: SshServer, tmp_path: Path) -> None:
    """`rtvirt probe timer --target ... --explain`: the target's own tracefs records its measured CPU (through a
    connection of its own, argument vectors only); our cpu stressor holding that CPU 1 ms of every 5 ms at
    SCHED_FIFO 90 on the target is named as the outliers' main cause with its pid, the agent's own threads are
    told apart by the pid its wrapper announced, and no instance is left on the target."""
    from rtvirt.explain.stored import read_explanation
    from rtvirt.stressors import start_stressor

    measured = max(os.sched_getaffinity(0))
    instances = Path("/sys/kernel/tracing/instances")
    before = sorted(entry.name for entry in instances.iterdir()) if instances.exists() else []
    results = tmp_path / "results"
    with start_stressor("cpu", {"cpus": [measured], "workers": 1, "priority": 90, "slice": "1ms", "period": "5ms",
                                "duration": 0}) as stressor:
        time.sleep(0.3)
        with cpus_of_rtvirt_while_probing() as rtvirt_cpus:
            done = run_cli("probe", "timer", *target_args(server), "--explain", "--explain-threshold", "300us",
                       "--explain-top", "5000",
                           "-D", "3s", "-a", str(measured), "-p", "80", "-i", "1013us", "--results",
                           str(results), "--no-progress", "--json", timeout=180)
        workers = {int(task.name) for task in Path(f"/proc/{stressor.pid}/task").iterdir()}
        for task in list(workers):
            workers |= {int(child) for child in (Path(f"/proc/{stressor.pid}/task/{task}/children")
                                                 .read_text().split())}
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    manifest = manifest_of(results)
    assert manifest["explain"]["layers"] == {"host": "seen"}, manifest["explain"]
    # the target is this machine: our own threads (the connection's, receiving samples and trace) kept off the
    # measured CPU while the probe ran there, where the scheduler had put them beside it and they were named
    others = cpu_list(set(os.sched_getaffinity(0)) - {measured})
    assert rtvirt_cpus == {others} and f"kept to CPUs {others}, off the measured {measured}" in \
        manifest["target"]["controller"], (rtvirt_cpus, manifest["target"])
    shown = json.loads(run_cli("explain", run["path"], "--json", check=True).stdout)
    named = [part for outlier in shown["worst"] for part in outlier["parts"]
             if part["detail"].get("pid") in workers and part["detail"].get("comm") == "rtvirt-stress"]
    # its policy asked of the target's kernel (/proc/PID/stat there) while it still ran; pooled as one culprit
    assert named and {part["culprit"] for part in named} == {"task rtvirt-stress SCHED_FIFO 90"}, named[:5]
    tasks_named = [row for row in shown["summary"] if str(row["culprit"]).startswith("task ")]  # the main task
    assert tasks_named[0]["culprit"] == "task rtvirt-stress SCHED_FIFO 90", tasks_named[:3]  # culprit
    explanation = read_explanation(Path(run["path"]))
    assert explanation is not None
    agent_parts = [part for part in explanation.parts if part.kind == "agent"]
    assert all("rtvirt-probe" in part.cause for part in agent_parts)  # its threads, found by its pid
    # (its other threads, the writer, are tasks named as the agent's)
    assert all("(the agent's writer or reader)" in part.cause for part in explanation.parts
               if part.kind == "task" and "rtvirt-probe" in part.cause)
    after = sorted(entry.name for entry in instances.iterdir())
    assert after == before  # the target's tracefs as found
    assert our_agents_running() == []


def test_a_targets_task_policies_are_read_there_whatever_their_comm(server: SshServer) -> None:
    """The policies of a target's tasks come from its /proc/PID/stat, read over the connection: a comm made to
    look like stat fields does not shift them, and a task that ended is left out."""
    from rtvirt.explain.remote import RemoteTracefs
    from rtvirt.remote.connection import connect

    script = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(15, b'x) R 1 (2 3', 0, 0, 0); "
              "os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(5)); print(flush=True); sys.stdin.read()")
    with subprocess.Popen(["true"]) as ended:
        pass  # reaped: its pid names no task
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as odd:
        assert odd.stdout is not None and odd.stdout.readline() == b"\n"
        assert Path(f"/proc/{odd.pid}/comm").read_text() == "x) R 1 (2 3\n"
        with connect(server.target()) as connection:
            read = RemoteTracefs(connection, "board").policies({odd.pid, os.getpid(), ended.pid})
        odd.communicate(b"")
    # with its comm, so that a pid reused since the trace is not taken for the traced task
    own = Path("/proc/self/comm").read_text().strip()
    assert read == {odd.pid: ("SCHED_RR", "x) R 1 (2 3"), os.getpid(): ("SCHED_OTHER", own)}, read


@pytest.mark.quiet  # it names what ran on the measured CPU: another test's stressor there would be named too
def test_the_flight_recorder_drains_a_targets_trace_pipes_over_its_connection(server: SshServer,
                                                                              tmp_path: Path) -> None:
    """On a target the flight recorder reads the target's trace_pipe files while the run goes (a reader there,
    stopped at the end) and keeps, within its bound, the trace around the samples that can become outliers: a
    6 s run at 1 kHz beside our FIFO stressor (1 ms of every 5 ms), with a 256 KiB bound that the run's whole
    trace overflows, still names the stressor in outliers of its first half. The target (this machine, over
    loopback) keeps no reader and no instance."""
    from rtvirt.explain.config import ExplainConfig
    from rtvirt.explain.host import HostSource
    from rtvirt.explain.recorder import KeepRule
    from rtvirt.explain.remote import RemoteTracefs
    from rtvirt.explain.session import ExplainSession
    from rtvirt.probes import PROBES
    from rtvirt.probes.runner import run_probe
    from rtvirt.remote.connection import connect
    from rtvirt.stressors import start_stressor

    measured = max(os.sched_getaffinity(0))
    instances = Path("/sys/kernel/tracing/instances")
    before = sorted(entry.name for entry in instances.iterdir()) if instances.exists() else []
    spec = PROBES["timer"]
    params = spec.params(affinity=[measured], priority=80, interval="1013us", duration="6s")
    config = ExplainConfig.model_validate({"threshold": "300us", "top": 5000})
    samples, pids = tmp_path / "timer.rtvs", []
    with connect(server.target()) as connection, \
            start_stressor("cpu", {"cpus": [measured], "workers": 1, "priority": 90, "slice": "1ms",
                                   "period": "5ms", "duration": 0}) as stressor:
        source = HostSource((measured,), access=RemoteTracefs(connection, "board"), keep=KeepRule(300_000, 5000),
                            keep_kb=256)
        session = ExplainSession(config, [source])
        session.start(samples)
        try:
            assert source.recorder is not None, source.instance.problems  # draining the target's pipe
            # the target's (this machine's) reader, kept off the measured CPU: each event wakes it, and there
            # every wake-up made new events (on a 6.18 kernel the bound then kept no outlier's trace)
            readers = _pipe_readers(wait_for=1)
            others = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0) - {measured}))
            assert len(readers) == 1 and readers[0].endswith(f" on cpus {others}"), readers
            stream = run_probe(spec, params, samples, on_launch=pids.append)
        finally:
            session.stop()
        workers = {int(task.name) for task in Path(f"/proc/{stressor.pid}/task").iterdir()}
        for task in list(workers):
            workers |= {int(child) for child in (Path(f"/proc/{stressor.pid}/task/{task}/children")
                                                 .read_text().split())}
        explanation = session.explain(stream, pids)
    recorder = source.recorder
    assert 0 < recorder.peak_bytes()[measured] <= 256 * 1024
    assert recorder.dropped_lines > 0, recorder.peak_bytes()  # the bound mattered: the whole trace did not fit
    start = int(stream.header["start_monotonic_ns"])
    early = {part.rank for part in explanation.parts if part.sample_t_ns - start < 3_000_000_000
             and part.cause.startswith("task rtvirt-stress/")
             and int(part.cause.split("/")[1].split()[0]) in workers}
    assert early, sorted({part.cause for part in explanation.parts})[:10]
    print(f"recorder over ssh: peak {recorder.peak_bytes()[measured]} bytes, {recorder.dropped_lines} lines dropped, "
          f"{len({p.rank for p in explanation.parts})} outliers explained, {len(early)} in the first 3 s named "
          f"the stressor; samples came up to {recorder.max_lag_ns / 1e6:.0f} ms after their window")
    assert _pipe_readers() == []
    assert sorted(entry.name for entry in instances.iterdir()) == before
    # a controller that dies (kill -9) loses its connection: the reader ends with it and frees the instance
    instance = instances / f"rtvirt-{os.getpid()}-lost"
    instance.mkdir()
    try:
        with connect(server.target()) as connection:
            RemoteTracefs(connection, "board").open_pipe(str(instance / "per_cpu" / "cpu0" / "trace_pipe"), [0])
            assert len(_pipe_readers(wait_for=1)) == 1
            assert server.kill_sessions() > 0
            assert _pipe_readers(wait_for=0) == []
    finally:
        instance.rmdir()  # EBUSY while a reader held its pipe


def _pipe_readers(wait_for: int | None = None) -> list[str]:
    """The command lines of the processes reading an rtvirt instance's trace_pipe (``wait_for``: until there are
    that many, 30 s at most: a reader starts, and ends, a moment after its channel)."""
    deadline = time.monotonic() + 30
    while True:
        lines = _readers_now()
        if wait_for is None or len(lines) == wait_for or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def _readers_now() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if line.startswith("cat -- ") and "/instances/rtvirt-" in line and line.rstrip().endswith("/trace_pipe"):
                with contextlib.suppress(OSError):
                    allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", (entry / "status").read_text())
                    lines.append(f"{line.rstrip()} on cpus {allowed[1] if allowed else '?'}")
    return lines
