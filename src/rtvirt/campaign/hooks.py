"""Lifecycle hooks: the scenario's commands around the campaign and each run, on this machine or on a
control host over SSH. Commands are argument vectors (never a shell); what they print is bounded."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from ..environments import SharedResources
from ..errors import RunError
from ..scenario.schema import Hook, Hooks

__all__ = ["HookRunner", "PLACEHOLDERS"]

PLACEHOLDERS = ("environment", "disturbance", "repetition", "key", "run_id")
OUTPUT_TAIL = 500


def _tail(data: bytes | str) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return text.strip()[-OUTPUT_TAIL:]


class HookRunner:
    """Runs the hooks of one stage; returns what each did (for the manifest), raises for failed before-hooks."""

    def __init__(self, hooks: Hooks, shared: SharedResources) -> None:
        self.hooks, self.shared = hooks, shared

    def run(self, stage: str, values: dict[str, str], environment: str | None = None) -> list[dict[str, Any]]:
        records = []
        for hook in getattr(self.hooks, stage):
            if environment is not None and hook.environments is not None and environment not in hook.environments:
                continue
            argv = [self._substitute(arg, values) for arg in hook.argv]
            record = self._run_one(hook, argv)
            records.append(record)
            if record["status"] != 0 and stage.startswith("before"):
                raise RunError(f"{stage} hook {argv[0][:100]!r} failed ({record['status']}): "
                               f"{record['stderr'] or record['stdout'] or 'no message'}")
        return records

    @staticmethod
    def _substitute(argument: str, values: dict[str, str]) -> str:
        for name in PLACEHOLDERS:
            if name in values:
                argument = argument.replace("{" + name + "}", values[name])
        return argument

    def _run_one(self, hook: Hook, argv: list[str]) -> dict[str, Any]:
        timeout = hook.timeout / 1e9
        started = time.monotonic()
        where = "local"
        if self.hooks.control is not None:
            from ..remote.agents import TargetLink

            target = self.hooks.control.ssh_target()
            where = target.label
            link = self.shared.get(f"hooks:{target.model_dump_json()}", lambda: TargetLink(target, "/"))
            try:
                result = link.connection().run(argv, timeout=timeout)
            except RunError as exc:
                return {"argv": argv, "on": where, "status": None, "stdout": "", "stderr": _tail(str(exc)),
                        "seconds": round(time.monotonic() - started, 3)}
            status, stdout, stderr = result.returncode, result.stdout, result.stderr
        else:
            from ..procs import Supervisor

            with Supervisor() as supervisor:
                try:
                    proc = supervisor.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                except OSError as exc:
                    return {"argv": argv, "on": where, "status": None, "stdout": "", "stderr": _tail(str(exc)),
                            "seconds": 0.0}
                try:
                    out, err = proc.communicate(timeout=timeout)
                    status = proc.returncode
                except subprocess.TimeoutExpired:
                    supervisor.stop(proc)
                    out, err, status = b"", f"timed out after {timeout:g}s".encode(), None
            stdout, stderr = _tail(out), _tail(err)
        return {"argv": argv, "on": where, "status": status, "stdout": _tail(stdout), "stderr": _tail(stderr),
                "seconds": round(time.monotonic() - started, 3)}
