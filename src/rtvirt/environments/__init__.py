"""The environment registry: one module per platform under test, one line per environment here."""

from __future__ import annotations

from .base import Environment, EnvironmentConfig, Launched, SharedResources
from .host import HostEnvironment
from .libvirt import LibvirtEnvironment
from .partition import PartitionEnvironment
from .qemu import QemuEnvironment
from .ssh import SshEnvironment
from .xen import XenEnvironment

__all__ = ["ENVIRONMENTS", "Environment", "EnvironmentConfig", "Launched", "SharedResources"]

ENVIRONMENTS: dict[str, type[Environment]] = {env.kind: env for env in (
    HostEnvironment,
    PartitionEnvironment,
    QemuEnvironment,
    LibvirtEnvironment,
    SshEnvironment,
    XenEnvironment,
)}
