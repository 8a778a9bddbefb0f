"""xen: the workload in a Xen domU, created with ``xl`` in dom0.

dom0 is either this machine (rtvirt runs in a Xen host's dom0: ``xl`` runs locally) or a Xen lab
(lab.py: Xen and a small dom0 booted in QEMU, ``xl`` driven over SSH). Both go through the same
:class:`Dom0` with a different transport, so everything below is "xl in dom0".

A run creates the measuring domU paused (``xl create -p``), puts it in the scenario's cpupool, applies
the scheduler parameters, reads every setting back from ``xl`` into the manifest and only then unpauses
it. Samples leave the domU live over its vif: the probe's stdout goes through busybox ``nc`` to a
listener in dom0, whose output is the run's stream file (over SSH in the lab). Domains and cpupools
carry rtvirt's name prefix so that a killed campaign's leftovers are recognised and removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_names
from .config import Arinc653Params, CreditParams, RtdsParams, XenConfig, XenLabConfig

if TYPE_CHECKING:
    from .dom0 import NAME_PREFIX
    from .domain import XenEnvironment
    from .files import local_domu_files
    from .lab import XenLab
    from .local import is_dom0

# the configuration at once (a scenario's schema reads it), the rest when asked for
__getattr__ = lazy_names(__name__, {"NAME_PREFIX": ".dom0", "XenEnvironment": ".domain",
                                    "local_domu_files": ".files", "XenLab": ".lab", "is_dom0": ".local"})

__all__ = ["NAME_PREFIX", "Arinc653Params", "CreditParams", "RtdsParams", "XenConfig", "XenEnvironment",
           "XenLab", "XenLabConfig", "is_dom0", "local_domu_files"]
