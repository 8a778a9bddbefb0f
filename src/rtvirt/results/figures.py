"""The report's figures, drawn with matplotlib from exact histograms (no sampling) and returned as PNG bytes.

Box plots use the exact whiskers and quartiles; violins are densities of the exact histogram on a log
axis; histograms use 1 µs bins with log counts per CPU (the OSADL layout); time series are thinned for
drawing only, always keeping the largest values. Time series and per-window maxima are drawn per
configuration, every run of it in one figure, so a report of many runs stays a few dozen figures.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # no display: figures go into files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator  # noqa: E402

from ..quantity import LATENCY, Quantity  # noqa: E402
from ..stats import Histogram, Summary  # noqa: E402
from ..timeprofile.windows import TimeProfile  # noqa: E402
from .explained import CauseShare, Timeline  # noqa: E402
from .history import Trend  # noqa: E402

__all__ = ["box_violin", "histograms_per_cpu", "cdf", "time_series", "window_maxima", "trend_chart", "cause_bars",
           "outlier_timeline"]

_US = 1000.0
_SERIES_POINTS = 20_000
# (run id, t from the run's first sample, value, how many of its largest samples to keep whatever the thinning)
RunSeries = tuple[str, np.ndarray, np.ndarray, int]


def _log(axes: Axes, which: str) -> None:
    """A log ``which`` ("x" or "y") axis labelled in plain numbers (1, 10, 100) at each decade: the default
    10^n labels go through mathtext, whose parsing was a large share of the report's time."""
    (axes.set_xscale if which == "x" else axes.set_yscale)("log")
    axis = axes.xaxis if which == "x" else axes.yaxis
    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_locator(NullLocator())  # each tick is a few artists: minor ones cost more than the data


def _plain_number(value: float, _: int | None = None) -> str:
    """1, 10, 1000, 1e4, 1e5, 0.01, 1e-3: short enough for a narrow margin."""
    if value > 0 and not 1e-2 <= value < 1e4:
        exponent = math.log10(value)
        if abs(exponent - round(exponent)) < 1e-9:
            return f"1e{round(exponent)}"
    return f"{value:g}"


def _narrow_logs(figure: Figure) -> None:
    """A log axis spanning less than two decades gets ticks at 2 and 5 too (it may hold no power of 10)."""
    for axes in figure.axes:
        for axis, limits in ((axes.xaxis, axes.get_xlim()), (axes.yaxis, axes.get_ylim())):
            low, high = sorted(limits)
            if axis.get_scale() == "log" and low > 0 and high / low < 100:
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))


def _png(figure: Figure, bottom: float = 0.16, wspace: float | None = None) -> bytes:
    buffer = io.BytesIO()
    _narrow_logs(figure)
    # fixed margins: tight_layout measures every tick label again, about half the cost of a figure
    figure.subplots_adjust(left=0.075, right=0.985, top=0.9, bottom=bottom, wspace=wspace)
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def _short(label: str, width: int = 24) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def box_violin(labels: list[str], summaries: list[Summary], histograms: list[Histogram],
               quantity: Quantity = LATENCY) -> bytes:
    """Box and violin plots of configurations whose values are one ``quantity`` (in its unit)."""
    unit = quantity.scale
    figure, (box_axes, violin_axes) = plt.subplots(1, 2, figsize=(11, 4.2 if len(labels) <= 5 else 5.5))
    stats = [{"label": _short(label), "whislo": s.lower_whisker_ns / unit, "q1": s.q1_ns / unit,
              "med": s.median_ns / unit, "q3": s.q3_ns / unit, "whishi": s.upper_whisker_ns / unit,
              "mean": s.mean_ns / unit, "fliers": [s.max_ns / unit]}
             for label, s in zip(labels, summaries, strict=True)]
    box_axes.bxp(stats, showmeans=True, showfliers=True)
    _log(box_axes, "y")
    box_axes.set_ylabel(quantity.axis("log"))
    box_axes.set_title("Box plot (Tukey whiskers; triangle = mean, circle = max)")
    violins = []
    for h in histograms:
        low, high = max(float(h.values[0]), 1.0), max(float(h.values[-1]), 2.0)
        edges = np.geomspace(low, high * 1.0001 if high > low else low * 2, 80)
        density, _ = np.histogram(h.values, bins=edges, weights=h.counts.astype(float))
        density = np.convolve(density, np.ones(3) / 3, mode="same")
        centers = np.sqrt(edges[:-1] * edges[1:])
        violins.append({"coords": centers / unit, "vals": density / max(density.max(), 1),
                        "mean": float(np.dot(h.values, h.counts) / h.n) / unit, "median": h.quantile(0.5) / unit,
                        "min": low / unit, "max": high / unit})
    violin_axes.violin(violins, showmedians=True, showextrema=True, widths=0.8)
    _log(violin_axes, "y")
    violin_axes.set_xticks(range(1, len(labels) + 1), [_short(label) for label in labels])
    violin_axes.set_ylabel(quantity.axis("log"))
    violin_axes.set_title("Violin plot (density of all samples)")
    for axes in (box_axes, violin_axes):
        # Many configurations: steeper labels so that they do not overlap.
        axes.tick_params(axis="x", labelrotation=20 if len(labels) <= 5 else 60)
        axes.grid(axis="y", alpha=0.3)
    return _png(figure, bottom=0.24 if len(labels) <= 5 else 0.36, wspace=0.22)


def histograms_per_cpu(label: str, per_cpu: dict[int, Histogram], quantity: Quantity = LATENCY) -> bytes:
    """Counts per CPU in bins of one shown unit (1 µs; 1 round)."""
    figure, axes = plt.subplots(figsize=(11, 3.6))
    for cpu, h in per_cpu.items():
        bins = h.values // int(quantity.scale)
        edges = np.arange(int(bins.min()), int(bins.max()) + 2)
        counts = np.bincount(bins - bins.min(), weights=h.counts.astype(float), minlength=edges.size - 1)
        axes.step(edges[:-1], np.where(counts > 0, counts, np.nan), where="post", label=f"CPU {cpu}")
    _log(axes, "y")
    axes.set_xlabel(quantity.axis("1 µs bins" if quantity.is_time else "bins of 1"))
    axes.set_ylabel("samples (log)")
    axes.set_title(f"Histogram per CPU: {_short(label, 60)}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="upper right")  # "best" would test every point of every line
    return _png(figure)


def cdf(labels: list[str], histograms: list[Histogram], quantity: Quantity = LATENCY) -> bytes:
    figure, (cdf_axes, tail_axes) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, h in zip(labels, histograms, strict=True):
        # Drawn at most ~4,000 points per line (a figure is ~1,000 pixels wide): every k-th distinct value,
        # and every one of the last 1,000, where the tail plot resolves single samples.
        keep = np.zeros(h.values.size, bool)
        keep[:: max(1, h.values.size // 3000)] = True
        keep[-1000:] = True
        share = h.cumulative / h.n
        survivors = 1 - np.concatenate([[0.0], share[:-1]])
        cdf_axes.step(h.values[keep] / quantity.scale, share[keep], where="post", label=_short(label))
        tail_axes.step(h.values[keep] / quantity.scale, survivors[keep], where="post", label=_short(label))
    _log(cdf_axes, "x")
    cdf_axes.set_title("CDF")
    cdf_axes.set_ylabel("share of samples ≤ x")
    _log(tail_axes, "x")
    _log(tail_axes, "y")
    tail_axes.set_title("Tail: share of samples ≥ x")
    for axes in (cdf_axes, tail_axes):
        axes.set_xlabel(quantity.axis("log"))
        axes.grid(alpha=0.3)
    cdf_axes.legend(fontsize="small", loc="lower right")
    tail_axes.legend(fontsize="small", loc="lower left")
    return _png(figure, wspace=0.22)


def _events(axes: Axes, events: list[tuple[int, str]], labelled: bool) -> None:
    for at, name in events:
        axes.axvline(at / 1e9, color="tab:red", linestyle="--", linewidth=1)
        if labelled:
            axes.annotate(_short(name, 30), (at / 1e9, 0.97), xycoords=("data", "axes fraction"), rotation=90,
                          va="top", ha="right", fontsize="small", color="tab:red",
                          bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1})


def time_series(label: str, runs: list[RunSeries], events: list[tuple[int, str]],
                quantity: Quantity = LATENCY) -> bytes:
    """Every run of a configuration, time from each run's first sample: about _SERIES_POINTS points in all
    (each run's thinned series thinned again), each run's largest samples always kept."""
    figure, axes = plt.subplots(figsize=(11, 3.4))
    share = max(1, _SERIES_POINTS // max(1, len(runs)))
    for _, t, values, largest in runs:
        step = max(1, t.size // share)
        keep = np.zeros(t.size, bool)
        keep[::step] = True
        keep[np.argsort(-values, kind="stable")[:largest]] = True  # the largest ones of this run
        axes.plot(t[keep] / 1e9, values[keep] / quantity.scale, ".", markersize=2, alpha=0.6)
    _events(axes, events, labelled=True)
    _log(axes, "y")
    axes.set_xlabel("time since the run's first sample (s)")
    axes.set_ylabel(quantity.axis("log"))
    runs_note = f" ({len(runs)} runs, one colour each)" if len(runs) > 1 else ""
    axes.set_title(f"Time series: {_short(label, 60)}{runs_note}")
    axes.grid(alpha=0.3)
    return _png(figure)


def window_maxima(label: str, profiles: list[tuple[str, TimeProfile]], events: list[tuple[int, str]],
                  quantity: Quantity = LATENCY) -> bytes:
    figure, axes = plt.subplots(figsize=(11, 3.0))
    many = len(profiles) > 1
    for index, (_, profile) in enumerate(profiles):
        colour = f"C{index % 10}"
        starts = np.array([w.start_ns for w in profile.windows]) / 1e9
        axes.step(starts, [w.max_ns / quantity.scale for w in profile.windows], where="post", color=colour,
                  label=None if many else "max per window", linewidth=1)
        axes.step(starts, [w.level_ns / quantity.scale for w in profile.windows], where="post",
                  color=colour if many else "C1",
                  linestyle=":" if many else "-", alpha=0.8 if many else 1.0,
                  label=None if many else "level per window", linewidth=1)
    _events(axes, events, labelled=False)
    _log(axes, "y")
    axes.set_xlabel("time since the run's first sample (s)")
    axes.set_ylabel(quantity.axis("log"))
    windows = sorted({p.window_ns for _, p in profiles})
    what = f"{len(profiles)} runs: max per window solid, level dotted; " if many else ""
    axes.set_title(f"Per-window maxima: {_short(label, 40)} ({what}{', '.join(f'{w / 1e9:g}' for w in windows)} s "
                   "windows)")
    axes.grid(alpha=0.3)
    if not many:
        axes.legend(fontsize="small", loc="upper right")
    return _png(figure)


def trend_chart(trend: Trend) -> bytes:
    """A statistic of one configuration run after run, a line per machine, a dashed mark at each run whose
    kernel, hypervisor, scenario or rtvirt changed (the OSADL long-term plot's layout)."""
    figure, axes = plt.subplots(figsize=(10, 3.6))
    for machine, points in trend.machines.items():
        xs = [i for i, p in enumerate(points) if isinstance(p.value, int | float)]
        ys = [float(points[i].value) / trend.quantity.scale for i in xs]  # type: ignore[arg-type]
        axes.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=_short(machine))
        for i, point in enumerate(points):
            if point.changes:
                axes.axvline(i - 0.5, color="grey", linestyle="--", linewidth=0.8)
                text = ", ".join(f"{column} {after}" for column, (_, after) in point.changes.items())
                axes.annotate(_short(text, 40), (i - 0.5, 1), xycoords=("data", "axes fraction"), fontsize=7,
                              rotation=90, va="top", ha="right", color="grey")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("run (oldest first)")
    axes.set_ylabel(f"{trend.metric} ({trend.quantity.shown_unit})")
    axes.set_title(_short(f"{trend.configuration}: {trend.metric} over time", 90), fontsize=10)
    axes.legend(fontsize=7, loc="upper left")
    return _png(figure)


def cause_bars(configurations: list[tuple[str, list[CauseShare]]], shown: int) -> bytes:
    """One horizontal bar per configuration, split into its causes' shares of the outlier latency: the
    ``shown`` largest causes over all configurations in colour (one colour per cause everywhere), the rest
    grey as "other"."""
    weight: dict[str, float] = {}
    for _, causes in configurations:
        for share in causes:
            weight[share.cause] = weight.get(share.cause, 0.0) + share.share
    named = sorted(weight, key=lambda cause: -weight[cause])[:shown]
    colours = {cause: f"C{index % 10}" for index, cause in enumerate(named)}
    figure, axes = plt.subplots(figsize=(11, 1.4 + 0.45 * len(configurations)))
    for row, (_, causes) in enumerate(configurations):
        left = 0.0
        for share in causes:
            if share.cause in colours:
                axes.barh(row, share.share * 100, left=left, color=colours[share.cause], edgecolor="white")
                left += share.share * 100
        other = sum(share.share for share in causes if share.cause not in colours) * 100
        if other > 0:
            axes.barh(row, other, left=left, color="lightgrey", edgecolor="white")
    axes.set_yticks(range(len(configurations)), [_short(label, 30) for label, _ in configurations])
    axes.invert_yaxis()
    axes.set_xlim(0, 100)
    axes.set_xlabel("share of the explained outliers' latency (%)")
    axes.set_title("Outlier causes per configuration")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[cause]) for cause in named]
    if any(share.cause not in colours for _, causes in configurations for share in causes):
        handles.append(plt.Rectangle((0, 0), 1, 1, color="lightgrey"))
        named = [*named, "other"]
    # one cause a line, long enough for a task with its pid and policy (the causes table has them whole)
    axes.legend(handles, [_short(cause, 110) for cause in named], fontsize="small", loc="upper center",
                bbox_to_anchor=(0.5, -0.3 if len(configurations) < 4 else -0.12), ncol=1, frameon=False)
    return _png_fitted(figure)


def _png_fitted(figure: Figure) -> bytes:
    """PNG bytes of a figure whose lane labels and legend set its margins (few figures: the fitting is cheap)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def outlier_timeline(label: str, timeline: Timeline) -> bytes:
    """What ran on an outlier's CPU around it, one lane per layer and cause (µs from the planned wake-up),
    the latency window shaded and its parts drawn on the top lane."""
    origin = timeline.start_ns
    lanes: list[tuple[str, str]] = [("window", "parts")]
    for occupancy in timeline.occupancies:
        if (occupancy.layer, occupancy.cause) not in lanes:
            lanes.append((occupancy.layer, occupancy.cause))
    figure, axes = plt.subplots(figsize=(11, 1.2 + 0.3 * len(lanes)))
    colours = {lane: f"C{index % 10}" for index, lane in enumerate(lanes[1:])}
    axes.axvspan(0, timeline.latency_ns / _US, color="tab:red", alpha=0.08)
    for part in timeline.parts:
        colour = colours.get((part.layer, part.cause), "lightgrey")
        axes.broken_barh([(part.offset_ns / _US, part.duration_ns / _US)], (-0.4, 0.8), color=colour,
                         edgecolor="black", linewidth=0.3)
    for occupancy in timeline.occupancies:
        lane = lanes.index((occupancy.layer, occupancy.cause))
        start = max(occupancy.start_ns, timeline.from_ns) - origin
        end = min(occupancy.end_ns, timeline.to_ns) - origin
        axes.broken_barh([(start / _US, max(end - start, 1) / _US)], (lane - 0.4, 0.8), color=colours[lanes[lane]])
    axes.set_yticks(range(len(lanes)), ["latency window"] + [_short(f"{layer}: {cause}", 44)
                                                             for layer, cause in lanes[1:]], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlim((timeline.from_ns - origin) / _US, (timeline.to_ns - origin) / _US)
    axes.set_xlabel("µs from the planned wake-up")
    axes.set_title(_short(f"{label}: outlier {timeline.rank} of {timeline.run_id} on CPU {timeline.cpu}, "
                          f"{timeline.latency_ns / _US:,.1f} µs", 100), fontsize=10)
    axes.grid(axis="x", alpha=0.3)
    return _png_fitted(figure)
