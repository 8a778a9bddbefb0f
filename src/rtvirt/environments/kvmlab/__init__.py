"""The KVM lab: a real KVM host (Debian's kernel with kvm-amd, Debian's QEMU and libvirtd, sshd) booted in QEMU
where no KVM host is at hand, and the ``host``/``lab`` fields of the environments that run guests under KVM.

One module per concern: ``config`` (the fields), ``arch`` (what differs between architectures), ``image`` (the
Debian root and the boot initramfs, built once and cached), ``lab`` (one boot, over SSH).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_names
from .config import LAB_HOST, LOCAL_HOST, KvmHost, KvmHostFields, KvmLabConfig

if TYPE_CHECKING:
    from .lab import LAB_WARNING, KvmLab, open_kvm_lab, reclaim_kvm_labs

# the fields at once (a scenario's schema reads them), the lab when a campaign boots one
__getattr__ = lazy_names(__name__, dict.fromkeys(("LAB_WARNING", "KvmLab", "open_kvm_lab", "reclaim_kvm_labs"),
                                                 ".lab"))

__all__ = ["LAB_HOST", "LAB_WARNING", "LOCAL_HOST", "KvmHost", "KvmHostFields", "KvmLab", "KvmLabConfig",
           "open_kvm_lab", "reclaim_kvm_labs"]
