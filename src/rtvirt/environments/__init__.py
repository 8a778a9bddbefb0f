"""The environment registry: one module per platform under test, one line per environment here."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from importlib import import_module

from .base import Environment, EnvironmentConfig, Launched, SharedResources

__all__ = ["ENVIRONMENTS", "Environment", "EnvironmentConfig", "Launched", "SharedResources"]


class EnvironmentKinds(MutableMapping[str, type[Environment]]):
    """kind -> its Environment class, the kind's module imported when the class is first asked for: a run
    imports the code of the kinds it runs only (the scenario's schema reads the configurations alone)."""

    def __init__(self, modules: dict[str, str]) -> None:
        self._entries: dict[str, str | type[Environment]] = dict(modules)  # "module:Class", or the class

    def __getitem__(self, kind: str) -> type[Environment]:
        entry = self._entries[kind]
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = self._entries[kind] = getattr(import_module(module, __name__), name)
        return entry

    def __setitem__(self, kind: str, environment: type[Environment]) -> None:
        self._entries[kind] = environment

    def __delitem__(self, kind: str) -> None:
        del self._entries[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


ENVIRONMENTS = EnvironmentKinds({
    "host": ".host:HostEnvironment",
    "partition": ".partition:PartitionEnvironment",
    "qemu": ".qemu:QemuEnvironment",
    "libvirt": ".libvirt:LibvirtEnvironment",
    "ssh": ".ssh:SshEnvironment",
    "xen": ".xen:XenEnvironment",
})
