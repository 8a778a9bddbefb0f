"""Results stores chosen by ``--results`` / RTVIRT_RESULTS: a local directory or a shared store's URL."""

from __future__ import annotations

from pathlib import Path

from .base import Delivery, LocalStore, RunStore, resolve_in

__all__ = ["open_store", "is_store_url", "RunStore", "LocalStore", "Delivery", "resolve_in", "ENV"]

ENV = "RTVIRT_RESULTS"
# URL scheme -> the module of its store (imported only when such a URL is given)
_SHARED = {"postgresql": "postgres", "postgres": "postgres"}


def is_store_url(spec: str | Path) -> bool:
    return isinstance(spec, str) and "://" in spec


def open_store(spec: str | Path) -> RunStore:
    """The store ``spec`` names: a URL of a shared store, else a results directory."""
    if not is_store_url(spec):
        return LocalStore(Path(spec))
    scheme = str(spec).split("://", 1)[0].lower()
    if scheme not in _SHARED:
        from ..errors import InputError
        from .postgres import redact_url

        raise InputError(f"results store {redact_url(str(spec))}: unknown kind of store {scheme!r} "
                         f"(a directory, or {', '.join(sorted(_SHARED))}://)")
    from .postgres import SharedStore

    return SharedStore(str(spec))
