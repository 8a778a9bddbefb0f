"""A page kept open in real headless Chromium and read as it changes, over the DevTools protocol (what a user
watching the live view sees): the report tests' Chromium and flags (tests/test_results_report.py), with a
debugging port, and ``evaluate`` reading the page's DOM. Also ``start_serve``: `rtvirt serve` on a free port."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from conftest import RTVIRT
from test_results_report import CHROMIUM, CHROMIUM_FLAGS
from tornado.websocket import websocket_connect


class LivePage:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="rtvirt-chromium-"))
        # a process group of its own: its helper processes are waited for before the profile is removed (close);
        # its own temporary directories (org.chromium.Chromium.*, left in /tmp after a SIGTERM) go with the profile
        self.proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-port=0", "--window-size=1280,2000", url],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, "TMPDIR": str(self.profile)})
        self._loop = asyncio.new_event_loop()
        self._id = 0
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().splitlines()[0]
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                pages = [t for t in json.load(answer) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert pages, "Chromium shows no page"
        async def connect() -> Any:  # inside the loop: tornado's future belongs to the running one
            return await websocket_connect(pages[0]["webSocketDebuggerUrl"], max_message_size=64 << 20)

        self._socket = self._loop.run_until_complete(connect())

    def evaluate(self, expression: str, tolerate: bool = False) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only); an exception fails,
        unless ``tolerate`` (the page may still be loading): then None."""
        self._id += 1
        request = {"id": self._id, "method": "Runtime.evaluate",
                   "params": {"expression": expression, "returnByValue": True}}

        async def ask() -> Any:
            await self._socket.write_message(json.dumps(request))
            while True:
                message = await asyncio.wait_for(self._socket.read_message(), 30)
                assert message is not None, "Chromium closed the DevTools connection"
                answer = json.loads(message)
                if answer.get("id") == self._id:
                    return answer

        answer = self._loop.run_until_complete(ask())
        result = answer["result"]
        if tolerate and "exceptionDetails" in result:
            return None
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, every: float = 0.2) -> Any:
        """Evaluate until the value is truthy; that value (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression, tolerate=True)
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"the page never showed {expression}; it shows:\n"
                             f"{self.evaluate('document.body.innerText')[:3000]}")

    def close(self) -> None:
        if getattr(self, "_socket", None) is not None:
            self._socket.close()
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Chromium's helpers end after the browser, and its network service still writes into the profile then:
        # removed before they ended, the profile came back with that one file (seen after a suite of 2026-12-01)
        deadline = time.monotonic() + 20
        while _signal_group(self.proc.pid, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(self.proc.pid, signal.SIGKILL)
        self._loop.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> LivePage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to every process of ``group`` (0: none, a check); False once the group has no process."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    return True


def start_serve(*args: str, env: dict[str, str] | None = None,
                timeout: float = 60.0) -> tuple[subprocess.Popen[str], str]:
    """`rtvirt serve ARGS --listen 127.0.0.1:0` started; (the process, the page's address)."""
    proc = subprocess.Popen([*RTVIRT, "serve", *args, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"rtvirt serve did not start: {seen[-2000:]}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
