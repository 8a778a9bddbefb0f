"""libvirt: the workload in a libvirt domain, as KVM is deployed (domain XML with ``<cputune>``).

rtvirt writes the domain XML itself (vCPU and emulator pinning, ``vcpusched``, memory locking, hugepages,
NUMA placement) and talks to libvirtd through libvirt-python, locally (``qemu:///system``) or remotely
(``qemu+ssh://...``). Everything QEMU reads or writes goes through the libvirt connection, so a remote
host needs nothing from us beforehand:

- the guest kernel and the run's initramfs (guest_image.py) are uploaded as volumes of a storage pool
  libvirt owns (``rtvirt``, a directory under /var/lib/libvirt/images); libvirt's own security drivers
  (DAC ownership, AppArmor) then grant QEMU access to them, with no ``seclabel`` override;
- the console and the samples' virtio-serial port are read through the connection
  (``virDomainOpenConsole`` / ``virDomainOpenChannel``) and written to the run directory here.

The domain is defined, started paused, its streams are opened, and only then does it run. Every
domain carries an owner record (host, pid, process start time) in its metadata: ``reclaim`` destroys
and undefines the domains of a campaign that was killed, and only those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_names
from .config import LibvirtConfig, VcpuSched

if TYPE_CHECKING:
    from .connection import DOMAIN_PREFIX, LibvirtConnection
    from .domain import LibvirtEnvironment
    from .host import hugepage_problem, memlock_problem, numa_problem, resctrl_problem
    from .rt_throttling import RtThrottlingLifted

# the configuration at once (a scenario's schema reads it), the rest when asked for
__getattr__ = lazy_names(__name__, {
    "DOMAIN_PREFIX": ".connection", "LibvirtConnection": ".connection", "LibvirtEnvironment": ".domain",
    "hugepage_problem": ".host", "memlock_problem": ".host", "numa_problem": ".host", "resctrl_problem": ".host",
    "RtThrottlingLifted": ".rt_throttling"})

__all__ = ["DOMAIN_PREFIX", "LibvirtConfig", "LibvirtConnection", "LibvirtEnvironment", "RtThrottlingLifted",
           "VcpuSched", "hugepage_problem", "memlock_problem", "numa_problem", "resctrl_problem"]
