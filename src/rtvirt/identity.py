"""Which runs are comparable: a run's configuration identity (docs/results-store.md, "Comparable runs").

Two parts, both read from the manifest alone (runs stored before the identity was recorded get the same one):

- the **measurement**: the probe, what its values are (quantity, unit) and the parameters that shape them
  (interval, threads, CPUs, priority and policy, engine, workload kernel, report interval ...). Two runs whose
  measurements differ are not comparable: `rtvirt compare` refuses them, naming the difference. Parameters
  that only say how long a run went on (duration, loops, iterations) are left out, and so is the file an
  import came from; a simulated run's measurement is its model's content.
- the **setting**: where and beside what it ran (the environment's kind and label, the campaign's
  configuration label, a lab's target). Runs of one measurement in different settings are what an isolation
  question compares (stressed against solo, a VM against bare metal); runs of the same identity (measurement
  and setting) are what a regression gate compares, and what `rtvirt compare RUN` takes its baseline from.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .quantity import run_quantity

__all__ = ["run_identity", "identity_key", "measurement_differences", "setting_differences", "distinguishing"]

# parameters that say how long a run went on, not what it measured; rt is folded into priority, mlock, dma_latency
EXTENT_PARAMS = frozenset({"duration", "loops", "iterations", "rt"})
# CPU numbers count in the system the probe ran in: a guest's vCPU 0 is no host CPU 0, so they are compared
# only between runs in one place (same environment and target)
CPU_PARAMS = frozenset({"affinity", "sender_cpu"})
_PLACE = ("environment", "kind", "target")
_NAMES = {"affinity": "CPUs", "sender_cpu": "sender CPU"}


def _cpus(value: Any) -> Any:
    """A CPU list as people write it (0-1,3); None: not pinned."""
    if value is None:
        return "any"
    if not isinstance(value, list) or not all(isinstance(cpu, int) for cpu in value):
        return value
    ranges: list[str] = []
    for cpu in value:
        if ranges and "-" not in ranges[-1] and int(ranges[-1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1]}-{cpu}"
        elif ranges and "-" in ranges[-1] and int(ranges[-1].split("-")[1]) == cpu - 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)


def _measured_params(params: dict[str, Any]) -> dict[str, Any]:
    shaped = {name: value for name, value in params.items() if name not in EXTENT_PARAMS}
    if "affinity" in shaped:
        shaped["affinity"] = _cpus(shaped["affinity"])
    if "priority" in shaped and isinstance(shaped["priority"], int):
        shaped["priority"] = f"SCHED_FIFO {shaped['priority']}" if shaped["priority"] else "SCHED_OTHER"
    return shaped


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return None if value in (None, "") else str(value)[:500]


def run_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """``{"measurement": {...}, "setting": {...}}`` of a run's manifest."""
    source = manifest.get("source")
    params = _mapping(manifest.get("params"))
    if source == "simulated" and isinstance(manifest.get("model"), dict):
        shaped: dict[str, Any] = {"model": hashlib.sha256(json.dumps(manifest["model"], sort_keys=True,
                                                                      default=str).encode()).hexdigest()[:16]}
    elif source == "measured":
        shaped = _measured_params(params)
    else:  # imported: what the foreign tool ran with is not known; analysis: no values
        shaped = {}
    quantity = run_quantity(manifest)
    detail, target = _mapping(manifest.get("environment_detail")), _mapping(manifest.get("target"))
    return {
        "measurement": {"probe": _text(manifest.get("probe")), **quantity.as_dict(), "params": shaped},
        "setting": {"environment": _text(manifest.get("environment")), "kind": _text(detail.get("kind")),
                    "target": _text(target.get("label")), "config": _text(manifest.get("config"))},
    }


def identity_key(identity: dict[str, Any]) -> str:
    """A short key of a whole identity (the catalogs' ``identity`` column): equal keys, comparable runs of one
    configuration."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``name A vs B`` of every field both declare and set differently (a field one run does not declare, e.g.
    the parameters of an imported run, is unknown there, not different)."""
    found = []
    for name in a:
        if name not in b or a[name] == b[name]:
            continue
        if isinstance(a[name], dict) and isinstance(b[name], dict):
            found += _differences(a[name], b[name])
        else:
            found.append(f"{_NAMES.get(name, name.replace('_', ' '))} {_shown(a[name])} vs {_shown(b[name])}")
    return found


def measurement_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What makes the measurements of two identities differ ([]: comparable), e.g. ``threads 1 vs 2``; CPU
    numbers only between runs in one place (a VM's vCPU 0 against the host's CPU 1 is what a VM-against-bare-
    metal comparison is about)."""
    if all(a["setting"].get(key) == b["setting"].get(key) for key in _PLACE):
        return _differences(a["measurement"], b["measurement"])

    def placeless(identity: dict[str, Any]) -> dict[str, Any]:
        measurement = identity["measurement"]
        return {**measurement, "params": {k: v for k, v in measurement["params"].items() if k not in CPU_PARAMS}}

    return _differences(placeless(a), placeless(b))


def setting_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two identities' settings differ (environment, configuration label, target)."""
    return _differences(a["setting"], b["setting"])


def _flat(identity: dict[str, Any]) -> dict[str, Any]:
    measurement = identity.get("measurement") or {}
    return {**{k: v for k, v in measurement.items() if k != "params"}, **(measurement.get("params") or {}),
            **(identity.get("setting") or {})}


def distinguishing(identities: list[dict[str, Any]]) -> list[str]:
    """For runs sharing a label but not an identity: what each one's identity sets that the others set
    differently, as ``threads 2, CPUs 0-1`` ('' where nothing tells it apart)."""
    flat = [_flat(i) for i in identities]
    names = [name for name in dict.fromkeys(n for f in flat for n in f)
             if len({json.dumps(f.get(name), default=str) for f in flat}) > 1]
    return [", ".join(f"{_NAMES.get(n, n.replace('_', ' '))} {_shown(f.get(n))}" for n in names) for f in flat]
