"""A real labgrid lab for tests: labgrid's gRPC coordinator and an exporter on loopback ports.

The exporter exports one ``NetworkService`` per board (address, username, port of a test sshd); places
are created, matched and acquired with labgrid's own ``labgrid-client``, as a lab's users do. ``stop()``
ends both daemons and removes the directory (the coordinator keeps its places there)::

    with LabgridLab({"board": sshd}) as lab:
        lab.place("rtboard", "board")     # created, matched, acquired
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sshd_server import SshServer, free_port, listening

BIN = Path(sys.executable).parent  # labgrid's commands live beside the venv's python
EXPORTER = "rtvirt-test-exporter"


class LabgridLab:
    def __init__(self, boards: dict[str, SshServer]) -> None:
        self.boards = boards
        self.dir = Path(tempfile.mkdtemp(prefix="rtvirt-labgrid-"))
        self.address = ""
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "LG_COORDINATOR": self.address}

    def _daemon(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=(self.dir / log).open("wb"), start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> LabgridLab:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        coordinator = self._daemon([str(BIN / "labgrid-coordinator"), "--listen", self.address], "coordinator.log")
        deadline = time.monotonic() + 30  # for the coordinator and the exporter together
        if not listening(port, within=30, alive=lambda: coordinator.poll() is None):
            raise RuntimeError(f"labgrid-coordinator did not start: {self.log('coordinator.log')}")
        config = self.dir / "exporter.yaml"
        config.write_text("".join(f"{name}:\n  NetworkService:\n    address: 127.0.0.1\n    username: {sshd.user}\n"
                                  f"    port: {sshd.port}\n" for name, sshd in self.boards.items()))
        exporter = self._daemon([str(BIN / "labgrid-exporter"), "--coordinator", self.address, "--name", EXPORTER,
                                 "--hostname", "127.0.0.1", str(config)], "exporter.log")
        while f"{EXPORTER}/" not in self.client("resources").stdout:
            if exporter.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"labgrid-exporter did not register: {self.log('exporter.log')}")
            time.sleep(0.1)
        return self

    def client(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "labgrid-client"), *args], capture_output=True, text=True, timeout=60,
                              env=self.env, cwd=self.dir)

    def place(self, name: str, board: str, acquire: bool = True) -> None:
        for args in (["create"], ["add-match", f"{EXPORTER}/{board}/NetworkService"], *([["acquire"]] if acquire
                                                                                       else [])):
            done = self.client("-p", name, *args)
            if done.returncode != 0:
                raise RuntimeError(f"labgrid-client -p {name} {' '.join(args)}: {done.stderr[-500:]}")

    def log(self, name: str) -> str:
        path = self.dir / name
        return path.read_text(errors="replace")[-1000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the exporter first, then the coordinator
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LabgridLab:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
