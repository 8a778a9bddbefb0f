"""The report's figures, drawn with matplotlib from exact histograms (no sampling) and returned as PNG bytes.

Box plots use the exact whiskers and quartiles; violins are densities of the exact histogram on a log
axis; histograms use 1 µs bins with log counts per CPU (the OSADL layout); time series are thinned for
drawing only, always keeping the largest values.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display: figures go into files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..stats import Histogram, Summary  # noqa: E402
from ..store import StoredRun  # noqa: E402
from .windows import TimeProfile, load_series  # noqa: E402

__all__ = ["box_violin", "histograms_per_cpu", "cdf", "time_series", "window_maxima"]

_US = 1000.0
_SERIES_POINTS = 20_000


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def _short(label: str, width: int = 24) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def box_violin(labels: list[str], summaries: list[Summary], histograms: list[Histogram]) -> bytes:
    figure, (box_axes, violin_axes) = plt.subplots(1, 2, figsize=(11, 4.2 if len(labels) <= 5 else 5.5))
    stats = [{"label": _short(label), "whislo": s.lower_whisker_ns / _US, "q1": s.q1_ns / _US,
              "med": s.median_ns / _US, "q3": s.q3_ns / _US, "whishi": s.upper_whisker_ns / _US,
              "mean": s.mean_ns / _US, "fliers": [s.max_ns / _US]} for label, s in zip(labels, summaries, strict=True)]
    box_axes.bxp(stats, showmeans=True, showfliers=True)
    box_axes.set_yscale("log")
    box_axes.set_ylabel("latency (µs, log)")
    box_axes.set_title("Box plot (Tukey whiskers; dot = max)")
    violins = []
    for h in histograms:
        low, high = max(float(h.values[0]), 1.0), max(float(h.values[-1]), 2.0)
        edges = np.geomspace(low, high * 1.0001 if high > low else low * 2, 80)
        density, _ = np.histogram(h.values, bins=edges, weights=h.counts.astype(float))
        density = np.convolve(density, np.ones(3) / 3, mode="same")
        centers = np.sqrt(edges[:-1] * edges[1:])
        violins.append({"coords": centers / _US, "vals": density / max(density.max(), 1),
                        "mean": float(np.dot(h.values, h.counts) / h.n) / _US, "median": h.quantile(0.5) / _US,
                        "min": low / _US, "max": high / _US})
    violin_axes.violin(violins, showmedians=True, showextrema=True, widths=0.8)
    violin_axes.set_yscale("log")
    violin_axes.set_xticks(range(1, len(labels) + 1), [_short(label) for label in labels])
    violin_axes.set_ylabel("latency (µs, log)")
    violin_axes.set_title("Violin plot (density of all samples)")
    for axes in (box_axes, violin_axes):
        # Many configurations: steeper labels so that they do not overlap.
        axes.tick_params(axis="x", labelrotation=20 if len(labels) <= 5 else 60)
        axes.grid(axis="y", alpha=0.3)
    return _png(figure)


def histograms_per_cpu(label: str, per_cpu: dict[int, Histogram]) -> bytes:
    figure, axes = plt.subplots(figsize=(11, 3.6))
    for cpu, h in per_cpu.items():
        bins = h.values // 1000  # 1 µs bins
        edges = np.arange(int(bins.min()), int(bins.max()) + 2)
        counts = np.bincount(bins - bins.min(), weights=h.counts.astype(float), minlength=edges.size - 1)
        axes.step(edges[:-1], np.where(counts > 0, counts, np.nan), where="post", label=f"CPU {cpu}")
    axes.set_yscale("log")
    axes.set_xlabel("latency (µs, 1 µs bins)")
    axes.set_ylabel("samples (log)")
    axes.set_title(f"Latency histogram per CPU: {_short(label, 60)}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)


def cdf(labels: list[str], histograms: list[Histogram]) -> bytes:
    figure, (cdf_axes, tail_axes) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, h in zip(labels, histograms, strict=True):
        share = h.cumulative / h.n
        cdf_axes.step(h.values / _US, share, where="post", label=_short(label))
        survivors = 1 - np.concatenate([[0.0], share[:-1]])
        tail_axes.step(h.values / _US, survivors, where="post", label=_short(label))
    cdf_axes.set_xscale("log")
    cdf_axes.set_title("CDF")
    cdf_axes.set_ylabel("share of samples ≤ x")
    tail_axes.set_xscale("log")
    tail_axes.set_yscale("log")
    tail_axes.set_title("Tail: share of samples ≥ x")
    for axes in (cdf_axes, tail_axes):
        axes.set_xlabel("latency (µs, log)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return _png(figure)


def time_series(run: StoredRun, profile: TimeProfile, events: list[tuple[int, str]]) -> bytes:
    t, values = load_series(run, _SERIES_POINTS)
    figure, axes = plt.subplots(figsize=(11, 3.4))
    axes.plot(t / 1e9, values / _US, ".", markersize=2, alpha=0.6)
    for at, name in events:
        axes.axvline(at / 1e9, color="tab:red", linestyle="--", linewidth=1)
        axes.annotate(_short(name, 30), (at / 1e9, 0.97), xycoords=("data", "axes fraction"), rotation=90,
                      va="top", ha="right", fontsize="small", color="tab:red",
                      bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1})
    axes.set_yscale("log")
    axes.set_xlabel("time since first sample (s)")
    axes.set_ylabel("latency (µs, log)")
    axes.set_title(f"Time series: {_short(run.manifest.get('name') or run.run_id, 60)}")
    axes.grid(alpha=0.3)
    return _png(figure)


def window_maxima(run: StoredRun, profile: TimeProfile, events: list[tuple[int, str]]) -> bytes:
    figure, axes = plt.subplots(figsize=(11, 3.0))
    starts = np.array([w.start_ns for w in profile.windows]) / 1e9
    axes.step(starts, [w.max_ns / _US for w in profile.windows], where="post", label="max per window")
    axes.step(starts, [w.level_ns / _US for w in profile.windows], where="post", label="level per window")
    for at, _ in events:
        axes.axvline(at / 1e9, color="tab:red", linestyle="--", linewidth=1)
    axes.set_yscale("log")
    axes.set_xlabel("time since first sample (s)")
    axes.set_ylabel("latency (µs, log)")
    axes.set_title(f"Per-window maxima ({profile.window_ns / 1e9:g} s windows)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)
