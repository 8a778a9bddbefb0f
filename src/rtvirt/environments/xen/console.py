"""A domU's console and sample stream: the stream script in the domU, dom0's listener, the console log
xenconsoled keeps, and the domU's main job in the shape of an agent process."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import RunError
from ..guest_image import EXIT_MARK, READY_MARK, delivery_said
from ..tcg_clock import clock_failure
from .dom0 import XL_TIMEOUT_S
from .pools import XenPools

if TYPE_CHECKING:
    from ...remote.transport import HostTransport

CONSOLE_LOG = "/var/log/xen/guest-{name}.log"
CONSOLE_TAIL_BYTES = 16384
UNAME_MARK = "RTVIRT-UNAME"
STREAM_PORT_BASE = 7100
COPY_PORT_BASE = 7400  # the stream copy a domU offers when its END was not confirmed
TRACE_PORT_BASE = 7700  # the guest's own trace of an explained run (explain.guest)
TRACE_WAIT_S = 30.0  # for the trace's last bytes after the domU said its job ended (it sent the trace before)
STATUS_INTERVAL_S = 1.0  # how often a running domain's console is read (each read is a dom0 command)

# dom0's listeners (busybox nc -l) note their pid in the domain's directory in dom0 ($1; $2: the port): neither
# the end of a listener's stdin nor closing its SSH channel ends a listener nobody connected to (the copy's,
# usually: OpenSSH holds the channel open until the command exits and refuses signals in root sessions), so the
# run ends those on ports $2... (LISTENERS_END, each only while its pid is still a busybox); close() then
# removes the directory.
LISTENER = 'echo $$ > "$1/listener-$2.pid"; exec busybox nc -l -p "$2"'
LISTENERS_END = r"""dir=$1; shift
for port in "$@"; do
  f="$dir/listener-$port.pid"
  [ -e "$f" ] || continue
  p=$(cat "$f")
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = busybox ] && kill "$p" 2>/dev/null
  rm -f "$f"
done
exit 0
"""


class Dom0Listeners:
    """The listeners of one domain's directory in dom0: started per port over ``transport`` (a lab's SSH
    connection or the local dom0's), ended by the pids they noted (LISTENER, LISTENERS_END)."""

    def __init__(self, transport: HostTransport, directory: str) -> None:
        self._transport = transport
        self._directory = directory
        self._ports: dict[int, int] = {}  # id(listener) -> its port

    def listen(self, port: int, to: Path) -> Any:
        """A listener on ``port`` whose output goes to the local file ``to``."""
        listener = self._transport.spawn(["sh", "-c", LISTENER, "rtvirt-listen", self._directory, str(port)],
                                         stream_to=to)
        self._ports[id(listener)] = port
        return listener

    def end(self, listeners: list[Any]) -> None:
        self._transport.run(["sh", "-c", LISTENERS_END, "rtvirt-listen-end", self._directory,
                             *(str(self._ports[id(listener)]) for listener in listeners)], timeout=XL_TIMEOUT_S)


# The stream's way out, in a directory $5 of its own: the agent's stdout to dom0's listener on $port; dom0's
# confirmation of the END comes back on the same connection into a FIFO the agent reads (--confirm), opened
# read-write here first so that neither nc nor the agent blocks opening it. The agent's words reach the console as
# they come and are kept: when it did not hear the host confirm every record, its copy (--tee) is offered to dom0
# on $copy_port (nobody listening: refused at once) before the job ends.
STREAM_RELAY = r"""dir=$5
shift 5
mkfifo "$dir/rtvirt-ack" "$dir/rtvirt-said"
exec 3<>"$dir/rtvirt-ack"
tee "$dir/rtvirt-said.log" < "$dir/rtvirt-said" >&2 &
status=0
"$@" 2>"$dir/rtvirt-said" | nc "$dom0" "$port" > "$dir/rtvirt-ack" || status=$?
wait
if ! grep -q '^RTVIRT-DELIVERY confirmed' "$dir/rtvirt-said.log"; then
  echo "RTVIRT-COPY-OFFERED" >&2
  nc -w 60 "$dom0" "$copy_port" < "$dir/rtvirt-copy/stream.rtvs"
fi
exit $status
"""
COPY_OFFERED_MARK = "RTVIRT-COPY-OFFERED"


# The measuring domU's main job: bring up its vif, keep its stream's copy in a bounded tmpfs (a quarter of its
# memory: when full the agent stops the copy and goes on), then run STREAM_RELAY. Only numbers and addresses we
# chose reach the script as $1..$5; the agent's argv follows verbatim as "$@".
STREAM_SCRIPT = r"""set -o pipefail
dom0=$1 self=$2 port=$3 copy_port=$4
n=0
until [ -e /sys/class/net/eth0 ]; do
  n=$((n+1)); [ $n -gt 300 ] && { echo "rtvirt: no vif" >&2; exit 70; }; sleep 0.1
done
ip link set lo up
ip link set eth0 up
ip addr add "$self/32" dev eth0
ip route add "$dom0/32" dev eth0
echo "RTVIRT-UNAME $(uname -r) $(uname -v)" >&2
mkdir -p "$5/rtvirt-copy"
kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)
mount -t tmpfs -o size=$((kib / 4))k rtvirt-copy "$5/rtvirt-copy"
""" + STREAM_RELAY
STREAM_DIR = "/tmp"
ACK_FIFO = f"{STREAM_DIR}/rtvirt-ack"
STREAM_COPY = f"{STREAM_DIR}/rtvirt-copy/stream.rtvs"


class DomUJob:
    """A domU's main job, with the AgentProcess shape: running until its console says how it ended."""

    def __init__(self, env: XenConsole, relay: Any | None) -> None:
        self.env = env
        self.relay = relay
        self._returncode: int | None = None
        self._why = ""
        self._checked = 0.0

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        if self.relay is not None and self.relay.poll() is None:
            return None  # samples still flow: the job runs
        now = time.monotonic()
        if now - self._checked < STATUS_INTERVAL_S:
            return None
        self._checked = now
        status = self.env.exit_status()
        if status is not None:
            self._returncode = status
        elif not self.env.domain_exists():
            self._returncode, self._why = 255, "the domain stopped before its agent finished"
        return self._returncode

    def error_tail(self) -> str:
        said = [line for line in self.env.console_text().splitlines()
                if line.strip() and not line.startswith(("RTVIRT-", "["))]
        return "\n".join([*said[-5:], self._why]).strip()


class XenConsole(XenPools):
    """What a domU says while it runs: its console, its readiness, how its job ended."""

    def _wait_listening(self, port: int) -> None:
        assert self._dom0 is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listening = self._dom0.run(["busybox", "netstat", "-ltn"]).stdout
            if re.search(rf":{port}\s", listening):
                return
            if self._relay is None or self._relay.poll() is not None:
                break
            time.sleep(0.2)
        raise RunError(f"xen: dom0's stream listener on port {port} did not start")

    def console_text(self) -> str:
        held = self._relay.console_text() if self._relay is not None else None
        if held is not None:
            return held
        if self._dom0 is None or self._domain is None:
            return ""
        result = self._dom0.patient_run(["tail", "-c", str(CONSOLE_TAIL_BYTES), CONSOLE_LOG.format(name=self._domain)])
        if result is not None and result.returncode == 0:
            self._console = str(result.stdout)[-CONSOLE_TAIL_BYTES:]
        return self._console

    def delivery(self) -> dict[str, Any]:
        if self._relay is None:
            return {}
        said = self._relay.delivery()
        return {**said, **delivery_said(self.console_text())} if said.get("handshake") == "RTVIRT-ACK" else said

    def stream_copy(self) -> Path | None:
        return self._relay.copy(COPY_OFFERED_MARK in self.console_text()) if self._relay is not None else None

    def _uname(self) -> str | None:
        """``uname -r -v`` as the measuring domU printed it (untrusted: printable ASCII, bounded)."""
        for line in self._console.splitlines():
            if line.startswith(UNAME_MARK + " "):
                return re.sub(r"[^ -~]", "?", line.removeprefix(UNAME_MARK + " ").strip())[:200]
        return None

    def exit_status(self) -> int | None:
        for line in self.console_text().splitlines():
            if line.startswith(EXIT_MARK):
                status = line.removeprefix(EXIT_MARK).strip()
                return int(status) if status.isdigit() else 255
        return None

    def domain_exists(self) -> bool:
        assert self._dom0 is not None and self._domain is not None
        result = self._dom0.patient_run(["xl", "domid", self._domain])
        return result is None or result.returncode == 0  # no answer yet from a loaded dom0: still there

    def check(self) -> str | None:
        if self._dom0 is not None and self._dom0.lab is not None and not self._dom0.lab.alive():
            return f"the Xen lab stopped: {self._dom0.lab.why_stopped()}"
        if self._process is None:
            return None
        if not self.booted and time.monotonic() - self._launched_at > self.config.boot_timeout / 1e9:
            return f"the domU did not boot within {self.config.boot_timeout / 1e9:.0f}s"
        if self._clock_failure is not None:
            return self._clock_failure
        status = self._process.poll()
        if status not in (None, 0) and self._relay is not None:
            failure = self._relay.failure(self.console_text())
            if failure is not None:
                raise failure  # status 2 (a parameter the guest refused) is bad input: exit 2
        if status not in (None, 0):
            return f"the domU's agent failed (status {status}): {self._process.error_tail()[-200:]}"
        return None

    @property
    def booted(self) -> bool:
        if self._ready_at is None and self._process is not None:
            now = time.monotonic()
            if now - self._console_checked >= STATUS_INTERVAL_S:
                self._console_checked = now
                console = self.console_text()
                if READY_MARK in console:
                    self._ready_at = now
                    # judged once: reading the console again is a command in dom0
                    self._clock_failure = clock_failure(console, now - self._launched_at)
        return self._ready_at is not None
