"""The libvirt environment against Debian's real libvirtd: fifo vCPUs measured end to end, libvirt stressor
guests, rtvirt design -> scenario -> run, kill -9 + --resume without stray domains, qemu+libssh over a real
sshd, and malformed environment tables rejected with their field path."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FIFO_TASK_ON_THE_VCPUS_PCPU,
    RAN,
    assert_given_host_tsc_rate,
    assert_ran,
    run_cli,
    steal_live_stream,
)
from sshd_server import SshServer

from rtvirt.agents import agent_args
from rtvirt.environments import SharedResources
from rtvirt.environments.libvirt import (
    DOMAIN_PREFIX,
    LibvirtConfig,
    LibvirtConnection,
    LibvirtEnvironment,
    RtThrottlingLifted,
    hugepage_problem,
)
from rtvirt.environments.libvirt.connection import _libvirt
from rtvirt.environments.libvirt.host import _meminfo_kib, _mounts, _v1_cpu_controller
from rtvirt.environments.libvirt.rt_throttling import RT_SYSCTL
from rtvirt.environments.tcg_clock import host_cycles_khz
from rtvirt.errors import InputError, RunError
from rtvirt.probes import PROBES
from rtvirt.procs import Supervisor
from rtvirt.scenario.loader import parse_scenario
from rtvirt.store import load_run
from rtvirt.stream import StreamReader, read_stream

URI = "qemu:///system"
DAEMONS = (("virtlogd", Path("/run/virtlogd.pid")), ("libvirtd", Path("/run/libvirtd.pid")))
CPUS = sorted(os.sched_getaffinity(0))
MEASURED, EMULATOR = CPUS[-1], CPUS[0]
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
GUEST_MIB = 256  # the default guest memory: what the fifo domain backs with hugepages
LIBVIRT_TESTS_LOCK = Path("/run/lock/rtvirt-libvirt-tests.lock")
LOCK_WAIT_S = 900.0  # another session's whole libvirt file takes ~5 min on a loaded 2-core machine
TWO_CPUS = pytest.mark.skipif(len(CPUS) < 2, reason="vCPU and emulator pinning apart need two CPUs")


def _daemon_running(name: str, pidfile: Path) -> bool:
    try:
        return Path(f"/proc/{int(pidfile.read_text().strip())}/comm").read_text().strip() == name
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _sole_libvirt_session() -> Iterator[None]:
    """Hold the machine-wide lock of these tests: two test sessions (a developer's and a clean-clone CI run)
    share the one qemu:///system libvirtd, and the one that started it stops it under the other's runs
    (seen: the other's domains gone, its next runs failing); the second session waits its turn."""
    with LIBVIRT_TESTS_LOCK.open("a+") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    pytest.fail(f"another test session (pid {lock.read()[:20].strip() or '?'}) held "
                                f"{LIBVIRT_TESTS_LOCK} for {LOCK_WAIT_S:.0f}s: libvirtd is in use")
                time.sleep(1)
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.truncate(0)


def _reserve_hugepages(pages: int) -> None:
    """Ask the kernel for ``pages`` hugepages. Memory that other tests' guests and Xen labs hold in pieces may
    have no free 2 MB runs left (seen in a parallel make test: 124 of the 128 needed): then compact it, let
    the page cache go, and ask again."""
    for _attempt in range(5):
        NR_HUGEPAGES.write_text(f"{pages}\n")
        if hugepage_problem(GUEST_MIB) is None:
            return
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        Path("/proc/sys/vm/compact_memory").write_text("1\n")
        time.sleep(1)


@pytest.fixture(scope="module")
def libvirtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's virtlogd and libvirtd (no systemd here), started for these tests and stopped after this file
    (not at the end of the whole suite), with hugepages for one guest reserved and hugetlbfs mounted before
    libvirtd starts (it looks for mounts then); all of it undone afterwards. The daemons log warnings and
    errors to libvirtd.log / virtlogd.log in pytest's base temporary directory (LIBVIRTD_TEST_FILTERS sets
    libvirt's log filters, e.g. "1:qemu 3:*" for debug)."""
    with _sole_libvirt_session():
        yield from _libvirtd_for_tests(tmp_path_factory)


def _libvirtd_for_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    libvirt = _libvirt()
    pages_before = int(NR_HUGEPAGES.read_text())
    mounted = None
    if not any(len(fields) > 2 and fields[2] == "hugetlbfs" for fields in _mounts()):
        mounted = Path("/dev/hugepages")
        mounted.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "hugetlbfs", str(mounted)], check=True)
    machine_cgroups_before = set(Path("/sys/fs/cgroup").glob("*/machine"))
    page_kib = _meminfo_kib("Hugepagesize") or 2048
    _reserve_hugepages(pages_before + GUEST_MIB * 1024 // page_kib + 4)
    started = []
    for name, pidfile in DAEMONS:
        if not _daemon_running(name, pidfile):
            log = tmp_path_factory.getbasetemp() / f"{name}.log"
            env = {**os.environ, "LIBVIRT_LOG_OUTPUTS": f"1:file:{log}",
                   "LIBVIRT_LOG_FILTERS": os.environ.get("LIBVIRTD_TEST_FILTERS", "3:*")}
            started.append(subprocess.Popen([f"/usr/sbin/{name}"], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True, env=env))
    deadline = time.monotonic() + 30
    while True:
        try:
            libvirt.open(URI).close()
            break
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        assert hugepage_problem(GUEST_MIB) is None, hugepage_problem(GUEST_MIB)
        assert mounted is None or any(Path(p.args[0]).name == "libvirtd" for p in started), \
            "libvirtd ran before hugetlbfs was mounted for these tests and will not see it: restart libvirtd"
        yield URI
    finally:
        with SharedResources() as shared:  # a failed test must not leave domains or a lifted RT limit
            LibvirtEnvironment.reclaim(LibvirtConfig(uri=URI), shared)
        for proc in reversed(started):
            proc.terminate()
            proc.wait(timeout=30)
        NR_HUGEPAGES.write_text(f"{pages_before}\n")
        # the daemon we started made its "machine" partition in every hierarchy: empty now, so remove it
        for cgroup in set(Path("/sys/fs/cgroup").glob("*/machine")) - machine_cgroups_before:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=True)


def _our_domains(uri: str = URI) -> list[str]:
    with SharedResources() as shared:
        connection = shared.get("c", lambda: LibvirtConnection(uri))
        return sorted(d.name() for d in connection.conn.listAllDomains(0) if d.name().startswith(DOMAIN_PREFIX))


def _vcpu_threads(domain_label: str) -> tuple[int, list[int]]:
    """(QEMU pid, its vCPU thread ids) of the running domain named rtvirt-<label>-..."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(f"guest={DOMAIN_PREFIX}{domain_label}-".encode()) for arg in cmdline):
            tids = [int(t.name) for t in (entry / "task").iterdir()
                    if (t / "comm").read_text().startswith("CPU ")]
            return int(entry.name), tids
    return 0, []


def _scenario(path: Path, duration: str, environment: str, disturbances: str = '[[disturbances]]\nname = "solo"\n',
              ) -> Path:
    path.write_text(f'name = "lv"\nduration = "{duration}"\n[workload]\nprobe = "timer"\n'
                    f'[workload.params]\ninterval = "1ms"\n[[environments]]\n{environment}\n{disturbances}')
    return path


def _run_until_streaming(scenario: Path, results: Path, label: str) -> tuple[subprocess.Popen[bytes], int, list[int]]:
    """`rtvirt run` started in the background and left running once its domain streams samples: the
    process, QEMU's pid and its vCPU thread ids."""
    log = results.parent / f"{label}-run.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "rtvirt", "run", str(scenario), "--out", str(results),
                                 "--no-progress"], stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    pid, tids = 0, []
    while time.monotonic() < deadline and proc.poll() is None:
        streams = list(results.glob("runs/*/samples.rtvs"))
        pid, tids = _vcpu_threads(label)
        if tids and streams and streams[0].stat().st_size > 2000:
            break
        time.sleep(0.2)
    assert tids and proc.poll() is None, f"the domain did not start streaming samples: {log.read_text()[-2000:]}"
    return proc, pid, tids


FIFO_ENV = (f'kind = "libvirt"\nname = "lv"\ndomain_type = "qemu"\ncpus = [{MEASURED}]\nemulator_cpus = [{EMULATOR}]\n'
            'numa_nodes = [0]\nvcpu_sched = {policy = "fifo", priority = 10}\nhugepages = true')


@TWO_CPUS
@pytest.mark.vm
def test_fifo_pinned_domain_killed_with_9_is_reclaimed_and_resumed(libvirtd: str, tmp_path: Path) -> None:
    """A domain with vcpupin, emulatorpin and fifo vCPUs, measured end to end through `rtvirt run`; kill -9
    leaves it running, --resume destroys and undefines it, restores the RT limit, and redoes the run."""
    rt_before = int(RT_SYSCTL.read_text())
    hugepages_free = _meminfo_kib("HugePages_Free") or 0
    lifts = _v1_cpu_controller() is not None and os.geteuid() == 0 and rt_before >= 0
    results = tmp_path / "results"
    proc, pid, tids = _run_until_streaming(_scenario(tmp_path / "kill.toml", "6s", FIFO_ENV), results, "lv")
    # what the XML asked for, applied for real by libvirt to QEMU's threads
    assert os.sched_getscheduler(tids[0]) == os.SCHED_FIFO and os.sched_getparam(tids[0]).sched_priority == 10
    assert os.sched_getaffinity(tids[0]) == {MEASURED} and os.sched_getaffinity(pid) == {EMULATOR}
    # guest RAM taken from the reserved hugepages
    page_kib = _meminfo_kib("Hugepagesize") or 2048
    assert hugepages_free - (_meminfo_kib("HugePages_Free") or 0) >= GUEST_MIB * 1024 // page_kib
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stray = _our_domains()
    assert len(stray) == 1 and stray[0].startswith(f"{DOMAIN_PREFIX}lv-")
    assert int(RT_SYSCTL.read_text()) == (-1 if lifts else rt_before)

    resumed = run_cli("run", "--no-report", "--resume", "--out", str(results), "--no-progress", timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:] + resumed.stdout[-2000:]
    assert f"reclaimed libvirt domain {stray[0]}" in resumed.stdout + resumed.stderr
    assert _our_domains() == [] and int(RT_SYSCTL.read_text()) == rt_before
    with SharedResources() as shared:
        volumes = shared.get("c", lambda: LibvirtConnection(URI)).pool().listVolumes()
    assert f"{stray[0]}.initrd" not in volumes
    state = json.loads(next(results.glob("campaigns/*/state.json")).read_text())
    entry = state["runs"]["lv/solo/-/r1"]
    assert entry["status"] in RAN and len(entry["salvaged"]) == 1
    manifest = load_run(results / "runs" / entry["run_id"]).manifest
    detail = manifest["environment_detail"]
    assert manifest["summary"]["all"]["samples"] > 1000 and manifest["summary"]["all"]["dropped"] == 0
    xml = detail["domain_xml"]
    for applied in (f"<vcpupin vcpu='0' cpuset='{MEASURED}'/>", f"<emulatorpin cpuset='{EMULATOR}'/>",
                    "<vcpusched vcpus='0' scheduler='fifo' priority='10'/>", "<memory mode='strict' nodeset='0'/>",
                    "<domain type='qemu'", "<hugepages/>"):
        assert applied in xml
    assert detail["boot_seconds"] > 0 and detail["channel_bytes"] > 0
    assert any("type qemu" in w for w in manifest["system"]["warnings"])
    assert (detail["rt_throttling_lifted"] is not None) == lifts
    partial = load_run(results / "runs" / entry["salvaged"][0]).manifest
    assert partial["status"] == "partial" and partial["summary"]["all"]["samples"] > 0


@TWO_CPUS
@pytest.mark.vm
def test_sigterm_mid_run_destroys_the_domain_and_restores_rt_throttling(libvirtd: str, tmp_path: Path) -> None:
    rt_before = int(RT_SYSCTL.read_text())
    results = tmp_path / "results"
    env = (f'kind = "libvirt"\nname = "lvt"\ndomain_type = "qemu"\ncpus = [{MEASURED}]\nemulator_cpus = [{EMULATOR}]\n'
           'vcpu_sched = {policy = "rr", priority = 7}')
    proc, _, tids = _run_until_streaming(_scenario(tmp_path / "term.toml", "60s", env), results, "lvt")
    assert os.sched_getscheduler(tids[0]) == os.SCHED_RR and os.sched_getparam(tids[0]).sched_priority == 7
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    assert _our_domains() == [] and int(RT_SYSCTL.read_text()) == rt_before
    with SharedResources() as shared:
        volumes = shared.get("c", lambda: LibvirtConnection(URI)).pool().listVolumes()
    assert not [v for v in volumes if v.startswith(f"{DOMAIN_PREFIX}lvt-")]
    manifest = load_run(next(results.glob("runs/*")).resolve()).manifest
    assert manifest["status"] == "partial" and manifest["summary"]["all"]["samples"] > 0
    assert "--resume" in (tmp_path / "lvt-run.log").read_text()


@TWO_CPUS
@pytest.mark.vm
def test_a_guest_reset_from_outside_fails_its_run_with_qemus_reason(libvirtd: str, tmp_path: Path) -> None:
    """libvirt says "shut off" however a domain ended (ours are destroyed when the guest resets: on_reboot);
    QEMU's SHUTDOWN event says why, and the run's failure carries it."""
    results = tmp_path / "results"
    scenario = _scenario(tmp_path / "reset.toml", "60s", 'kind = "libvirt"\nname = "lvr"\ndomain_type = "qemu"')
    proc, _, _ = _run_until_streaming(scenario, results, "lvr")
    (domain,) = [name for name in _our_domains() if name.startswith(f"{DOMAIN_PREFIX}lvr-")]
    reset = subprocess.run(["virsh", "-c", URI, "qemu-monitor-command", domain, '{"execute": "system_reset"}'],
                           capture_output=True, text=True, timeout=60)
    assert reset.returncode == 0, reset.stderr
    assert proc.wait(timeout=180) == 1, (results.parent / "lvr-run.log").read_text()[-2000:]
    state = json.loads(next(results.glob("campaigns/*/state.json")).read_text())
    entry = state["runs"]["lvr/solo/-/r1"]
    assert entry["status"] == "failed", entry
    # the first event's reason, not the "host-signal" of the SHUTDOWN that libvirt's kill of QEMU makes next
    assert "the guest stopped before its agent finished (QEMU: shutdown, host-qmp-system-reset: the guest was " \
           "reset over QEMU's monitor)" in entry["reason"], entry
    assert not [name for name in _our_domains() if name.startswith(f"{DOMAIN_PREFIX}lvr-")]


@pytest.mark.vm
def test_other_vm_stress_is_a_second_libvirt_domain(libvirtd: str, tmp_path: Path) -> None:
    env = f'kind = "libvirt"\nname = "lv2"\ndomain_type = "qemu"\ncpus = [{MEASURED}]'
    disturbance = ('[[disturbances]]\nname = "neighbour"\n'
                   '[[disturbances.stressors]]\nstressor = "cpu"\nwhere = "other-vm"\n'
                   '[timeline]\nstart_order = ["stress-first"]\nsettle = "0.5s"\n')
    scenario = _scenario(tmp_path / "vm.toml", "2s", env, disturbance)
    result = run_cli("run", "--no-report", str(scenario), "--out", str(tmp_path / "results"), "--no-progress", "--json",
                     timeout=240)
    assert_ran(result)
    (key, run), = json.loads(result.stdout[result.stdout.index("{"):])["runs"].items()
    assert run["status"] in RAN, run
    manifest = load_run(tmp_path / "results" / "runs" / run["run_id"]).manifest
    assert [e["event"] for e in manifest["timeline"]][:1] == ["stress-on"]  # stress-first: the guest booted
    assert manifest["environment_detail"]["domain"].startswith(f"{DOMAIN_PREFIX}lv2-")
    assert _our_domains() == []


@TWO_CPUS
@pytest.mark.vm
def test_a_design_runs_as_a_libvirt_scenario_without_editing(libvirtd: str, tmp_path: Path) -> None:
    model = tmp_path / "pair.toml"
    model.write_text(f'name = "pair"\n[hypervisor]\nscheduler = "fifo"\npcpus = {len(CPUS)}\n'
                     f'[[vm]]\nname = "ctl"\nvcpu = [{{affinity = [{MEASURED}]}}]\n'
                     'task = [{name = "loop", period = "1ms", execution = "100us", priority = 2}]\n'
                     f'[[vm]]\nname = "web"\nvcpu = [{{affinity = [{MEASURED}]}}]\nload = 0.3\n')
    out = tmp_path / "configs"
    designed = run_cli("design", str(model), "-s", "fifo-periodic", "--out", str(out), "--results",
                       str(tmp_path / "designs"))
    assert designed.returncode == 0, designed.stderr
    scenario_file = out / "fifo-periodic" / "scenario-libvirt.toml"
    scenario = parse_scenario(scenario_file.read_text())
    cputune = (out / "fifo-periodic" / "libvirt-ctl.xml").read_text()
    assert scenario.environments[0].kind == "libvirt" and scenario.environments[0].cputune == cputune
    result = run_cli("run", "--no-report", str(scenario_file), "--scale", "0.05", "--out", str(tmp_path / "results"),
                     "--no-progress", "--json", timeout=240)
    assert_ran(result)
    runs = json.loads(result.stdout[result.stdout.index("{"):])["runs"]
    assert {r["status"] for r in runs.values()} <= set(RAN) and len(runs) == 2
    manifest = load_run(tmp_path / "results" / "runs" / runs["ctl/solo/-/r1"]["run_id"]).manifest
    assert f"<vcpupin vcpu='0' cpuset='{MEASURED}'/>" in manifest["environment_detail"]["domain_xml"]
    assert "scheduler='fifo' priority='90'" in manifest["environment_detail"]["domain_xml"]
    assert _our_domains() == []


@TWO_CPUS
@pytest.mark.vm
def test_remote_uris_over_a_real_sshd(libvirtd: str, tmp_path: Path) -> None:
    """qemu+ssh://root@127.0.0.1:PORT/system, through the ssh binary as users write it: the images travel
    over the connection (storage pool upload), the samples come back over it (virDomainOpenChannel).
    qemu+libssh with a known_hosts file pins the host key: a mismatch is refused. The measured run is an
    `rtvirt run` of its own, killed at a timeout: a libvirtd that hangs fails this test, not the suite."""
    with SshServer() as server:
        libssh = (f"qemu+libssh://{server.user}@127.0.0.1:{server.port}/system?keyfile={server.client_key}"
                  "&known_hosts={}&no_tty=1&sshauth=privkey")
        LibvirtConnection(libssh.format(server.known_hosts)).close()
        bad_hosts = tmp_path / "known_hosts"
        bad_hosts.write_text(server.known_hosts.read_text().replace("127.0.0.1", "127.0.0.2"))
        with pytest.raises(RunError, match="cannot connect to qemu\\+libssh://"):
            LibvirtConnection(libssh.format(bad_hosts))
        # the ssh binary reads root's own known_hosts, which must not learn this throwaway host key: it is
        # told not to check it (the libssh URI above shows a pinned key)
        uri = (f"qemu+ssh://{server.user}@127.0.0.1:{server.port}/system?keyfile={server.client_key}"
               "&no_verify=1&no_tty=1")
        env = f'kind = "libvirt"\nname = "lvssh"\nuri = "{uri}"\ndomain_type = "qemu"\ncpus = [{MEASURED}]'
        result = run_cli("run", "--no-report", str(_scenario(tmp_path / "ssh.toml", "1s", env)), "--out",
                         str(tmp_path / "results"), "--no-progress", "--json", timeout=240)
        assert_ran(result)
        (key, run), = json.loads(result.stdout[result.stdout.index("{"):])["runs"].items()
        assert run["status"] in RAN, run
        # without the local sysctl/cgroup files, a refused fifo vcpusched is still explained
        with Supervisor() as supervisor:
            fifo = LibvirtEnvironment(LibvirtConfig(uri=uri, domain_type="qemu", cpus=(MEASURED,),
                                                    vcpu_sched={"policy": "fifo", "priority": 5}),
                                      supervisor, tmp_path / "fifo")
            try:
                if int(RT_SYSCTL.read_text()) >= 0 and _v1_cpu_controller() is not None:
                    with pytest.raises(RunError, match="rt_runtime_us = 0.*sched_rt_runtime_us=-1"):
                        fifo.launch("rtvirt-probe", ["timer", "--duration=1000000000"], None)
            finally:
                fifo.close()
    run_dir = tmp_path / "results" / "runs" / run["run_id"]
    detail = load_run(run_dir).manifest["environment_detail"]
    stream = read_stream(run_dir / "samples.rtvs")
    # every sample the agent wrote came back over the SSH connection (how many fit in 1 s depends on the load)
    assert stream.end_reason == "complete" and stream.records.size == stream.written > 0
    assert set(stream.dropped.values()) == {0}
    assert detail["uri"] == uri and detail["boot_seconds"] is not None
    assert _our_domains() == []


def test_a_host_over_ssh_is_reached_traced_and_disturbed_through_rtvirts_own_ssh(libvirtd: str,
                                                                                   tmp_path: Path) -> None:
    """host = "root@127.0.0.1:PORT" with ``ssh`` options (a key and a known_hosts file of this test's sshd, not
    root's own): libvirtd's socket is forwarded over rtvirt's SSH link to that host, which also traces the
    domain's vCPU pCPU (the VM layer), runs the same-core FIFO stressor there, and carries the clock exchange
    over a pipe channel whose FIFOs are made there. This machine's libvirtd runs QEMU as libvirt-qemu, not root,
    as a stock host's does. A host key that known_hosts does not trust is refused: the run fails naming it."""
    with SshServer() as server:
        where = (f'host = "{server.user}@127.0.0.1:{server.port}"\n'
                 f'ssh = {{ identity_file = "{server.client_key}", known_hosts = "{server.known_hosts}" }}\n')
        env = (f'kind = "libvirt"\nname = "over-ssh"\n{where}domain_type = "qemu"\ncpus = [{MEASURED}]\n'
               f'emulator_cpus = [{EMULATOR}]\nboot_timeout = "5m"')
        scenario = _scenario(tmp_path / "ssh.toml", "3s", env,
                             FIFO_TASK_ON_THE_VCPUS_PCPU + '[explain]\nthreshold = "1ms"\nlayers = ["vm"]\n')
        result = run_cli("run", "--no-report", str(scenario), "--out", str(tmp_path / "results"), "--no-progress",
                         timeout=600)
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        (run_dir,) = (tmp_path / "results" / "runs").iterdir()
        manifest = load_run(run_dir).manifest
        assert manifest["status"] in RAN, manifest["campaign"]
        detail = manifest["environment_detail"]
        assert detail["libvirtd"] == f"{server.user}@127.0.0.1:{server.port}:/run/libvirt/libvirt-sock " \
                                     "(over rtvirt's SSH)" and detail["uri"] is None, detail["libvirtd"]
        pipes = re.search(r"<channel type='pipe'>\s*<source path='(/tmp/rtvirt-clock\.\w{8})/clock'/>",
                          detail["domain_xml"])
        assert pipes, detail["domain_xml"]
        assert not Path(pipes[1]).exists(), "the clock FIFOs outlived their domain"
        assert manifest["explain"]["layers"]["vm"] == "seen", manifest["explain"]

        bad_hosts = tmp_path / "known_hosts"
        bad_hosts.write_text(server.known_hosts.read_text().replace("127.0.0.1", "127.0.0.2"))
        refused = _scenario(tmp_path / "refused.toml", "1s", env.replace(str(server.known_hosts), str(bad_hosts)))
        result = run_cli("run", "--no-report", str(refused), "--out", str(tmp_path / "refused"), "--no-progress",
                         timeout=300)
    # as a KVM host of the qemu kind that cannot be reached: the run fails naming why, the campaign goes on
    assert result.returncode == 1 and re.search(r"failed over-ssh/solo/-/r1: ssh target root@127\.0\.0\.1:\d+: its "
                                                r"host key is not trusted", result.stderr), result.stderr
    explained = json.loads(run_cli("explain", str(run_dir), "--json", check=True).stdout)
    layers = {layer["layer"]: layer for layer in explained["layers"]}
    assert any(note.startswith("guest clock aligned at start and end") for note in layers["vm"]["notes"]), \
        layers["vm"]["notes"]
    # the stressor is what held the vCPU back, most of the time after its thread was woken (by QEMU's main loop on
    # the emulator's CPU: the host's wake-ups are traced on every CPU; on the vCPU's pCPU alone, 68 of 70 holds
    # said "vCPU asleep, not woken yet" and the stressor was named in one)
    top = max(explained["summary"], key=lambda row: row["share"])
    assert top["cause"] == "task rtvirt-stress" and top["layer"] == "vm", explained["summary"][:5]
    assert _our_domains() == []


def test_hugepages_beyond_the_reserve_are_refused_before_a_domain_is_defined(libvirtd: str, tmp_path: Path) -> None:
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(LibvirtConfig(domain_type="qemu", memory=16384, hugepages=True), supervisor,
                                 tmp_path / "vm")
        try:
            with pytest.raises(RunError, match=r"16384 MiB need \d+ free hugepages .*vm.nr_hugepages"):
                env.launch("rtvirt-probe", ["timer", "--duration=1000000000"], None)
        finally:
            env.close()
    assert _our_domains() == []


def _libvirtd_can_lock(mib: int) -> bool:
    """Whether the running libvirtd may give QEMU ``mib`` of locked memory: CAP_SYS_RESOURCE (to raise the
    limit) or a hard RLIMIT_MEMLOCK that is already high enough (libvirt only lowers it then)."""
    pid = int(Path("/run/libvirtd.pid").read_text().strip())
    caps = re.search(r"^CapEff:\s+([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    hard = re.search(r"^Max locked memory\s+\S+\s+(\S+)", Path(f"/proc/{pid}/limits").read_text(), re.M)
    assert caps is not None and hard is not None
    return bool(int(caps.group(1), 16) & (1 << 24)) or hard.group(1) == "unlimited" or int(hard.group(1)) >= mib << 20


@pytest.mark.vm
def test_memory_locking_is_applied_or_refused_up_front_as_bad_input(libvirtd: str, tmp_path: Path) -> None:
    """Locking guest memory needs libvirtd to raise QEMU's RLIMIT_MEMLOCK (CAP_SYS_RESOURCE). Where libvirtd
    may, QEMU's memory is locked; where it may not (this container: no CAP_SYS_RESOURCE, `ulimit -l` 8 MiB),
    the scenario is refused before any domain exists: exit 2 naming memory_locked, the capability and the limit."""
    if not _libvirtd_can_lock(GUEST_MIB + 256):
        scenario = _scenario(tmp_path / "lock.toml", "1s", 'kind = "libvirt"\nmemory_locked = true')
        result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"))
        assert result.returncode == 2, result.stderr[-2000:]
        message = " ".join(result.stderr.split())
        assert "environments[0]" in message and "memory_locked = true" in message
        assert "CAP_SYS_RESOURCE" in message and "RLIMIT_MEMLOCK" in message and "hard limit is" in message
        assert "Traceback" not in result.stderr and not (tmp_path / "results" / "runs").exists()
        assert _our_domains() == []
        return
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(LibvirtConfig(domain_type="qemu", memory_locked=True), supervisor, tmp_path / "vm")
        try:
            env.launch("rtvirt-probe", ["timer", "--duration=1000000000"], None)
            pid, _ = _vcpu_threads("libvirt")
            vmlck = re.search(r"^VmLck:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
            assert vmlck is not None and int(vmlck.group(1)) >= GUEST_MIB * 1024
            assert "<locked/>" in env.describe()["domain_xml"]
        finally:
            env.close()
    assert _our_domains() == []


CACHETUNE = ("<cputune><cachetune vcpus='0'><cache id='0' level='3' type='both' size='2' unit='MiB'/></cachetune>"
             "</cputune>")


def test_cache_allocation_needs_resctrl_and_says_so_naming_the_field(tmp_path: Path) -> None:
    """<cachetune> goes through the kernel's resctrl: without it (this machine: a VM whose CPU offers no
    cache allocation) a local scenario is refused at load time naming cputune; with it, it loads."""
    text = _scenario(tmp_path / "cat.toml", "1s", f'kind = "libvirt"\ncputune = "{CACHETUNE}"').read_text()
    if Path("/sys/fs/resctrl/info").is_dir():
        assert "cachetune" in parse_scenario(text).environments[0].cputune  # type: ignore[union-attr]
        return
    with pytest.raises(InputError) as error:
        parse_scenario(text)
    assert "environments[0]" in str(error.value) and "cputune: <cachetune> needs the kernel's resctrl" in \
        str(error.value)
    # a remote host's resctrl is its own business: libvirt there decides
    remote = text.replace('kind = "libvirt"', 'kind = "libvirt"\nuri = "qemu+ssh://root@203.0.113.1/system"')
    assert parse_scenario(remote).environments[0].cputune is not None  # type: ignore[union-attr]


def test_numa_nodes_must_exist_on_a_local_host(tmp_path: Path) -> None:
    text = _scenario(tmp_path / "numa.toml", "1s", 'kind = "libvirt"\nnuma_nodes = [200]').read_text()
    with pytest.raises(InputError) as error:
        parse_scenario(text)
    assert "environments[0]" in str(error.value) and "numa_nodes: this host has no NUMA node 200 (online: 0" in \
        str(error.value)
    assert parse_scenario(text.replace("[200]", "[0]")).environments[0].numa_nodes == (0,)  # type: ignore[union-attr]


def test_domain_type_auto_follows_whether_kvm_accelerates(libvirtd: str, tmp_path: Path) -> None:
    """auto: type kvm only where a calibration boot under KVM showed it accelerates (else TCG, type qemu),
    with the reason in the manifest; this machine's /dev/kvm does not accelerate."""
    from rtvirt.environments.qemu import choose_accel

    decision = choose_accel("auto")
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(LibvirtConfig(), supervisor, tmp_path / "vm")
        try:
            env.start()
            described = env.describe()
        finally:
            env.close()
    assert described["domain_type"] == ("kvm" if decision["accel"] == "kvm" else "qemu")
    assert described["domain_type_reason"] == decision["reason"] and described["domain_type_reason"]
    if described["domain_type"] == "qemu":
        assert any("type qemu" in w for w in env.warnings())


def test_a_stopped_libvirtd_is_named_in_the_error(tmp_path: Path) -> None:
    uri = f"qemu+unix:///system?socket={tmp_path}/no-libvirtd.sock"
    with pytest.raises(RunError, match=f"cannot connect to {re.escape(uri)}: .*libvirtd must run"):
        LibvirtConnection(uri)


def test_a_libvirtd_that_stops_answering_fails_our_calls_instead_of_hanging(libvirtd: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A libvirtd that accepts connections but serves none (here: the real daemon, SIGSTOPped) must end a call
    with an error: blocked in libvirt's C code, the call is deaf to Ctrl-C and to pytest's timeout (a CI run
    hung so, in the qemu+ssh test, virt-ssh-helper connected and nothing answering). Keepalive closes an
    open connection; the opening, local or over ssh, is bounded by a timeout. Calls on the closed connection fail
    naming it lost, never with libvirt's own exception (a campaign in the KVM lab ended in a traceback of
    getCPUMap's "client socket is closed"), and a domain's description after its run does not need it."""
    libvirt = _libvirt()
    monkeypatch.setattr("rtvirt.environments.libvirt.connection.KEEPALIVE_INTERVAL_S", 1)
    monkeypatch.setattr("rtvirt.environments.libvirt.connection.KEEPALIVE_COUNT", 2)
    monkeypatch.setattr("rtvirt.environments.libvirt.connection.CONNECT_TIMEOUT_S", 3.0)
    pid = int(Path("/run/libvirtd.pid").read_text().strip())
    connection = LibvirtConnection(libvirtd)
    outcome: list[object] = []

    def call() -> None:  # in a thread: were the call to hang, the test fails instead of hanging with it
        try:
            outcome.append(connection.conn.listAllDomains(0))
        except Exception as exc:  # what ended it is the result
            outcome.append(exc)

    with SshServer() as server:
        over_ssh = (f"qemu+ssh://{server.user}@127.0.0.1:{server.port}/system?keyfile={server.client_key}"
                    "&no_verify=1&no_tty=1")
        os.kill(pid, signal.SIGSTOP)
        try:
            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            caller.join(timeout=60)
            assert outcome, "a call to a libvirtd that does not answer was still blocked after 60 s"
            assert isinstance(outcome[0], libvirt.libvirtError) and "keepalive" in str(outcome[0]), outcome
            lost = f"libvirt: the connection to libvirtd at {re.escape(libvirtd)} was lost .*keepalive for 2 s"
            assert re.match(lost, str(connection.failure("listing domains", outcome[0])))
            # an environment of a remote host whose connection went: its CPUs read before are kept, a first
            # reading fails by name
            remote = LibvirtConfig(uri=over_ssh, domain_type="qemu")
            with Supervisor() as supervisor:
                read_before = LibvirtEnvironment(remote, supervisor, tmp_path / "before")
                read_before._online = [0, 1]
                read_before._connection = connection
                assert read_before.describe()["vcpu_cpus"] == [1]
                unread = LibvirtEnvironment(remote, supervisor, tmp_path / "after")
                unread._connection = connection
                with pytest.raises(RunError, match=lost):
                    unread.measured_cpus()
            # a run's stream copy after it (a KVM lab's run failed "cannot create the storage pool ... client
            # socket is closed", not naming the connection it had lost)
            with pytest.raises(RunError, match=lost):
                connection.sparse_volume("rtvirt-lost-test", 1 << 20)
            for uri in (libvirtd, over_ssh):
                with pytest.raises(RunError, match=f"{re.escape(uri)} did not answer within 3s: libvirtd there"):
                    LibvirtConnection(uri)
        finally:
            os.kill(pid, signal.SIGCONT)
            connection.close()
        LibvirtConnection(over_ssh).close()  # served again once it runs


@pytest.mark.parametrize(("table", "path", "message"), [
    ('uri = "http://example.com/"', "environments[0].uri", "should match pattern"),
    ('uri = "qemu:///system; reboot"', "environments[0].uri", "should match pattern"),
    ('vcpu_sched = {policy = "deadline"}', "environments[0].vcpu_sched.policy", "'other', 'fifo' or 'rr'"),
    ('vcpu_sched = {policy = "fifo", priority = 0}', "environments[0].vcpu_sched.priority", "greater than"),
    ('cputune = "<cputune><vcpupin vcpu=\'0\'"', "environments[0].cputune", "not well-formed"),
    ('cputune = "<domain/>"', "environments[0].cputune", "must be a <cputune> element"),
    ('cputune = "<cputune><reboot/></cputune>"', "environments[0].cputune", "<reboot> is not a <cputune> child"),
    ('cputune = "<!DOCTYPE x [<!ENTITY a \'b\'>]><cputune/>"', "environments[0].cputune", "DOCTYPE"),
    ('cputune = "<cputune><vcpupin vcpu=\'3\' cpuset=\'1\'/></cputune>"', "environments[0]", "vcpus = 1"),
    ('cputune = "<cputune/>"\ncpus = [1]', "environments[0]", "give either, not both"),
    ('numa_nodes = "0-"', "environments[0].numa_nodes", "CPU list"),
    ('memory = 16', "environments[0].memory", "greater than or equal to 64"),
    ('hugepage = true', "environments[0].hugepage", "Extra inputs"),
])
def test_malformed_libvirt_tables_are_rejected_with_their_field_path(table: str, path: str, message: str,
                                                                      tmp_path: Path) -> None:
    text = _scenario(tmp_path / "bad.toml", "1s", f'kind = "libvirt"\n{table}').read_text()
    with pytest.raises(InputError) as error:
        parse_scenario(text)
    assert path in str(error.value) and message in str(error.value)


def test_the_cli_exits_2_naming_the_field(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path / "bad.toml", "1s", 'kind = "libvirt"\ndomain_type = "xen"')
    result = run_cli("run", str(scenario), "--out", str(tmp_path / "results"))
    assert result.returncode == 2 and "environments[0].domain_type" in result.stderr
    assert "Traceback" not in result.stderr


def test_rt_throttling_is_restored_after_a_kill_only_when_its_owner_is_gone(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sysctl = tmp_path / "sched_rt_runtime_us"
    sysctl.write_text("950000\n")
    monkeypatch.setattr("rtvirt.environments.libvirt.rt_throttling.RT_SYSCTL", sysctl)
    monkeypatch.setenv("RTVIRT_CACHE", str(tmp_path / "cache"))
    lifted = RtThrottlingLifted()
    assert sysctl.read_text() == "-1\n" and lifted.describe()["kernel.sched_rt_runtime_us"]["before"] == 950000
    assert RtThrottlingLifted.restore_after_kill() is None  # its owner (this process) still runs
    record = tmp_path / "cache" / "libvirt-rt-throttling.json"
    record.write_text(json.dumps({"was": 950000, "pid": os.getpid(), "started": "1"}))  # a dead owner's record
    assert "950000" in (RtThrottlingLifted.restore_after_kill() or "")
    assert sysctl.read_text() == "950000\n" and not record.exists()


@pytest.mark.vm
def test_the_bare_metal_guest_streams_samples_from_a_libvirt_domain(libvirtd: str, tmp_path: Path) -> None:
    """Our own kernel booted directly by libvirt (<os><kernel>, the probe's argv as <cmdline>): its samples
    leave by a virtio <console> and land in the store, the guest leaves only once the host confirmed every
    record back on that console (the pty would lose what libvirt had not read); its domain is gone afterwards."""
    env = 'kind = "libvirt"\nname = "lvbare"\ndomain_type = "qemu"\nguest = "baremetal"'
    scenario = _scenario(tmp_path / "bare.toml", "2s", env)
    result = run_cli("run", "--no-report", str(scenario), "--out", str(tmp_path / "results"), "--no-progress", "--json",
                     timeout=240)
    assert_ran(result)
    (key, run), = json.loads(result.stdout[result.stdout.index("{"):])["runs"].items()
    assert run["status"] in RAN, run
    stored = load_run(tmp_path / "results" / "runs" / run["run_id"])
    detail = stored.manifest["environment_detail"]
    assert detail["guest"] == "baremetal" and detail["guest_kernel"] == "rtvirt-baremetal"
    assert "<kernel>" in detail["domain_xml"] and "<initrd>" not in detail["domain_xml"]
    stream = read_stream(tmp_path / "results" / "runs" / run["run_id"] / "samples.rtvs")
    assert stream.end_reason == "complete" and stream.corrupt is None
    assert stream.header["guest"]["kind"] == "baremetal" and stream.header["guest"]["channel"] == "virtio-console"
    assert stream.to_table().num_rows > 100  # 1 ms for ~2 s, less what a TCG guest misses
    delivery = stored.manifest["delivery"]
    assert delivery["handshake"] == "RTVIRT-ACK" and delivery["confirmation"] == "sent", delivery
    assert delivery["guest_said"] == "confirmed", delivery
    assert delivery["guest_records"] == delivery["agent_records"] == stream.to_table().num_rows
    assert _our_domains() == []


@pytest.mark.vm
def test_a_parameter_the_bare_metal_guest_refuses_is_bad_input_in_libvirt(libvirtd: str, tmp_path: Path) -> None:
    """The guest ends its domain with status 2 (what its console says): the environment raises InputError,
    which rtvirt reports as exit 2, and nothing reached the stream."""
    config = LibvirtConfig(kind="libvirt", domain_type="qemu", guest="baremetal")
    out = tmp_path / "gap.rtvs"
    with Supervisor() as supervisor, SharedResources() as shared:
        env = LibvirtEnvironment(config, supervisor, tmp_path / "vm", shared)
        try:
            launched = env.launch("rtvirt-probe", ["gap", "--threshold=12abc"], out)
            status = launched.proc.wait(timeout=180)  # type: ignore[union-attr]
            with pytest.raises(InputError) as error:
                env.check()
        finally:
            env.close()
    assert status == 2 and error.value.exit_code == 2
    assert "invalid value for '--threshold': '12abc'" in str(error.value)
    assert not out.exists() or out.stat().st_size == 0
    assert _our_domains() == []


@pytest.mark.parametrize("with_output", [True, False])
def test_the_bare_metal_stream_is_port_1_of_a_multiport_device_only_where_a_stream_is_read(
        tmp_path: Path, with_output: bool) -> None:
    """The measured guest's stream: a channel at port 1, which QEMU throttles (port 0, a virtconsole, drops what a
    full chardev refuses). A disturbing guest reads nothing back: no multiport, or its driver would wait for a
    port 1 that no host opens (a suite run: both stressor domains ended with "did not open port 1")."""
    config = LibvirtConfig(kind="libvirt", domain_type="qemu", guest="baremetal")
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(config, supervisor, tmp_path)
        env._type = {"type": "qemu"}
        env._baremetal_cmdline = "timer --duration=1000000"
        xml = ET.fromstring(env._domain_xml("/k", None, with_output))
    controller = xml.find("devices/controller[@type='virtio-serial']")
    assert controller is not None and controller.get("ports") == ("2" if with_output else "1")
    channels = xml.findall("devices/channel")
    assert [c for c in xml.findall("devices/console") if c.find("target[@type='virtio']") is not None] == []
    if with_output:
        (channel,) = channels
        assert channel.find("target").attrib == {"type": "virtio", "name": "org.rtvirt.baremetal.samples"}  # type: ignore[union-attr]
        assert channel.find("address").attrib == {  # type: ignore[union-attr]
            "type": "virtio-serial", "controller": "0", "bus": "0", "port": "1"}
    else:
        assert channels == []


@pytest.mark.vm
def test_a_domain_whose_qemu_dies_as_it_starts_fails_its_run_by_name(libvirtd: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The domain's QEMU killed (-9) after libvirt started it paused and before it is resumed (where a KVM lab
    that died took a campaign down with libvirt's own "virDomainResume() failed" traceback): the run fails with
    an error naming the domain's start, and nothing of it stays."""
    opened = LibvirtEnvironment._open_stream
    killed: list[int] = []

    def killing_its_qemu(env: LibvirtEnvironment, *args: Any) -> Any:
        stream = opened(env, *args)  # the console's (a run without output opens no other)
        pid = int(Path(f"/run/libvirt/qemu/{env._name}.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return stream

    monkeypatch.setattr(LibvirtEnvironment, "_open_stream", killing_its_qemu)
    config = LibvirtConfig(kind="libvirt", domain_type="qemu", guest="baremetal")
    args = agent_args(PROBES["timer"].params(duration=1_000_000_000, interval="1ms"))
    with Supervisor() as supervisor, SharedResources() as shared:
        env = LibvirtEnvironment(config, supervisor, tmp_path / "vm", shared)
        try:
            with pytest.raises(RunError, match=r"starting rtvirt-"):
                env.launch("rtvirt-probe", ["timer", *args], None)
        finally:
            env.close()
    assert killed and _our_domains() == []


@pytest.mark.vm
def test_a_preempt_rt_guest_boots_in_libvirt_and_its_manifest_says_so(libvirtd: str, tmp_path: Path) -> None:
    env = 'kind = "libvirt"\nname = "lvrt"\ndomain_type = "qemu"\nguest = "linux-rt"'
    scenario = _scenario(tmp_path / "rt.toml", "1s", env)
    result = run_cli("run", "--no-report", str(scenario), "--out", str(tmp_path / "results"), "--no-progress", "--json",
                     timeout=300)
    assert_ran(result)
    (key, run), = json.loads(result.stdout[result.stdout.index("{"):])["runs"].items()
    assert run["status"] in RAN, run
    manifest = load_run(tmp_path / "results" / "runs" / run["run_id"]).manifest
    detail = manifest["environment_detail"]
    assert detail["guest"] == "linux-rt" and detail["preempt_rt"] is True
    # the client library set-up gives the venv on Debian 12, not the system's libvirt 9 with CVE-2024-4418
    client = tuple(int(part) for part in detail["libvirt_client"].split("."))
    assert client >= (10, 3, 0) and detail["libvirt"].startswith("9."), detail
    # the TCG domain's kernel took its TSC's rate from this host (tcg_clock), and its clock kept time by it
    assert_given_host_tsc_rate(detail["domain_xml"], "</cmdline>")
    rate = manifest["stream_header"]["cycles_hz"]
    assert abs(rate / (host_cycles_khz() * 1000) - 1) < 0.01, rate
    # the end-of-stream handshake over the domain's second channel: the agent heard every record confirmed
    delivery = manifest["delivery"]
    assert delivery["confirmation"] == "sent" and delivery["guest_said"] == "confirmed"
    assert delivery["guest_records"] == delivery["host_records"] == manifest["summary"]["all"]["samples"]
    assert _our_domains() == []


@pytest.mark.vm
def test_a_lost_live_stream_is_recovered_from_the_domains_copy_volume(libvirtd: str, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path / "copy.toml", "8s", 'kind = "libvirt"\nname = "lvcopy"\ndomain_type = "qemu"')
    results = tmp_path / "results"
    thief, removed = steal_live_stream(results)
    result = run_cli("run", "--no-report", str(scenario), "--out", str(results), "--no-progress", timeout=300)
    thief.join()
    assert_ran(result)
    assert removed, "the live stream never grew past its header"
    [manifest_path] = results.glob("runs/*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    delivery = manifest["delivery"]
    assert manifest["status"] in RAN and "from the guest's copy" in delivery["recovered"]
    assert delivery["agent_records"] == delivery["host_records"] == manifest["summary"]["all"]["samples"] > 10
    with SharedResources() as shared:  # the copy's volume went with its domain
        connection = shared.get("c", lambda: LibvirtConnection(libvirtd))
        assert not [v for v in connection.pool().listVolumes() if v.endswith(".copy")]
    assert _our_domains() == []


@pytest.mark.vm
def test_a_bare_metal_domain_stopped_mid_run_writes_out_every_sample(libvirtd: str, tmp_path: Path) -> None:
    """close() of a running bare-metal domain sends it an NMI before destroying it: everything the guest
    took reaches the file and the stream ends with reason 'signal'."""
    config = LibvirtConfig(kind="libvirt", domain_type="qemu", guest="baremetal")
    out = tmp_path / "timer.rtvs"
    args = agent_args(PROBES["timer"].params(duration=0, interval="1ms"))
    with Supervisor() as supervisor, SharedResources() as shared:
        env = LibvirtEnvironment(config, supervisor, tmp_path / "vm", shared)
        try:
            launched = env.launch("rtvirt-probe", ["timer", *args], out)
            reader, seen, deadline = StreamReader(out), 0, time.monotonic() + 120
            while seen < 30 and time.monotonic() < deadline:  # running, with samples on the host already
                assert env.check() is None and launched.poll() is None, env.console_text()[-1000:]
                time.sleep(0.1)
                seen += reader.poll().size
        finally:
            env.close()
    assert seen >= 30
    stream = read_stream(out)
    assert stream.end_reason == "signal" and stream.corrupt is None and stream.total_dropped == 0
    assert stream.records.size >= seen and stream.written == stream.records.size
    assert _our_domains() == []


def test_an_initrd_whose_domain_is_gone_is_reclaimed_and_the_kernel_cache_is_kept(libvirtd: str,
                                                                                  tmp_path: Path) -> None:
    # a run that lost libvirtd destroys its domain over a new connection; its initrd volume may stay: the next
    # campaign's reclaim deletes it, and leaves the guest kernels (a cache) and a defined domain's initrd alone
    orphan = f"{DOMAIN_PREFIX}gone-{os.getpid()}.initrd"
    kept = f"{DOMAIN_PREFIX}kernel-test-{os.getpid()}"
    source = tmp_path / "initrd"
    source.write_bytes(b"\0" * 4096)
    with SharedResources() as shared:
        connection = shared.get("c", lambda: LibvirtConnection(libvirtd))
        for name in (orphan, kept):
            connection.upload(name, source)
        removed = LibvirtEnvironment.reclaim(LibvirtConfig(uri=libvirtd), shared)
        volumes = connection.pool().listVolumes()
        connection.delete_volume(kept)
    assert f"libvirt volume {orphan} ({libvirtd})" in removed
    assert orphan not in volumes and kept in volumes
