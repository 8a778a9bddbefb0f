"""The host half of a remote libvirt domain's clock channel (environments.libvirt.tracing): FIFOs made on the
host over SSH (a real sshd on this machine, so the host's files can be looked at), named by a checked path, and
taken away; a thread's process read from that host's /proc."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sshd_server import SshServer

from rtvirt.environments.libvirt.tracing import make_clock_pipes, qemu_pid, remove_clock_pipes
from rtvirt.errors import RunError
from rtvirt.remote import connect


def test_the_clock_fifos_are_made_on_the_host_over_ssh_and_removed() -> None:
    with SshServer() as server:
        host = connect(server.target())
        try:
            stem = make_clock_pipes(host)
            directory = Path(stem).parent
            # the run's own (mktemp -d), passable but not listable for a QEMU of another user
            assert stat.S_IMODE(directory.stat().st_mode) == 0o711
            for end in (".in", ".out"):
                mode = Path(stem + end).stat().st_mode
                assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600, (end, oct(mode))
            other = make_clock_pipes(host)
            assert Path(other).parent != directory  # every domain its own
            remove_clock_pipes(host, stem)
            remove_clock_pipes(host, other)
            assert not directory.exists() and not Path(other).parent.exists()
            # the QEMU a vCPU thread belongs to, from the host's /proc: here this test's own thread
            assert qemu_pid(os.getpid(), host) == os.getpid() == qemu_pid(os.getpid())
            with pytest.raises(RunError, match="/proc/999999999/status"):
                qemu_pid(999_999_999, host)
            with pytest.raises(AssertionError):
                remove_clock_pipes(host, "/tmp/../etc/clock")  # only what make_clock_pipes names
        finally:
            host.close()


def test_a_host_stressor_beside_a_domain_at_a_raw_remote_uri_is_refused_by_name(tmp_path: Path) -> None:
    # no SSH target of ours reaches that host: run here, the stressor would not be beside the domain at all
    from rtvirt.environments.libvirt import LibvirtConfig, LibvirtEnvironment
    from rtvirt.errors import InputError
    from rtvirt.procs import Supervisor

    config = LibvirtConfig.model_validate({"kind": "libvirt", "name": "far", "uri": "qemu+ssh://root@192.0.2.1/system"})
    with Supervisor() as supervisor:
        env = LibvirtEnvironment(config, supervisor, tmp_path / "far")
        with pytest.raises(InputError, match=r"environment far: a stressor beside a domain at qemu\+ssh://root@"
                                             r"192\.0\.2\.1/system would run on this machine"):
            env.start_stressor("cpu", {"cpus": [0]}, "native")
