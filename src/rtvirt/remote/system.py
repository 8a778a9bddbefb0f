"""The system audit's view of a machine behind a transport (an SSH target, a KVM host): files and commands read
over it, few round trips."""

from __future__ import annotations

from ..params import parse_cpulist
from ..sysaudit import KERNEL_CONFIG_LIMIT, MAX_VALUE
from .transport import HostTransport

__all__ = ["RemoteSystem"]


class RemoteSystem:
    """:class:`rtvirt.sysaudit.SystemView` of a machine behind ``connection`` (``audit_system(RemoteSystem(conn))``)."""

    def __init__(self, connection: HostTransport) -> None:
        self.connection = connection
        self.label = connection.label

    def read_many(self, paths: list[str], limit: int = MAX_VALUE) -> dict[str, str | None]:
        """One ``head -v -c`` for all files: each file's bytes follow a ``==> path <==`` line it prints.

        Missing or unreadable files print nothing (None). A hostile file could imitate a later file's
        marker; values stay bounded either way, and they are recorded as what the target said.
        """
        values: dict[str, str | None] = dict.fromkeys(paths)
        if not paths:
            return values
        result = self.connection.run(["head", "-v", "-c", str(limit), "--", *paths], timeout=60,
                                     limit=len(paths) * (limit + 512))
        text = result.stdout
        starts = []
        position = 0
        for path in paths:
            marker = f"==> {path} <==\n"
            found = text.find(marker, position)
            if found >= 0:
                starts.append((path, found, found + len(marker)))
                position = found + len(marker)
        for index, (path, _, begin) in enumerate(starts):
            end = starts[index + 1][1] if index + 1 < len(starts) else len(text)
            values[path] = text[begin:end].strip()[:limit]
        return values

    def glob(self, directory: str, pattern: str, limit: int = 64) -> list[str]:
        result = self.connection.run(["find", directory, "-mindepth", "1", "-maxdepth", "1", "-name", pattern],
                                     timeout=30, limit=1 << 18)
        return sorted(line for line in result.stdout.splitlines() if line.startswith(directory))[:limit]

    def detect_virt(self, kind: str) -> str | None:
        result = self.connection.run(["systemd-detect-virt", kind], timeout=30, limit=256)
        if result.returncode not in (0, 1):  # 127: not installed
            return None
        return result.stdout.strip()[:64] or None

    def kernel_config(self, release: str) -> tuple[str | None, str | None]:
        for path, argv in ((f"/boot/config-{release}", ["head", "-c", str(KERNEL_CONFIG_LIMIT), "--"]),
                           ("/proc/config.gz", ["gzip", "-dc", "--"])):
            result = self.connection.run([*argv, path], timeout=60, limit=KERNEL_CONFIG_LIMIT)
            if result.returncode == 0 and result.stdout:
                return result.stdout[:KERNEL_CONFIG_LIMIT], path
        return None, None

    def cpus(self) -> list[int]:
        online = self.read_many(["/sys/devices/system/cpu/online"], 256)["/sys/devices/system/cpu/online"]
        try:
            return sorted(parse_cpulist(online or "0"))
        except ValueError:
            return [0]
