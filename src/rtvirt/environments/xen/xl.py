"""Parsers of ``xl``'s output: column tables, ``xl info``, ``xl vcpu-list``, and what ``xl info`` refuses."""

from __future__ import annotations

import re


def _table(text: str) -> list[dict[str, str]]:
    """``xl``'s column output as rows keyed by header (the last column takes the rest of the line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = re.split(r"\s{1,}", lines[0].strip())
    rows = []
    for line in lines[1:]:
        values = line.split(None, len(header) - 1)
        rows.append(dict(zip(header, values, strict=False)))
    return rows

def _xl_info(text: str) -> dict[str, str]:
    """``xl info`` as key -> value (values bounded: they come from dom0)."""
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and re.fullmatch(r"[a-z_0-9]+", key.strip()):
            info[key.strip()] = value.strip()[:512]
    return info

def _mode_refusal(mode: str, info: str) -> str | None:
    """Why this Xen cannot create ``mode`` domUs, from ``xl info``; None when it can. PVH and HVM domUs run
    on Xen's HVM side, which needs hardware virtualisation and paging for guests: HAP (EPT/NPT) or shadow
    paging (Debian's hypervisor is built without shadow paging)."""
    if mode == "pv":
        return None
    caps = _xl_info(info).get("virt_caps", "")
    words = set(caps.split())
    if "hvm" in words and words & {"hap", "shadow"}:
        return None
    return (f"mode = {mode!r}: this Xen cannot create {mode.upper()} domUs: xl info says virt_caps: {caps or '?'} "
            "(they need hvm and hap or shadow: VT-x/AMD-V with EPT/NPT, or a hypervisor with shadow paging); "
            "use mode = 'pv'")

def _vcpu_list(text: str) -> list[dict[str, str]]:
    """``xl vcpu-list``: its header ("Affinity (Hard / Soft)") does not split like its rows."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 9 and fields[-2] == "/":
            rows.append({"name": fields[0], "id": fields[1], "vcpu": fields[2], "cpu": fields[3],
                         "state": fields[4], "time_s": fields[5], "hard_affinity": fields[6],
                         "soft_affinity": fields[8]})
    return rows
