"""Gantt chart (SVG) of what ran on each pCPU in a time window; every label is escaped."""

from __future__ import annotations

from html import escape
from pathlib import Path

from ..units import format_duration
from .core import SimResult

__all__ = ["gantt_svg", "write_gantt"]

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac"]
_SPECIAL = {-1: "gap probe", -2: "switch overhead", -3: "idle (budget held)"}
_ROW, _LEFT, _WIDTH, _TOP = 34, 90, 1000, 40


def gantt_svg(result: SimResult, start_ns: int, end_ns: int) -> str:
    span = max(1, end_ns - start_ns)
    pcpus = result.model.hypervisor.pcpus
    height = _TOP + pcpus * _ROW + 40 + 18 * ((len(result.vcpu_names) + 3) // 4 + 1)

    truncated = " (truncated: too many segments, choose a shorter window)" if result.counters.get(
        "gantt_truncated") else ""

    def x(t: int) -> float:
        return _LEFT + (t - start_ns) * _WIDTH / span

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 20}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{_LEFT}" y="18" font-size="14">{escape(result.model.name)}: '
             f'{escape(result.model.hypervisor.scheduler)} from {escape(format_duration(start_ns))} to '
             f'{escape(format_duration(end_ns))}{truncated}</text>']
    for p in range(pcpus):
        y = _TOP + p * _ROW
        parts.append(f'<text x="8" y="{y + 20}">CPU {p}</text>')
        parts.append(f'<line x1="{_LEFT}" y1="{y + _ROW - 2}" x2="{_LEFT + _WIDTH}" y2="{y + _ROW - 2}" '
                     'stroke="#ccc"/>')
    s = result.segments
    for cpu, vcpu, task, begin, end in zip(*(s[c].to_pylist() for c in ("cpu", "vcpu", "task", "start_ns",
                                                                         "end_ns")), strict=True):
        y = _TOP + cpu * _ROW
        color = _PALETTE[vcpu % len(_PALETTE)]
        label = _SPECIAL.get(task) or result.task_names[task]
        title = f"{result.vcpu_names[vcpu]} {label} {format_duration(begin)}-{format_duration(end)}"
        style = ' fill-opacity="0.35"' if task < 0 else ""
        parts.append(f'<rect x="{x(begin):.2f}" y="{y + 4}" width="{max(0.5, x(end) - x(begin)):.2f}" '
                     f'height="{_ROW - 10}" fill="{color}"{style}><title>{escape(title)}</title></rect>')
        if x(end) - x(begin) > 7 * len(label) and task >= 0:
            parts.append(f'<text x="{x(begin) + 2:.2f}" y="{y + 21}" fill="white">{escape(label)}</text>')
    axis = _TOP + pcpus * _ROW + 14
    for i in range(11):
        t = start_ns + span * i // 10
        parts.append(f'<text x="{x(t):.2f}" y="{axis}" text-anchor="middle">{escape(format_duration(t))}</text>')
    for i, name in enumerate(result.vcpu_names):
        lx, ly = _LEFT + (i % 4) * 250, axis + 22 + (i // 4) * 18
        parts.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{_PALETTE[i % len(_PALETTE)]}"/>'
                     f'<text x="{lx + 16}" y="{ly}">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_gantt(result: SimResult, path: Path, start_ns: int, end_ns: int) -> None:
    Path(path).write_text(gantt_svg(result, start_ns, end_ns), encoding="utf-8")
