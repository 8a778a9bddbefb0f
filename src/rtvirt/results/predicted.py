"""The report's "predicted next to measured" part: one table row per configuration and task with the analysed
bound and p50/p99/max of the simulated and measured distributions, the findings in words, and a CDF
overlay of both distributions with the bound as a vertical line (HTML)."""

from __future__ import annotations

import base64
from html import escape

import numpy as np

from ..predict.compare import Prediction

__all__ = ["prediction_tables", "prediction_html", "cdf_overlay"]


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.3f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def prediction_tables(rows: list[Prediction]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) tables for the report's renderers."""
    if not rows:
        return []
    table = []
    for p in rows:
        sim, meas = p.simulated, p.measured
        table.append([p.config, p.compare, p.metric, _us(p.bound_ns),
                      _us(sim.p50_ns), _us(sim.p99_ns), _us(sim.max_ns),
                      _us(meas.p50_ns if meas else None), _us(meas.p99_ns if meas else None),
                      _us(meas.max_ns if meas else None),
                      f"{_rate(sim.long_gap_rate)} / {_rate(meas.long_gap_rate if meas else None)}"
                      if p.metric == "gap" else "-"])
    findings = [[p.config, f] for p in rows for f in (p.findings or ["measured within the bound; bound not "
                                                                      "more than 2x the largest observed value"])]
    mapping = [[p.config, line] for p in rows for line in [*p.mapping, *(f"not modelled: {n}" for n in p.notes)]]
    return [
        ("Predicted next to measured (µs): analysed bound, simulated and measured distributions",
         ["configuration", "compared", "metric", "analysed bound", "simulated p50", "simulated p99", "simulated max",
          "measured p50", "measured p99", "measured max", "long gaps/s sim / meas"], table),
        ("Predicted next to measured: findings", ["configuration", "finding"], findings),
        ("How each configuration was modelled", ["configuration", "model"], mapping),
    ]


def cdf_overlay(p: Prediction) -> bytes:
    """Simulated and measured CDF on one plot, the analysed bound as a vertical line."""
    from .figures import _png, plt  # the report's matplotlib setup (Agg backend, PNG output)

    figure, axes = plt.subplots(figsize=(7, 3.6))
    for label, h in (("simulated", p.simulated_histogram), ("measured", p.measured_histogram)):
        if h is not None and h.n:
            # start each curve at share 0, so that a distribution of one value (a model's exact holes) shows
            x = np.concatenate([h.values[:1], h.values]) / 1000
            y = np.concatenate([[0.0], h.cumulative / h.n])
            axes.step(x, y, where="post", label=f"{label} ({h.n} samples)")
    if p.bound_ns is not None:
        axes.axvline(p.bound_ns / 1000, color="black", linestyle="--", label="analysed bound")
    axes.set_xscale("log")
    axes.set_xlabel(("gap length" if p.metric == "gap" else "wake-up latency") + " (µs, log)")
    axes.set_ylabel("share ≤ x")
    axes.set_title(f"{p.config}: {p.compare}", fontsize="medium")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)


def prediction_html(rows: list[Prediction]) -> str:
    """The HTML section: per configuration its CDF overlay and its findings."""
    if not rows:
        return ""
    parts = ["<h2>Predicted next to measured</h2>"]
    for p in rows:
        png = base64.b64encode(cdf_overlay(p)).decode("ascii")
        parts.append(f"<h3>{escape(p.config)}</h3>")
        parts.append(f'<img alt="{escape("CDF simulated vs measured " + p.config)}" src="data:image/png;base64,{png}">')
        if p.findings:
            parts.append("<ul>" + "".join(f"<li>{escape(f)}</li>" for f in p.findings) + "</ul>")
    return "\n".join(parts)
