"""Taking a domU down: every sample it holds first, then the domain, its files in dom0 and its cpupool."""

from __future__ import annotations

import time
from typing import Any

from ..console_log import CONSOLE_FILE, CONSOLE_HEAD_BYTES, CONSOLE_TAIL_BYTES, HEAD_AND_TAIL, keep_console
from .console import CONSOLE_LOG, XenConsole
from .dom0 import RUN_DIR, XL_TIMEOUT_S

SELF_DESTROY_WAIT_S = 15.0


class XenTeardown(XenConsole):
    """Removes what a domU left in dom0, also when it powered itself off or dom0 stopped answering."""

    def _powered_off_by_itself(self) -> bool:
        """Whether the domU's agent ended and the domain powered off (on_poweroff = "destroy"), not stopped by us."""
        return self._process is not None and self._process.returncode is not None

    def _wait_gone(self, timeout_s: float) -> None:
        """Give xl's own monitor the time to finish destroying the domain rather than racing it with a second
        destroy (the suspected cause of an `xl` that once did not return within 120 s in the lab)."""
        deadline = time.monotonic() + timeout_s
        while self.domain_exists() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _keep_console(self, dom0: Any, domain: str) -> None:
        """The domain's whole console as xenconsoled logged it in dom0, bounded, into the run (once it is gone:
        its last words included), then the log removed from dom0."""
        log = CONSOLE_LOG.format(name=domain)
        result = dom0.run(["sh", "-c", HEAD_AND_TAIL, "rtvirt-console", log, str(CONSOLE_HEAD_BYTES),
                           str(CONSOLE_TAIL_BYTES)], timeout=XL_TIMEOUT_S)
        if result.returncode == 0:
            keep_console(self.workdir / CONSOLE_FILE, str(result.stdout).encode())
            dom0.run(["rm", "-f", log])

    def close(self) -> None:
        dom0 = self._dom0
        try:
            if dom0 is not None and (dom0.lab is None or dom0.lab.alive()):
                if self._relay is not None and self._domain is not None:
                    self._relay.stop_guest(dom0, self._domain)  # every sample it holds, then off
                if self._relay is not None:
                    self._relay.stop(grace=2.0)
                if self._domain is not None:
                    if self._powered_off_by_itself():  # xl's monitor of the domain is destroying it
                        self._wait_gone(SELF_DESTROY_WAIT_S)
                    if self.domain_exists():
                        dom0.run(["xl", "destroy", self._domain])
                    self._keep_console(dom0, self._domain)
                    dom0.run(["rm", "-rf", f"{RUN_DIR}/{self._domain}"])
                if self._pool is not None:
                    dom0.destroy_pool(self._pool)
        finally:  # a dom0 that stopped answering still gets its shared resources (a lab) closed
            self._relay = self._domain = self._pool = None
            super().close()
