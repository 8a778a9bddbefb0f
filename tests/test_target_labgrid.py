"""labgrid places as targets: a real labgrid coordinator and exporter (tests/labgrid_lab.py) export the test
sshd as a place's NetworkService; rtvirt resolves the place with labgrid's client API and measures through
its own SSH path (host key still verified)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli
from labgrid_lab import LabgridLab
from sshd_server import SshServer, our_agents_running

# with tests/test_env_ssh.py on one worker: both check machine-wide that no agent runs from /var/tmp/rtvirt
pytestmark = pytest.mark.xdist_group("ssh-targets")


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshServer]:
    with SshServer() as server:
        yield server


@pytest.fixture(scope="module")
def lab(sshd: SshServer) -> Iterator[LabgridLab]:
    with LabgridLab({"board": sshd}) as labgrid:
        labgrid.place("rtboard", "board")
        labgrid.place("idle", "board", acquire=False)  # someone else's, or not reserved yet
        yield labgrid


def keys(sshd: SshServer) -> list[str]:
    return ["--identity", str(sshd.client_key), "--known-hosts", str(sshd.known_hosts)]


@pytest.fixture
def coordinator(lab: LabgridLab, monkeypatch: pytest.MonkeyPatch) -> LabgridLab:
    monkeypatch.setenv("LG_COORDINATOR", lab.address)  # labgrid's own variable, as its users set it
    return lab


def test_probe_on_a_labgrid_place(coordinator: LabgridLab, sshd: SshServer, results_dir: Path) -> None:
    result = run_cli("probe", "timer", "--target", "labgrid://rtboard", *keys(sshd), "--duration", "500ms",
                     "--interval", "1ms", "--results", str(results_dir), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "complete"
    (path,) = results_dir.glob("runs/*/manifest.json")
    target = json.loads(path.read_text())["target"]
    # the place's NetworkService said where: this sshd's port and user
    assert target["label"] == f"labgrid://rtboard ({sshd.user}@127.0.0.1:{sshd.port})"
    assert target["audit"]["kernel"] == os.uname().release and target["connection"] == "kept"
    assert our_agents_running() == []


def test_labgrid_place_errors(coordinator: LabgridLab, sshd: SshServer, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    unknown = run_cli("probe", "timer", "--target", "labgrid://nosuch", *keys(sshd), "-D", "1s")
    assert unknown.returncode == 2 and "--target" in unknown.stderr and "nosuch" in unknown.stderr
    idle = run_cli("probe", "timer", "--target", "labgrid://idle", *keys(sshd), "-D", "1s")
    assert idle.returncode == 2 and "not acquired" in idle.stderr and "Traceback" not in idle.stderr
    impostor = tmp_path / "known_hosts"  # the place resolves, but the host key is still checked
    algo, key = (sshd.dir / "client_key.pub").read_text().split()[:2]  # any other key
    impostor.write_text(f"[127.0.0.1]:{sshd.port} {algo} {key}\n")
    refused = run_cli("probe", "timer", "--target", "labgrid://rtboard", "--identity", str(sshd.client_key),
                      "--known-hosts", str(impostor), "-D", "1s")
    assert refused.returncode == 2 and "host key is not trusted" in refused.stderr
    monkeypatch.setenv("LG_COORDINATOR", "127.0.0.1:1")
    gone = run_cli("probe", "timer", "--target", "labgrid://rtboard", *keys(sshd), "-D", "1s", timeout=120)
    assert gone.returncode == 1 and "labgrid coordinator 127.0.0.1:1" in gone.stderr
    assert "Traceback" not in gone.stderr


def test_lab_inventory_with_labgrid_places(lab: LabgridLab, sshd: SshServer, tmp_path: Path) -> None:
    inventory = tmp_path / "lab.toml"
    inventory.write_text(f'labgrid_coordinator = "{lab.address}"\n'
                         f'[[targets]]\nname = "rt"\nlabgrid = "rtboard"\nidentity_file = "{sshd.client_key}"\n'
                         f'known_hosts = "{sshd.known_hosts}"\n'
                         f'[[targets]]\nname = "idle"\nlabgrid = "idle"\n')
    results = tmp_path / "results"
    result = run_cli("lab", str(inventory), "-D", "500ms", "--results", str(results), "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    by_name = {t["name"]: t for t in json.loads(result.stdout)["targets"]}
    assert by_name["rt"]["status"] == "complete" and by_name["rt"]["samples"] > 100
    assert by_name["idle"]["status"] == "failed" and "acquire" in by_name["idle"]["reason"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[targets]]\nname = "x"\nhost = "h"\nlabgrid = "p"\n')
    refused = run_cli("lab", str(bad), "-D", "1s")
    assert refused.returncode == 2 and "either host or labgrid" in refused.stderr
