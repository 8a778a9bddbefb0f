"""A local dom0: rtvirt runs in a Xen host's dom0, where commands run as argument vectors and files are copied."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ...errors import CommandTimeout, RunError
from ...procs import Supervisor, terminate_group


def is_dom0() -> bool:
    try:
        return "control_d" in Path("/proc/xen/capabilities").read_text()
    except OSError:
        return False

class _LocalProcess:
    """A dom0-side helper started locally, with the AgentProcess shape."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def error_tail(self) -> str:
        return ""

    def send(self, data: bytes) -> None:
        """Write ``data`` to the helper's stdin (dom0's listener relays it back to the domU)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def stop(self, grace: float = 5.0) -> int | None:
        return terminate_group(self.proc, grace)

class _LocalTransport:
    """dom0 is this machine: commands run as argument vectors, files are copied."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def run(self, argv: list[str], timeout: float = 60.0) -> Any:
        from ...remote import RemoteResult

        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"dom0: {argv[0]} did not finish within {timeout:g}s") from None
        except OSError as exc:
            raise RunError(f"dom0: {argv[0]} failed: {exc}") from None
        return RemoteResult(done.returncode, done.stdout.decode(errors="replace")[:1 << 20],
                            done.stderr.decode(errors="replace")[:1 << 20])

    def spawn(self, argv: list[str], stream_to: Path | None) -> _LocalProcess:
        sink = stream_to.open("wb") if stream_to is not None else subprocess.DEVNULL
        try:
            # stdin stays open (a pipe we hold, as the lab's SSH channel does): busybox nc shuts its socket's
            # sending side at EOF on stdin, the domU's nc then ends and the probe dies of a broken pipe
            return _LocalProcess(self.supervisor.start(argv, stdout=sink, stderr=subprocess.DEVNULL,
                                                       stdin=subprocess.PIPE))
        finally:
            if stream_to is not None:
                sink.close()  # type: ignore[union-attr]

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        Path(remote).write_bytes(local.read_bytes())
        os.chmod(remote, mode)

    def get(self, remote: str, local: Path, timeout: float = 300.0) -> int:
        try:
            local.write_bytes(Path(remote).read_bytes())
        except OSError as exc:
            raise RunError(f"dom0: cannot read {remote[:200]}: {exc.strerror}") from None
        return local.stat().st_size

    def close(self) -> None:
        pass

def _console_log_problem() -> str | None:
    """Why this dom0 cannot tell how a domU's job ended (None: it can). rtvirt reads the RTVIRT- marks from
    xenconsoled's guest logs; Debian's xencommons starts xenconsoled without them (XENCONSOLED_TRACE=none)."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "xenconsoled":
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                pairs = [*args, *(f"{a}={b}" for a, b in zip(args, args[1:], strict=False) if a in ("--log", "-l"))]
                if any(arg in ("--log=guest", "--log=all", "-l=guest", "-l=all") for arg in pairs):
                    return None
                return (f"xen: this dom0's xenconsoled (pid {entry.name}) keeps no guest console logs, where rtvirt "
                        "reads how a domU's job ended: run it with --log=guest (Debian: XENCONSOLED_TRACE=guest in "
                        "/etc/default/xencommons, then restart xencommons)")
    return "xen: no xenconsoled runs in this dom0 (rtvirt reads the domUs' consoles from its guest logs)"

def _bring_cpus_online(count: int) -> None:
    """Bring this dom0's CPUs 1..count-1 online: ``xl vcpu-set`` gives them back to Linux, which only
    registers them; udev rules online them on a full Debian dom0, nothing does in a minimal one."""
    for cpu in range(1, count):
        control = Path(f"/sys/devices/system/cpu/cpu{cpu}/online")
        deadline = time.monotonic() + 10
        while not control.exists() and time.monotonic() < deadline:  # registered from a xenstore watch
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            if control.read_text().strip() == "0":
                control.write_text("1")
