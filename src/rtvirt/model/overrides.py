"""``--set`` and ``--sweep``: change one field of a model file without editing it.

A key is a dotted path; list elements are chosen by their ``name`` or by index:
``vm.nonrt.load``, ``vm.0.vcpu.0.budget``, ``hypervisor.scheduler``. A value is read as a TOML value
(``0.5``, ``"2ms"``, ``true``, ``[0, 1]``) and else taken as a string (``2ms``)."""

from __future__ import annotations

import copy
import tomllib
from typing import Any

from ..errors import InputError

__all__ = ["parse_assignment", "parse_sweep", "apply_override"]


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignment(text: str, option: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"option {option}: {text!r} is not KEY=VALUE (e.g. vm.nonrt.load=0.5)")
    return key.strip(), _value(value.strip())


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise InputError(f"option --sweep: {text!r} is not KEY=V1,V2,... (e.g. vm.nonrt.load=0,0.3,0.6,0.9)")
    return key.strip(), [_value(v) for v in items]


def apply_override(data: dict[str, Any], key: str, value: Any, option: str = "--set") -> dict[str, Any]:
    """A copy of the raw model with ``key`` set to ``value``."""
    result = copy.deepcopy(data)
    node: Any = result
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            chosen = [i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == part]
            if not chosen and part.isdigit() and int(part) < len(node):
                chosen = [int(part)]
            if not chosen:
                raise InputError(f"option {option}: {where!r} names no element (use a name or an index below "
                                 f"{len(node)})")
            if last:
                node[chosen[0]] = value
            else:
                node = node[chosen[0]]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if part not in node:
                    node[part] = {}
                node = node[part]
        else:
            raise InputError(f"option {option}: {where!r} is inside a value, not a table")
    return result
