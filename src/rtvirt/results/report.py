"""``rtvirt report``: one self-contained HTML file (figures embedded as PNG data URIs, no network), or the
same content as Markdown or JSON. Every format is rendered from one report model (:func:`report_model`):
the tables (the studies' among them, with the published figures and readings), which classes each
configuration serves, the runs' warnings and the data behind the figures. Every string that comes from a run
is escaped."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..explain.attribute import headline
from ..fileio import write_atomically
from ..quantity import Quantity
from ..store import missed_periods
from ..timeprofile.levels import event_offsets
from ..timeprofile.windows import TOP_KEPT
from .explained import CAUSES_SHOWN
from .predicted import prediction_html, prediction_tables
from .reportdata import Configuration, ReportData, RunView, as_json, collect
from .studies.tables import published, study_tables

if TYPE_CHECKING:
    from ..stores import RunStore

__all__ = ["render", "report_model", "write_report", "FORMATS", "CSS"]

FORMATS = ("html", "markdown", "json")
_MAX_SETTING = 300  # characters of one system setting shown
_Table = tuple[str, list[str], list[list[str]]]  # title, header, rows


def _number(value: object) -> float | None:
    """A number stored in an explanation's JSON (None: not known)."""
    return float(value) if isinstance(value, int | float) else None


def _us(ns: float | None) -> str:
    return "-" if ns is None or (isinstance(ns, float) and math.isnan(ns)) else f"{ns / 1000:,.3f}"




def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.1f} %"


def _plain(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MAX_SETTING else text[:_MAX_SETTING] + "…"


# --- table content shared by HTML and Markdown -------------------------------------------------------------

_STAT_COLUMNS = ("samples", "lower whisker", "Q1", "median", "mean", "σ", "Q3", "upper whisker", "max", "max jitter",
                 "p99", "p99.9", "p99.99", "mean 95 % CI", "median 95 % CI", "dropped")


def _stat_row(c: Configuration) -> list[str]:
    s = c.summary

    def show(value: float) -> str:
        return c.quantity.show(value, grouped=True)

    return [str(s.samples), show(s.lower_whisker_ns), show(s.q1_ns), show(s.median_ns), show(s.mean_ns),
            show(s.stdev_ns), show(s.q3_ns), show(s.upper_whisker_ns), show(s.max_ns), show(s.max_jitter_ns),
            show(s.p99_ns), show(s.p999_ns), show(s.p9999_ns), f"{show(s.mean_ci_low_ns)} – {show(s.mean_ci_high_ns)}",
            f"{show(s.median_ci_low_ns)} – {show(s.median_ci_high_ns)}", str(s.dropped)]


def _label(c: Configuration) -> str:
    return c.label + (" (partial)" if c.partial else "") + (" (short)" if c.short else "")


def _by_quantity(configurations: list[Configuration]) -> dict[Quantity, list[Configuration]]:
    """Configurations by what their values are, in report order: a table holds one unit."""
    found: dict[Quantity, list[Configuration]] = {}
    for c in configurations:
        found.setdefault(c.quantity, []).append(c)
    return found


def _verdict_cells(c: Configuration, classes: int) -> list[str]:
    """One outcome per class; "-" for each when its values are not latencies (no class applies to them)."""
    return [v.outcome for v in c.verdicts] if c.quantity.judged else ["-"] * classes


def _isolation_tables(data: ReportData) -> list[_Table]:
    """One table per baseline: configurations measured as it was (same probe, workload, unit), nothing else."""
    tables = []
    for baseline in data.baselines:
        rows = [r for r in data.isolation if r.baseline == baseline]
        if not rows:
            continue
        quantity = next(c.quantity for c in data.configurations if c.label == baseline)
        unit = quantity.shown_unit
        largest = "WCET" if quantity.larger_is_worse else "max"
        tables.append((f"Isolation against the baseline {baseline}: {quantity.title}",
                       ["configuration", "mean increase", "median increase", "p99 increase", f"{largest} ({unit})",
                        f"baseline {largest} ({unit})", f"{largest} ratio", "caused by"],
                       [[r.label, _pct(r.mean_increase_pct), _pct(r.median_increase_pct), _pct(r.p99_increase_pct),
                         quantity.show(r.wcet_ns, grouped=True), quantity.show(r.baseline_wcet_ns, grouped=True),
                         f"{r.wcet_ratio:.2f}",
                         data.caused_by(r.label)] for r in rows]))
    return tables


def _tables(data: ReportData) -> list[_Table]:
    """(title, header, rows) of every table, in report order."""
    tables: list[_Table] = []
    names = [cls.name for cls in data.classes]
    tables.append((f"Verdicts (safety margin {data.margin:.0%}: worst case and jitter must stay within "
                   f"{1 - data.margin:.0%} of each budget; latencies only, \"-\": values that are not latencies)",
                   ["configuration", *names],
                   [[_label(c), *_verdict_cells(c, len(names))] for c in data.configurations]))
    for quantity, configurations in _by_quantity(data.configurations).items():
        tables.append((f"Statistics per configuration: {quantity.title}", ["configuration", *_STAT_COLUMNS],
                       [[_label(c), *_stat_row(c)] for c in configurations]))
    tables += _isolation_tables(data)
    tables += explanation_tables(data)
    for quantity, configurations in _by_quantity(data.configurations).items():
        tables += _run_tables(quantity, configurations)
    if data.tasks:
        tables.append(("Bound vs simulated vs measured worst case per task (µs)",
                       ["VM", "task", "analysis bound", "deadline", "schedulable", "simulated max", "measured max"],
                       [[t.vm, t.task, _us(t.bound_ns), _us(t.deadline_ns),
                         "-" if t.schedulable is None else ("yes" if t.schedulable else "no"),
                         _us(t.simulated_max_ns), _us(t.measured_max_ns)] for t in data.tasks]))
    tables += _history_tables(data)
    tables += prediction_tables(data.predictions)  # predicted next to measured (rtvirt.predict)
    tables += study_tables(data)  # the studies' own tables, for runs of a study scenario
    checklists = [[view.run.run_id, c.label, *_checklist(view)] for c in data.configurations for view in c.runs
                   if _checklist(view)]
    if checklists:
        tables.append(("Host checklist beside each run (rtvirt host check)",
                       ["run", "configuration", "tuned", "items met", "not ready"], checklists))
    runs = []
    for c in data.configurations:
        for view in c.runs:
            m = view.run.manifest
            runs.append([view.run.run_id, c.label, str(m.get("name", "")), str(m.get("source", "")),
                         str(m.get("status", "")), str(m.get("scenario") or "-"), str(m.get("environment") or "-"),
                         str(m.get("repetition") if m.get("repetition") is not None else "-"),
                         str(m.get("created", ""))])
    tables.append(("Runs", ["run", "configuration", "name", "source", "status", "scenario", "environment",
                            "repetition", "created"], runs))
    return tables


def _run_tables(quantity: Quantity, configurations: list[Configuration]) -> list[_Table]:
    """The per-run tables of configurations of one quantity, in its unit: outliers, stability marks, ramp and
    transitions."""
    unit, tables = quantity.shown_unit, []

    def show(value: float | None) -> str:
        return quantity.show(value, grouped=True)

    outliers, marks, levels = [], [], []
    for c in configurations:
        for view in c.runs:
            for o in view.outliers:
                outliers.append([c.label, view.run.run_id, f"{o.t_ns / 1e9:.3f}", str(o.cpu), show(o.value_ns),
                                 show(o.median_ns), "-" if o.value_cycles is None else f"{o.value_cycles:,.0f}",
                                 "-" if o.median_cycles is None else f"{o.median_cycles:,.0f}"])
            for end, s in view.profile.marks if view.profile else []:
                marks.append([c.label, view.run.run_id, f"{end / 1e9:.1f}", str(s.samples), show(s.median_ns),
                              show(s.p99_ns), show(s.max_ns)])
            if view.ramp:
                levels.append([view.run.run_id, "start-up ramp", f"0 – {view.ramp.end_ns / 1e9:.1f}",
                               f"{show(view.ramp.first_level)} (steady {show(view.ramp.steady_level)})",
                               _pct(view.ramp.first_deviation_pct)])
            for seg in view.segments:
                levels.append([view.run.run_id, f"after {seg.after_event}",
                               f"{seg.start_ns / 1e9:.1f} – {seg.end_ns / 1e9:.1f}",
                               f"median {show(seg.median_ns)}, mean {show(seg.mean_ns)}", f"max {show(seg.max_ns)}"])
            for sw in view.switches:
                levels.append([view.run.run_id, f"switch: {sw.event}", f"{sw.extreme_at_ns / 1e9:.1f}",
                               f"{show(sw.level_before)} → {show(sw.level_after)}, window {show(sw.extreme_level)}",
                               f"overshoot {_pct(sw.overshoot_pct)}"])
    if outliers:
        tables.append((f"Outliers (largest samples of each run): {quantity.title}",
                       ["configuration", "run", "time (s)", "CPU", f"value ({unit})", f"run median ({unit})",
                        "value (cycles)", "median (cycles)"], outliers))
    if marks:
        tables.append(("Stability: cumulative statistics at 1/8, 2/8, 4/8 and all of each run (the 1/2/4/8 h marks "
                       f"of an 8 h run): {quantity.title}",
                       ["configuration", "run", "up to (s)", "samples", f"median ({unit})", f"p99 ({unit})",
                        f"max ({unit})"], marks))
    if levels:
        tables.append((f"Ramp and transitions (ramp from window levels): {quantity.title}",
                       ["run", "stretch", "time (s)", "level", "change"], levels))
    return tables


def _history_tables(data: ReportData) -> list[_Table]:
    """Each configuration's largest value run after run, per machine, in its unit."""
    by_quantity: dict[Quantity, list[list[str]]] = {}
    for t in data.history:
        for machine, points in t.machines.items():
            for p in points:
                by_quantity.setdefault(t.quantity, []).append(
                    [t.configuration, machine, p.run_id, p.created[:19],
                     t.quantity.show(p.value, grouped=True) if isinstance(p.value, float) else "-",
                     "; ".join(f"{k}: {before} → {after}" for k, (before, after) in p.changes.items())])
    return [(f"History: each configuration's {'worst case' if quantity.larger_is_worse else 'largest value'} run "
             "after run, per machine (changes of kernel, hypervisor, scenario or rtvirt marked; `rtvirt trend` for "
             f"more): {quantity.title}",
             ["configuration", "machine", "run", "created", f"max ({quantity.shown_unit})",
              "changed since the last run"], rows) for quantity, rows in by_quantity.items()]


def explanation_tables(data: ReportData) -> list[_Table]:
    """The explained runs' tables: causes per configuration, the worst outliers part by part, and what each
    run's tracing could see (docs/explain.md "In the report")."""
    causes = [[c.label, share.layer, share.cause, str(share.outliers), _us(share.total_ns), f"{share.share:.1%}",
               _variants(share.variants)]
              for c in data.configurations for share in c.causes[:CAUSES_SHOWN]]
    if not causes:
        return []
    parts = [[c.label, t.run_id, str(t.rank), str(t.cpu), _us(t.latency_ns), part.layer, part.cause,
              _us(part.offset_ns), _us(part.duration_ns)]
             for c in data.configurations for t in c.timelines for part in t.parts]
    coverage = []
    for c in data.configurations:
        for view in c.runs:
            if view.explanation is None:
                continue
            explanation = view.explanation
            seen = ", ".join(f"{layer.layer} (±{_us(layer.alignment_ns)} µs)" for layer in explanation.layers
                             if layer.seen) or "-"
            unseen = "; ".join(f"{layer.layer}: {layer.why_not}" for layer in explanation.layers
                               if not layer.seen) or "-"
            notes = "; ".join(note for layer in explanation.layers for note in layer.notes) or "-"
            counts = headline(explanation.parts)
            coverage.append([view.run.run_id, c.label, explanation.threshold_rule, str(explanation.outliers),
                             f"{len({part.rank for part in explanation.parts})}: {counts['traced']} traced, "
                             f"{counts['held']} held back, {counts['unexplained']} unexplained",
                             str(missed_periods(view.run.manifest)), seen, unseen,
                             str(sum(layer.dropped_events for layer in explanation.layers)), _plain(notes)])
    exits = [[view.run.run_id, c.label, str(row["vcpu"]), f"{row['reason']} ({row['raw_reason']})",
              str(row["count"]), str(row["timed"]), _us(_number(row["total_ns"])), _us(_number(row["mean_ns"])),
              _us(_number(row["max_ns"]))]
             for c in data.configurations for view in c.runs if view.explanation is not None
             for layer in view.explanation.layers for row in layer.tables.get("kvm_exits", [])]
    return [
        (f"Outlier causes per configuration: share of the explained outliers' latency, one line per culprit "
         f"(largest {CAUSES_SHOWN})",
         ["configuration", "layer", "culprit", "outliers", "time (µs)", "share", "variants"], causes),
        ("Worst outliers part by part (µs from the planned wake-up)",
         ["configuration", "run", "rank", "CPU", "latency (µs)", "layer", "cause", "from (µs)", "for (µs)"], parts),
        ("What each explanation could see (periods missed: in no sample, so in no outlier)",
         ["run", "configuration", "threshold", "outliers", "explained", "periods missed", "layers seen (alignment)",
          "not seen", "dropped events", "notes"],
         coverage),
        *([("VM exits by reason (perf kvm stat; time over the exits the trace holds whole)",
            ["run", "configuration", "vCPU", "reason", "exits", "timed", "time (µs)", "mean (µs)", "max (µs)"],
            exits)] if exits else []),
    ]


def _variants(variants: list[dict[str, Any]]) -> str:
    """A culprit's variants in one cell ("before the timer interrupt 12.0%; as such 80.1%"), "-" when it has one
    plain variant only."""
    if len(variants) <= 1 and not (variants and variants[0]["variant"]):
        return "-"
    return "; ".join(f"{v['layer']}: {v['variant'] or 'as such'} {v['share']:.1%}" for v in variants)


def _checklist(view: RunView) -> list[str]:
    """The RT checklist state of the run's host (a partition's own tuning first): tuned profile, counts, misses."""
    detail, system = view.run.manifest.get("environment_detail"), view.run.manifest.get("system")
    found = (detail or {}).get("checklist") if isinstance(detail, dict) else None
    found = found or ((system or {}).get("checklist") if isinstance(system, dict) else None)
    if not isinstance(found, dict):
        return []
    missing = [str(i) for i in found.get("not_ready") or []]
    return [str(found.get("tuned") or "no"), f"{found.get('ok', 0)} of {int(found.get('ok', 0)) + len(missing)}",
            ", ".join(missing) or "-"]


def _settings(view: RunView) -> tuple[list[tuple[str, str]], list[str]]:
    system = view.run.manifest.get("system") or {}
    warnings = [str(w) for w in system.get("warnings") or []] if isinstance(system, dict) else []
    settings = [(str(k), _plain(v)) for k, v in system.items() if k != "warnings"] if isinstance(system, dict) else []
    return settings, warnings


# --- the report model: what every format shows -------------------------------------------------------------

def report_model(data: ReportData) -> dict[str, Any]:
    """Everything the report shows, as JSON-able data: the measurements (as_json), the classes each configuration
    serves, every table in report order (the studies' with the published figures beside ours and a reading of
    each), the runs' warnings, and the published figures of the studies the runs reproduce."""
    studies = sorted({str(view.run.manifest["study"]["name"]) for c in data.configurations for view in c.runs
                      if isinstance(view.run.manifest.get("study"), dict)
                      and view.run.manifest["study"].get("name") in published()})
    return {
        **as_json(data),
        # classes None: not judged (its values are durations or rounds; the classes' budgets are latencies)
        "served": [{"configuration": _label(c), "quantity": c.quantity.name,
                    "classes": [v.requirement for v in c.verdicts if v.outcome == "meets"] if c.quantity.judged
                    else None} for c in data.configurations],
        "partial": [c.label for c in data.configurations if c.partial],
        "shortfalls": [note for c in data.configurations for note in c.shortfalls],
        "tables": [{"title": title, "header": header, "rows": rows} for title, header, rows in _tables(data)],
        "warnings": {view.run.run_id: warnings for c in data.configurations for view in c.runs
                     if (warnings := _settings(view)[1])},
        "published": {name: published()[name] for name in studies},
    }


# --- HTML --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:min(96vw,1500px);color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.8em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f0f0f0}
.meets{background:#d7f5d7}.partly{background:#fff2c4}.fails{background:#f8d4d4}
.partial{color:#a60;font-weight:bold}.warn{color:#a00}
img{max-width:100%;border:1px solid #eee;margin:.3em 0}
.scroll{overflow-x:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
"""


def _html_table(title: str, header: list[str], rows: Iterable[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(f'<td class="{escape(cell)}">{escape(cell)}</td>' if cell in ("meets", "partly", "fails")
                        else f"<td>{escape(cell)}</td>" for cell in row)
        body.append(f"<tr>{cells}</tr>")
    return (f"<h2>{escape(title)}</h2>\n<div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _serves(served: dict[str, Any]) -> str:
    if served["classes"] is None:
        return f"not judged: its values ({served['quantity']}) are not latencies"
    return ", ".join(served["classes"]) or "no class"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _events(view: RunView) -> list[tuple[int, str]]:
    assert view.profile is not None
    return event_offsets(view.profile.first_ns, view.run.manifest.get("timeline") or [])


def _html(data: ReportData, model: dict[str, Any]) -> str:
    from . import figures  # matplotlib takes 0.5 s to import: only the HTML report pays for it

    tables = model["tables"]
    by_quantity = _by_quantity(data.configurations)
    lead = 1 + len(by_quantity)  # the verdicts and a statistics table per quantity, then the figures
    parts = _html_head(data, model)
    parts += [_html_table(table["title"], table["header"], table["rows"]) for table in tables[:lead]]
    for quantity, configurations in by_quantity.items():  # a figure holds values of one unit
        parts += _html_distributions(quantity, configurations)
    parts.append(prediction_html(data.predictions))
    if data.experiments:
        from ..experiment.figures import experiments_html

        parts.append(experiments_html(data.experiments))
    parts += [_img(figures.trend_chart(history), f"history {history.configuration}") for history in data.history]
    parts += _html_causes([c for c in data.configurations if c.causes])
    parts += [_html_table(table["title"], table["header"], table["rows"]) for table in tables[lead:]]
    parts.append("<h2>Runs over time</h2>")
    for c in data.configurations:
        parts += _html_runs_over_time(c)
        parts += [_html_run(view, c, model["warnings"].get(view.run.run_id, [])) for view in c.runs]
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_head(data: ReportData, model: dict[str, Any]) -> list[str]:
    """The page's head, what was cut short, and the classes each configuration can serve."""
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>rtvirt report</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>rtvirt report</h1><p>Results: {escape(data.source)} · generated "
             f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} · {len(data.configurations)} "
             f"configuration(s)</p>"]
    if model["partial"]:
        parts.append(f'<p class="partial">Partial runs (cut short; every sample up to the cut is kept) in: '
                     f'{escape(", ".join(model["partial"]))}</p>')
    if model["shortfalls"]:
        parts.append('<p class="partial">Short runs (fewer samples than their duration and period promise):</p><ul>'
                     + "".join(f"<li>{escape(note)}</li>" for note in model["shortfalls"]) + "</ul>")
    serving = [f"<li><b>{escape(s['configuration'])}</b>: {escape(_serves(s))}</li>" for s in model["served"]]
    parts.append(f"<h2>Which classes each configuration can serve</h2><ul>{''.join(serving)}</ul>")
    return parts


def _html_distributions(quantity: Quantity, configurations: list[Configuration]) -> list[str]:
    """Box, violin and CDF plots of the configurations that measured ``quantity``, and their per-CPU histograms."""
    from . import figures

    measured = [(c, c.histogram) for c in configurations if c.histogram is not None and c.histogram.n]
    if not measured:
        return []
    labels = [c.label for c, _ in measured]
    histograms = [h for _, h in measured]
    parts = [f"<h2>Distributions: {escape(quantity.title)}</h2>",
             _img(figures.box_violin(labels, [c.summary for c, _ in measured], histograms, quantity),
                  f"box and violin plots per configuration: {quantity.title}"),
             _img(figures.cdf(labels, histograms, quantity), f"CDF per configuration: {quantity.title}")]
    parts += [_img(figures.histograms_per_cpu(c.label, c.per_cpu, quantity), f"histogram {c.label}")
              for c, _ in measured if c.per_cpu]
    return parts


def _html_causes(explained: list[Configuration]) -> list[str]:
    """The outliers' causes by configuration, and each explained outlier's timeline."""
    from . import figures

    if not explained:
        return []
    parts = ["<h2>Why the outliers: causes by configuration</h2>",
             _img(figures.cause_bars([(c.label, c.causes) for c in explained], CAUSES_SHOWN),
                  "share of outlier latency by cause per configuration")]
    parts += [_img(figures.outlier_timeline(c.label, timeline),
                   f"timeline of outlier {timeline.rank} of {timeline.run_id}")
              for c in explained for timeline in c.timelines]
    return parts


def _html_runs_over_time(c: Configuration) -> list[str]:
    """One time series and one window-maxima figure for the configuration, every run in each."""
    from . import figures

    timed = [view for view in c.runs if view.profile is not None and view.series is not None]
    if not timed:
        return []
    # one figure of each kind per configuration, every run in it: a report of 100 runs stays readable
    # (and takes seconds, not minutes)
    events = sorted({e for view in timed for e in _events(view)})
    heading = f"{c.label} ({len(timed)} run{'s' if len(timed) > 1 else ''})"
    keep = max(10, TOP_KEPT // len(timed))
    series = [(view.run.run_id, *view.series(), keep) for view in timed if view.series is not None]
    return [f"<h3>{escape(heading)}</h3>",
            _img(figures.time_series(c.label, series, events, c.quantity), f"time series {heading}"),
            _img(figures.window_maxima(c.label, [(v.run.run_id, v.profile) for v in timed if v.profile is not None],
                                       events, c.quantity), f"window maxima {heading}")]


def _html_run(view: RunView, c: Configuration, warnings: list[str]) -> str:
    """A run's heading, its warnings and the system settings it ran with."""
    heading = f"{view.run.run_id} ({c.label})" + (" — partial" if view.run.partial else "")
    parts = [f"<h4>{escape(heading)}</h4>"]
    settings, _ = _settings(view)
    if warnings:
        parts.append("<ul>" + "".join(f'<li class="warn">{escape(w)}</li>' for w in warnings) + "</ul>")
    if settings:
        parts.append("<details><summary>System settings</summary><table>" + "".join(
            f"<tr><td>{escape(k)}</td><td style=\"text-align:left\">{escape(v)}</td></tr>" for k, v in settings)
            + "</table></details>")
    return "\n".join(parts)


# --- Markdown ----------------------------------------------------------------------------------------------

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(model: dict[str, Any]) -> str:
    lines = [f"# rtvirt report\n\nResults: {_md_cell(model['results'])}\n"]
    for served in model["served"]:
        lines.append(f"- **{_md_cell(served['configuration'])}** serves: {_md_cell(_serves(served))}")
    if model["shortfalls"]:
        lines += ["", "Short runs (fewer samples than their duration and period promise):"]
        lines += [f"- {_md_cell(note)}" for note in model["shortfalls"]]
    for table in model["tables"]:
        header = table["header"]
        lines += ["", f"## {_md_cell(table['title'])}", "", "| " + " | ".join(map(_md_cell, header)) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table["rows"]]
    for run_id, warnings in model["warnings"].items():
        lines += ["", f"Warnings for {_md_cell(run_id)}:"] + [f"- {_md_cell(w)}" for w in warnings]
    return "\n".join(lines) + "\n"


def render(data: ReportData, fmt: Literal["html", "markdown", "json"]) -> str:
    model = report_model(data)
    if fmt == "html":
        return _html(data, model)
    if fmt == "markdown":
        return _markdown(model)
    return json.dumps(_finite(model), indent=2, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_report(results: Path | RunStore, out: Path, fmt: Literal["html", "markdown", "json"] = "html",
                 **options: Any) -> Path:
    data = collect(results, **options)
    text = render(data, fmt)
    out = Path(out)
    write_atomically(out, text)
    return out
