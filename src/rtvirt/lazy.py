"""Names a package offers but imports on first use (PEP 562): a package's face without the cost of what stands
behind it. `rtvirt scenarios` reads every environment kind's configuration and needs none of their code; a host
run needs no Xen, libvirt or SSH code; a TCG guest or a nested dom0 that starts rtvirt pays seconds per module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each of ``names`` (name -> the submodule defining it, relative
    to ``package``) is imported the first time it is asked for."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
