"""partition: cgroup v1 for real on this machine, cgroup v2 on a fake cgroupfs tree, and the audit."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rtvirt.environments import ENVIRONMENTS, Environment
from rtvirt.environments.partition import CgroupTree, PartitionConfig, PartitionEnvironment
from rtvirt.environments.sched import SchedPolicy
from rtvirt.errors import RunError
from rtvirt.procs import Supervisor
from rtvirt.stream import read_stream
from rtvirt.sysaudit import MAX_VALUE, audit_system

LAST_CPU = max(os.sched_getaffinity(0))


def _fake_v2(root: Path) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    return root


def test_v2_tree_is_detected_and_configured(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path / "cg")
    tree = CgroupTree(root)
    assert tree.version == 2
    cgroup = tree.create("rtvirt-1-x", (1,), quota_us=20_000, period_us=100_000)
    directory = root / "rtvirt-1-x"
    assert cgroup.directories == [directory]
    assert (directory / "cpuset.cpus").read_text() == "1"
    assert (directory / "cpu.max").read_text() == "20000 100000"
    # both enabled for the children in one write (a real cgroupfs takes several tokens at once)
    assert (root / "cgroup.subtree_control").read_text() == "+cpuset +cpu"
    cgroup.join(4242)
    assert (directory / "cgroup.procs").read_text() == "4242\n"


def test_v2_missing_controller_is_a_clear_error(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path / "cg")
    (root / "cgroup.controllers").write_text("io memory\n")
    with pytest.raises(RunError, match="controller\\(s\\) cpuset not available"):
        CgroupTree(root).create("rtvirt-1-y", (0,), None, 100_000)


def test_v1_tree_on_a_fake_layout(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for controller in ("cpuset", "cpu"):
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
    (root / "cpuset" / "cpuset.cpus").write_text("0-1")
    (root / "cpuset" / "cpuset.mems").write_text("0\n")
    tree = CgroupTree(root)
    assert tree.version == 1
    cgroup = tree.create("rtvirt-2-z", (0,), quota_us=5_000, period_us=10_000)
    assert [d.parent.name for d in cgroup.directories] == ["cpuset", "cpu"]
    assert (root / "cpuset" / "rtvirt-2-z" / "cpuset.mems").read_text() == "0"
    assert (root / "cpu" / "rtvirt-2-z" / "cpu.cfs_quota_us").read_text() == "5000"


def test_stale_cgroups_of_dead_processes_are_removed(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path / "cg")
    (root / "rtvirt-999999999-abc").mkdir()
    (root / f"rtvirt-{os.getpid()}-def").mkdir()
    removed = CgroupTree(root).remove_stale()
    assert removed == [str(root / "rtvirt-999999999-abc")]
    assert (root / f"rtvirt-{os.getpid()}-def").exists()


def test_no_cgroup_hierarchy_is_reported(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no usable cgroup hierarchy"):
        CgroupTree(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root")
def test_probe_runs_inside_a_real_partition_and_it_is_removed(tmp_path: Path) -> None:
    # a quota too: on cgroup v1 with RT group scheduling, SCHED_FIFO then needs the group's RT budget
    config = PartitionConfig(kind="partition", cpus=(LAST_CPU,), quota="50ms", period="100ms",
                             sched=SchedPolicy(policy="fifo", priority=80))
    with Supervisor() as supervisor:
        env = PartitionEnvironment(config, supervisor, tmp_path)
        try:
            env.start()
            assert env.probe_overrides() == {"affinity": (LAST_CPU,), "priority": 80}
            directories = list(env._cgroup.directories)  # noqa: SLF001 - checked from outside on purpose
            launched = env.launch("rtvirt-probe", ["timer", "--duration=500000000", "--interval=1000000",
                                                   f"--affinity={LAST_CPU}", "--priority=80"], tmp_path / "s.rtvs")
            time.sleep(0.2)
            membership = Path(f"/proc/{launched.proc.pid}/cgroup").read_text()
            assert launched.proc.wait(timeout=120) == 0
        finally:
            env.close()
    assert directories[0].name in membership
    assert not any(d.exists() for d in directories)
    stream = read_stream(tmp_path / "s.rtvs")
    assert stream.records.size > 100 and set(stream.records["cpu"].tolist()) == {LAST_CPU}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root")
def test_partition_quota_throttles_a_spinning_task(tmp_path: Path) -> None:
    config = PartitionConfig(kind="partition", cpus=(LAST_CPU,), quota="20ms", period="100ms",
                             sched=SchedPolicy(policy="other"))
    with Supervisor() as supervisor:
        env = PartitionEnvironment(config, supervisor, tmp_path)
        try:
            launched = env.launch("rtvirt-stress", ["cpu", "--workers=1", f"--cpus={LAST_CPU}", "--duration=0"], None)
            time.sleep(0.3)
            before, started = _cpu_seconds(launched.proc.pid), time.monotonic()
            time.sleep(1.5)
            share = (_cpu_seconds(launched.proc.pid) - before) / (time.monotonic() - started)
        finally:
            env.close()
    # 20 % allowed; a spinner without the quota would get up to 100 % of the core
    assert share < 0.4, share


def test_registry_and_availability() -> None:
    assert set(ENVIRONMENTS) == {"host", "partition", "qemu", "libvirt", "ssh", "xen"}
    for kind, cls in ENVIRONMENTS.items():  # each line of the registry names its kind's class
        assert cls.kind == kind and issubclass(cls, Environment)
        assert cls.available() is None or isinstance(cls.available(), str)


def test_system_audit_records_the_tuning_and_bounds_values() -> None:
    audit = audit_system()
    for key in ("kernel", "cmdline", "preemption", "isolcpus", "nohz_full", "rcu_nocbs", "governors", "idle_states",
                "smt_active", "clocksource", "transparent_hugepages", "irq_affinity", "virtualization", "warnings"):
        assert key in audit, key
    assert audit["cpus"] == len(os.sched_getaffinity(0))
    assert isinstance(audit["warnings"], list)
    if audit["preemption"] != "PREEMPT_RT":
        assert any("PREEMPT_RT" in w for w in audit["warnings"])
    assert all(len(v or "") <= MAX_VALUE for v in audit["irq_affinity"].values())
