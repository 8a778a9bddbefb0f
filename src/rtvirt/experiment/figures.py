"""The experiment's standard figures (PNG, matplotlib) and a self-contained HTML page with them, the
dominance table and the published findings beside ours: acceptance ratio vs utilisation per scheduler with
95 % intervals, interface bandwidth and its overhead vs utilisation, simulated misses where the analysis
rejected. One panel set per question and per combination of the other axes."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

__all__ = ["figure_pngs", "experiment_html", "experiments_html"]

_CURVE_KEYS = ("vms", "tasks_per_vm", "pcpus", "utilizations", "periods", "deadlines", "guest_scheduler",
               "server_period", "spare")


def _series(curves: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]]:
    """(question, other axes) -> scheduler -> curve rows by utilisation."""
    out: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for c in curves:
        key = (c["question"], *(c[k] for k in _CURVE_KEYS))
        out.setdefault(key, {}).setdefault(c["scheduler"], []).append(c)
    for by_scheduler in out.values():
        for rows in by_scheduler.values():
            rows.sort(key=lambda c: c["target_utilization"])
    return out


def _title(key: tuple[Any, ...]) -> str:
    return f"{key[0]}: " + ", ".join(f"{k}={v}" for k, v in zip(_CURVE_KEYS, key[1:], strict=True))


def figure_pngs(summary: dict[str, Any]) -> list[tuple[str, bytes]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    for key, by_scheduler in _series(summary["curves"]).items():
        figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for scheduler, rows in sorted(by_scheduler.items()):
            x = [r["target_utilization"] for r in rows]
            line, = axes[0].plot(x, [r["acceptance"] for r in rows], marker="o", ms=3, label=scheduler)
            axes[0].fill_between(x, [r["acceptance_low"] for r in rows], [r["acceptance_high"] for r in rows],
                                 color=line.get_color(), alpha=0.2)
            if any(r["sim_no_miss"] is not None for r in rows):
                axes[0].plot(x, [r["sim_no_miss"] for r in rows], ls=":", color=line.get_color())
            axes[1].plot(x, [r["mean_bandwidth"] for r in rows], marker="o", ms=3, color=line.get_color(),
                         label=f"{scheduler} bandwidth")
            axes[1].plot(x, [r["mean_overhead"] for r in rows], ls="--", color=line.get_color())
            axes[2].plot(x, [r["rejected_with_misses"] / r["rejected_simulated"] if r["rejected_simulated"]
                             else None for r in rows], marker="o", ms=3, color=line.get_color(), label=scheduler)
        axes[0].set(xlabel="utilisation per pCPU", ylabel="acceptance ratio (95 % CI; dotted: simulated no-miss)",
                    ylim=(-0.02, 1.02))
        axes[1].set(xlabel="utilisation per pCPU", ylabel="bandwidth per pCPU (dashed: overhead), accepted")
        axes[2].set(xlabel="utilisation per pCPU", ylabel="share with simulated misses, analysis rejected",
                    ylim=(-0.02, 1.02))
        axes[0].legend(fontsize=8)
        figure.suptitle(_title(key), fontsize=9)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
        plt.close(figure)
        figures.append((_title(key), buffer.getvalue()))
    return figures


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(name: str, description: str, findings: list[str], summary: dict[str, Any], level: int) -> str:
    h, sub = f"h{level}", f"h{level + 1}"
    parts = [f"<{h}>Experiment {html.escape(name)}</{h}><p>{html.escape(description)}</p>"]
    if findings:
        parts.append(f"<{sub}>Published findings (compare with the curves below)</{sub}><ul>"
                     + "".join(f"<li>{html.escape(f)}</li>" for f in findings) + "</ul>")
    for title, png in figure_pngs(summary):
        encoded = base64.b64encode(png).decode()
        parts.append(f"<{sub}>{html.escape(title)}</{sub}><img alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{encoded}'>")
    parts.append(f"<{sub}>Which analysis accepts most, where</{sub}><ul>"
                 + "".join(f"<li>{html.escape(w)}</li>" for w in summary.get("where", [])) + "</ul>" + _table(
        ["point", "question", "utilisation", "best", "acceptance", "tied within 95 % CI"],
        [[d["point"], d["question"], d["target_utilization"], d["best"], f"{d['acceptance']:.3f}",
          ", ".join(d["within_ci"])] for d in summary["dominance"]]))
    return "".join(parts)


def experiments_html(sections: list[dict[str, Any]]) -> str:
    """The report's section: one sub-section per experiment run (experiment.report.experiment_section)."""
    return "<h2>Experiments</h2>" + "".join(
        _section(f"{s['name']} ({s['run_id']}, {s['status']})", s["description"], s["findings"], s, 3)
        for s in sections)


def experiment_html(name: str, description: str, findings: list[str], summary: dict[str, Any]) -> str:
    """A page of its own for one experiment (RUN/experiment.html)."""
    style = "body{font-family:sans-serif;max-width:1200px}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>" \
           + _section(name, description, findings, summary, 1) + "</body></html>"
