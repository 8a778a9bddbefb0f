"""The studies' own tables, in the studies' layout, with the published figures beside ours.

Runs of a study scenario carry ``study`` in their manifest (name, fields modified from the built-in,
scale); the tables are built from the report's configurations of those runs. Published figures come from
``published.toml`` (numbers from the papers, never adjusted); each comparison gets a one-line reading:
same direction or not, and our figure over the paper's.
"""

from __future__ import annotations

import math
import tomllib
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from ...units import parse_duration
from ..isolation import Outlier, isolation_of
from ..reportdata import Configuration, ReportData, RunView

__all__ = ["study_tables", "published", "Table"]

Table = tuple[str, list[str], list[list[str]]]
_HOURS = (1, 2, 4, 8)  # the COTS study's stability marks; time_profile marks 1/8, 2/8, 4/8 and all of a run


@cache
def published() -> dict[str, Any]:
    """The published figures per study (``published.toml``)."""
    return tomllib.loads((resources.files(__package__) / "published.toml").read_text(encoding="utf-8"))


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.2f} %"


def _meta(c: Configuration) -> dict[str, Any]:
    manifest = c.runs[0].run.manifest
    campaign = manifest.get("campaign") or {}
    return {"environment": str(manifest.get("environment") or "-"), "group": str(campaign.get("group") or "-"),
            "workload": str(campaign.get("workload") or "-"), "disturbance": str(campaign.get("disturbance") or "-"),
            "order": str(campaign.get("start_order") or "-"), "probe": str(manifest.get("probe") or "-"),
            "value_field": str(manifest.get("value_field") or "")}


def _study(c: Configuration) -> dict[str, Any] | None:
    for view in c.runs:
        study = view.run.manifest.get("study")
        if isinstance(study, dict) and study.get("name") in published():
            return study
    return None


def _reading(ours: float | None, paper: float | None, ours_ref: float | None = None,
             paper_ref: float | None = None) -> str:
    """One line: the direction against a reference configuration (when given) and our figure over the paper's."""
    parts = []
    if None not in (ours_ref, paper_ref) and ours is not None and paper is not None and ours_ref and paper_ref:
        ours_change, paper_change = ours / ours_ref - 1, paper / paper_ref - 1
        same = (ours_change > 0) == (paper_change > 0)
        parts.append(f"{'same direction' if same else 'opposite direction'} (ours {ours_change * 100:+.0f} %, "
                     f"paper {paper_change * 100:+.0f} %)")
    if ours is not None and paper:
        parts.append(f"{ours / paper:.2f}x the paper")
    return "; ".join(parts) or "no published figure to compare"


def _reading_pct(ours: float, paper: float) -> str:
    """One line for two changes in %: same sign or not, and ours over the paper's."""
    same = (ours < 0) == (paper < 0)
    return f"{'same direction' if same else 'opposite direction'}; {ours / paper:.2f}x the paper" if paper \
        else ("same direction" if same else "opposite direction")


def _provenance(name: str, configs: list[Configuration]) -> Table:
    paper = published()[name]
    modified: list[str] = []
    scales: set[float] = set()
    repetitions: set[tuple[int, int]] = set()  # (ours, the study's) runs per configuration
    warnings: set[str] = set()
    for c in configs:
        for view in c.runs:
            study = view.run.manifest.get("study") or {}
            modified += [f for f in study.get("modified") or [] if f not in modified]
            if isinstance(study.get("scale"), int | float):
                scales.add(round(float(study["scale"]), 6))
            if isinstance(study.get("repetitions"), int) and isinstance(study.get("study_repetitions"), int):
                repetitions.add((study["repetitions"], study["study_repetitions"]))
            system = view.run.manifest.get("system") or {}
            warnings.update(str(w) for w in (system.get("warnings") or []) if "not represent" in str(w))
    status = ("modified from the study's configuration: field " + ", ".join(modified)) if modified \
        else "the study's configuration (the built-in scenario unchanged)"
    scale = "full length" if scales == {1.0} else \
        "scaled: " + ", ".join(f"{s:g}" for s in sorted(scales)) + " of the study's durations"
    rows = [["paper", str(paper["title"])], ["paper's platform", str(paper["platform"])],
            ["paper's method", str(paper["method"])], ["this campaign", status], ["duration", scale]]
    rows += [["repetitions", f"{ours} per configuration" + (" (the study's)" if ours == theirs else
                                                            f", fewer than the study's {theirs}" if ours < theirs
                                                            else f", more than the study's {theirs}")]
             for ours, theirs in sorted(repetitions)]
    rows += [["timings here", w] for w in sorted(warnings)[:3]]
    return (f"Study {name}: this campaign beside the paper", ["item", "value"], rows)


# --- COTS-hypervisor ------------------------------------------------------------------------------------

def _ms(ns: float) -> str:
    return _num(ns / 1e6, 4)


@cache
def _cots_profiles() -> list[tuple[str, str]]:
    """(testing profile, system profile) of every configuration of the built-in cots-hypervisor matrix."""
    from ...scenario import builtin_scenarios, parse_scenario
    from ...scenario.matrix import expand

    study = parse_scenario(builtin_scenarios()["cots-hypervisor"], "built-in scenario cots-hypervisor")
    return list(dict.fromkeys((plan.group, study.environments[plan.environment].name) for plan in expand(study)))


def _cots(configs: list[Configuration]) -> list[Table]:
    note = "" if published()["cots-hypervisor"].get("tables_quoted") else \
        "; the paper's values for this table are not quoted in rtvirt's reference data"
    ordered = sorted(configs, key=lambda c: (_meta(c)["group"], _meta(c)["environment"]))
    stats = []
    stability = []
    for c in ordered:
        meta, s = _meta(c), c.summary
        stats.append([meta["environment"], meta["group"], str(s.samples), _ms(s.lower_whisker_ns), _ms(s.q1_ns),
                      _ms(s.median_ns), _ms(s.mean_ns), _ms(s.stdev_ns), _ms(s.q3_ns), _ms(s.upper_whisker_ns),
                      _ms(s.max_jitter_ns), f"{_ms(s.mean_ci_low_ns)} – {_ms(s.mean_ci_high_ns)}"])
        for view in c.runs:
            if view.profile is None:
                continue
            for hours, (end, mark) in zip(_HOURS, view.profile.marks, strict=False):
                stability.append([meta["environment"], meta["group"], f"{hours} h mark ({end / 1e9:,.1f} s here)",
                                  str(mark.samples), _ms(mark.mean_ns), _ms(mark.max_ns), _ms(mark.max_jitter_ns)])
    # the study's profiles this campaign lacks (not run, or failed): a comparison must see the holes
    ran = {(_meta(c)["group"], _meta(c)["environment"]) for c in configs}
    stats += [[environment, group, "not run"] + ["-"] * 9 for group, environment in _cots_profiles()
              if (group, environment) not in ran]
    return [(f"COTS-hypervisor study: statistics per system and testing profile (ms){note}",
             ["system profile", "testing profile", "samples", "lower whisker", "lower quartile", "median", "mean",
              "σ", "upper quartile", "upper whisker", "max jitter", "mean 95 % CI"], stats),
            (f"COTS-hypervisor study: stability over 1/2/4/8 h (cumulative, ms){note}",
             ["system profile", "testing profile", "up to", "samples", "mean", "max", "max jitter"], stability)]


# --- guest isolation --------------------------------------------------------------------------------------

def _first_interval_change(view: RunView) -> tuple[float | None, float | None, int]:
    """(first interval, median of the others, intervals) of a Thread-Metric run."""
    if not view.run.has_samples or not view.run.value_field:
        return None, None, 0
    table = view.run.samples(["t_ns", view.run.value_field])
    order = np.argsort(table.column(0).to_numpy(), kind="stable")
    values = table.column(1).to_numpy()[order].astype(float)
    if values.size < 2:
        return None, None, int(values.size)
    return float(values[0]), float(np.median(values[1:])), int(values.size)


def _outlier_row(c: Configuration, meta: dict[str, Any], base_top: Outlier | None,
                 paper: dict[str, Any]) -> list[str] | None:
    """The largest sample of a configuration against its run median, beside the paper's outliers (kernel
    operations only) and the solo run's; None: not a duration workload, or no outliers recorded."""
    out = paper["outliers"]
    top = _largest(c)
    if meta["value_field"] != "duration_ns" or top is None:
        return None
    paper_ratio = f"{out['outlier_cycles'] / out['median_cycles_high']:,.0f}–" \
                  f"{out['outlier_cycles'] / out['median_cycles_low']:,.0f}x"
    ratio = top.value_ns / top.median_ns if top.median_ns else float("nan")
    quoted = meta["probe"] == "kops"  # the paper's outlier figures are kernel operations'
    if meta["disturbance"] == "solo":
        # the paper's direction: outliers (of kernel operations) only with a disturbing guest
        direction = "solo: the paper saw no such outliers without a stressor guest" if quoted \
            else "solo: the baseline of the rows below"
    elif base_top is not None:
        grown = top.value_ns / base_top.value_ns if base_top.value_ns else float("nan")
        direction = (f"{'same direction' if grown > 1 else 'opposite direction'} as the paper "
                     f"(outlier {grown:,.1f}x the solo run's)")
    else:
        direction = "no solo run to compare"
    if not quoted:
        reading = f"{direction}; the paper's outlier figures are for kernel operations only"
    elif top.value_cycles is not None:
        reading = (f"{direction}; {_reading(top.value_cycles, out['outlier_cycles'])}; ours "
                   f"{ratio:,.0f}x the median, paper {paper_ratio}")
    else:
        reading = f"{direction}; no cycle counter in this run's stream header: time only"
    return [meta["workload"], meta["disturbance"], meta["order"],
            _num(top.value_cycles, 0), _num(top.value_ns / 1e6, 4),
            _num(top.median_cycles, 0), _num(top.median_ns / 1e3, 3),
            f"{out['outlier_cycles']:,} (≈{out['outlier_ms']:g} ms)" if quoted else "-",
            f"{out['median_cycles_low']}–{out['median_cycles_high']}" if quoted else "-",
            reading]


def _increase_row(c: Configuration, meta: dict[str, Any], base: Configuration) -> list[str]:
    """Mean and median increase and WCET ratio of a disturbed configuration against its solo baseline."""
    row = isolation_of(c.label, c.summary, base.label, base.summary, c.quantity)
    return [meta["workload"], meta["disturbance"], meta["order"],
            _pct(row.mean_increase_pct), _pct(row.median_increase_pct),
            _num(row.wcet_ns / 1e3), _num(row.baseline_wcet_ns / 1e3),
            _num(row.wcet_ratio, 2), "not quoted in our source"]


def _order_row(c: Configuration, meta: dict[str, Any], paper: dict[str, Any]) -> list[str]:
    """A Thread-Metric configuration's first interval against its steady level, and its start-up ramp."""
    firsts = [_first_interval_change(v) for v in c.runs]
    changes = [(first / steady - 1) * 100 for first, steady, _ in firsts if first is not None and steady]
    change = float(np.median(changes)) if changes else None
    ramps = [v.ramp for v in c.runs if v.ramp is not None]
    ramp = (f"{len(ramps)}/{len(c.runs)} runs; up to {max(r.end_ns for r in ramps) / 1e9:.1f} s"
            if ramps else f"none detected in {len(c.runs)} run(s)")
    return [meta["disturbance"], meta["order"], str(sum(n for *_, n in firsts)),
            _num(firsts[0][0], 0) if firsts else "-", _num(firsts[0][1], 0) if firsts else "-",
            _pct(change), ramp, _pct(paper["threadmetric"]["first_interval_pct"]),
            _reading_pct(change, paper["threadmetric"]["first_interval_pct"])
            if change is not None else "no intervals to compare"]


def _isolation(configs: list[Configuration]) -> list[Table]:
    paper = published()["guest-isolation"]
    outlier_rows, increase_rows, order_rows, timeline_rows = [], [], [], []
    # each system's disturbed runs against its own solo run: a campaign may hold several systems side by side
    # (the Xen lab's and the KVM lab's rows), and then every row also says which system it is (last column)
    by_system: dict[tuple[str, str], list[Configuration]] = {}
    for c in configs:
        by_system.setdefault((_meta(c)["group"], _meta(c)["environment"]), []).append(c)
    systems = len({environment for _, environment in by_system}) > 1
    for (group, environment), members in by_system.items():
        metas = [_meta(c) for c in members]
        base = next((c for c, m in zip(members, metas, strict=True) if m["disturbance"] == "solo"), None)
        base_top = _largest(base) if base is not None else None
        system = [environment] if systems else []
        for c, meta in zip(members, metas, strict=True):
            outlier = _outlier_row(c, meta, base_top, paper)
            if outlier is not None:
                outlier_rows.append(outlier + system)
            if meta["value_field"] == "duration_ns" and base is not None and c is not base \
                    and c.summary.samples and base.summary.samples:
                increase_rows.append(_increase_row(c, meta, base) + system)
            if meta["probe"] == "threadmetric" and group != "30min" and not _has_events(c):
                order_rows.append(_order_row(c, meta, paper) + system)
            if _has_events(c):
                timeline_rows += [row + system for row in _on_off_rows(c, meta, paper["threadmetric"])]
    system_column = ["system"] if systems else []
    tables: list[Table] = []
    if outlier_rows:
        tables.append(("Guest-isolation study: outliers (largest sample of each configuration vs the run median)",
                       ["workload", "disturbance", "start order", "outlier (cycles)", "outlier (ms)",
                        "median (cycles)", "median (µs)", "paper: outlier", "paper: median (cycles)", "reading",
                        *system_column], outlier_rows))
    if increase_rows:
        tables.append(("Guest-isolation study: increase against the solo baseline, per workload (µs)",
                       ["workload", "disturbance", "start order", "mean increase", "median increase", "WCET",
                        "baseline WCET", "WCET / baseline WCET", "paper", *system_column], increase_rows))
    if order_rows:
        tables.append(("Guest-isolation study: start order and the start-up ramp (Thread-Metric rounds per interval)",
                       ["disturbance", "start order", "intervals", "first interval (run 1)", "steady level (run 1)",
                        "first vs steady (median of runs)", "ramp", "paper: first interval", "reading", *system_column],
                       order_rows))
    if timeline_rows:
        tables.append(("Guest-isolation study: the 30-minute run, stress on from minute 10 to 20 "
                       "(Thread-Metric rounds per interval)",
                       ["run", "median before", "median during", "median after", "during vs before",
                        "after vs before", "lowest interval vs median", "paper: during vs before",
                        "paper: rare outliers", "reading", *system_column], timeline_rows))
    return tables


def _largest(c: Configuration) -> Outlier | None:
    """The largest outlier over a configuration's runs (None: no outliers recorded)."""
    tops = [v.outliers[0] for v in c.runs if v.outliers]
    return max(tops, key=lambda o: o.value_ns) if tops else None


def _has_events(c: Configuration) -> bool:
    """Whether the runs switched stress on and off on a timeline (not on for the whole run)."""
    return any((v.run.manifest.get("campaign") or {}).get("events") for v in c.runs)


def _on_off_rows(c: Configuration, meta: dict[str, Any], paper: dict[str, float]) -> list[list[str]]:
    rows = []
    for view in c.runs:
        before = [s for s in view.segments if s.after_event in ("start", "workload-start")]
        during = next((s for s in view.segments if s.after_event == "stress-on"), None)
        after = next((s for s in view.segments if s.after_event == "stress-off"), None)
        if not before or during is None:
            continue
        level = before[-1].median_ns
        change = (during.median_ns / level - 1) * 100 if level else None
        after_change = (after.median_ns / level - 1) * 100 if after is not None and level else None
        lowest = None
        first, steady, _ = _first_interval_change(view)
        if steady:
            table = view.run.samples([str(view.run.value_field)])
            lowest = (float(np.min(table.column(0).to_numpy())) / steady - 1) * 100
        rows.append([view.run.run_id, _num(level, 0), _num(during.median_ns, 0),
                     _num(after.median_ns, 0) if after else "-", _pct(change), _pct(after_change), _pct(lowest),
                     _pct(paper["under_stress_pct"]), _pct(paper["rare_outlier_pct"]),
                     _reading_pct(change, paper["under_stress_pct"]) if change is not None else "-"])
    return rows


# --- interrupt latency ------------------------------------------------------------------------------------

def _interrupt(configs: list[Configuration]) -> list[Table]:
    by_key = {c.label.split(": ", 1)[-1]: c for c in configs}
    reference_rows = published()["interrupt-latency"]["rows"]
    native_paper = reference_rows[0]
    native_ours = by_key.get(native_paper["ours"][0])
    rows = []
    for ref in reference_rows:
        for key in ref["ours"]:  # one row per stand-in for the paper's interrupt source
            c = by_key.get(key)
            ours = (c.summary.min_ns / 1e3, c.summary.mean_ns / 1e3, c.summary.max_ns / 1e3) if c else (None,) * 3
            readings = []
            for index, field in ((1, "avg_us"), (2, "max_us")):
                if field in ref and ours[index] is not None:
                    ref_ours = None if native_ours is None or ref is native_paper else \
                        (native_ours.summary.mean_ns, native_ours.summary.max_ns)[index - 1] / 1e3
                    ref_paper = None if ref is native_paper else float(native_paper[field])
                    readings.append(f"{field[:3]}: {_reading(ours[index], float(ref[field]), ref_ours, ref_paper)}")
            # the paper's figures as its table prints them (published.toml keeps them as text)
            rows.append([str(ref["configuration"]), c.label if c else f"not run ({key})", _num(ours[0]),
                         _num(ours[1]), _num(ours[2]), str(ref.get("min_us", "-")), str(ref.get("avg_us", "-")),
                         str(ref.get("max_us", "-")), " · ".join(readings) or "not run here"])
    return [("Interrupt-latency study: min / avg / max per configuration (µs)",
             ["configuration", "ours", "min", "avg", "max", "paper: min", "paper: avg", "paper: max", "reading"],
             rows)]


# --- RT-Xen -------------------------------------------------------------------------------------------------

def _server(meta_env: dict[str, Any]) -> str:
    rtds = meta_env.get("rtds")
    if isinstance(rtds, dict) and rtds.get("budget") and rtds.get("period"):
        return f"RTDS {rtds['budget']} every {rtds['period']}"
    return f"{meta_env.get('scheduler') or 'default'} (no reservation)"


def _holes(c: Configuration, at_least_ns: float = 0.0) -> dict[str, float] | None:
    """Interruptions of a gap run (over its runs): count, median and max length, median spacing of their
    starts and how many a second (ms, ms, ms, 1/s); None without any. ``at_least_ns``: only those as long."""
    lengths, spacings, seconds = [], [], 0.0
    for view in c.runs:
        run = view.run
        if not run.has_samples or not run.value_field:
            continue
        table = run.samples(["t_ns", run.value_field])
        length = table.column(1).to_numpy().astype(float)
        starts = np.sort(table.column(0).to_numpy()[length >= at_least_ns])
        lengths.append(length[length >= at_least_ns])
        spacings.append(np.diff(starts).astype(float))
        seconds += parse_duration(run.manifest.get("params", {}).get("duration", 0)) / 1e9
    if not lengths or not sum(x.size for x in lengths):
        return None
    length, spacing = np.concatenate(lengths), np.concatenate(spacings)
    return {"count": float(length.size), "median_ms": float(np.median(length)) / 1e6,
            "max_ms": float(np.max(length)) / 1e6,
            "every_ms": float(np.median(spacing)) / 1e6 if spacing.size else float("nan"),
            "per_s": length.size / seconds if seconds else float("nan")}


def _rt_xen(configs: list[Configuration]) -> list[Table]:
    paper = published()["rt-xen-servers"]
    by_key = {c.label: c for c in configs}
    quoted = {key: ref for ref in paper["holes"] for key in ref["ours"]}
    holes = {c.label: _holes(c) for c in configs if _meta(c)["probe"] == "gap"}
    affinity_ref = next(ref for ref in paper["holes"] if any(k.startswith("affinity:") for k in ref["ours"]))
    gap_rows, response_rows = [], []
    # per scenario and system, the VM alone first, then with more VMs beside it
    for c in sorted(configs, key=lambda c: (_meta(c)["group"], _meta(c)["environment"],
                                            _meta(c)["disturbance"] != "alone", _meta(c)["disturbance"])):
        meta = _meta(c)
        detail = c.runs[0].run.manifest.get("environment_detail") or {}
        if meta["probe"] == "gap":
            ours = holes[c.label]
            ref = quoted.get(c.label)
            alone = holes.get(f"affinity: {meta['environment']} / alone")
            if ours is None:
                reading = "no interruption above the threshold"
            elif ref is not None:
                # contention is read against the VM alone, as the paper's against its budget-exhausted figure
                against = ref is not affinity_ref and alone is not None
                hole = _reading(ours["median_ms"], ref["hole_ms"], alone["median_ms"] if against and alone else None,
                                affinity_ref["hole_ms"] if against else None)
                reading = (f"hole {hole}; every {ours['every_ms']:,.1f} ms, paper {ref['every_ms']:g} ms "
                           f"({ours['every_ms'] / ref['every_ms']:.2f}x)")
            elif alone is not None and c.label != f"affinity: {meta['environment']} / alone":
                reading = (f"no published figure; holes {ours['median_ms'] / alone['median_ms']:.2f}x as long and "
                           f"{ours['per_s'] / alone['per_s']:.2f}x as frequent as alone")
            else:
                reading = "no published figure for this configuration"
            # the server's own holes (period - budget when it runs out) apart from the shorter ones a loaded
            # host adds: those at least half that long
            rtds = detail.get("rtds") if isinstance(detail.get("rtds"), dict) else None
            server = _holes(c, (parse_duration(rtds["period"]) - parse_duration(rtds["budget"])) / 2) \
                if rtds and rtds.get("period") and rtds.get("budget") else None
            server_holes = "-" if not rtds else "none" if server is None else \
                f"{server['per_s']:,.1f} /s, median {_num(server['median_ms'], 2)}"
            gap_rows.append([meta["group"], meta["environment"], meta["disturbance"], _server(detail),
                             "-" if ours is None else f"{ours['count']:,.0f}",
                             "-" if ours is None else _num(ours["median_ms"], 2),
                             "-" if ours is None else _num(ours["max_ms"], 2),
                             "-" if ours is None else _num(ours["every_ms"], 2),
                             "-" if ours is None else _num(ours["per_s"], 1),
                             f"{ref['hole_ms']:g} every {ref['every_ms']:g} ({ref['configuration']})" if ref else "-",
                             reading, server_holes])
        elif meta["probe"] == "timer":
            s = c.summary
            base = by_key.get(f"{meta['group']}: {meta['environment']} / alone")
            reading = "the VM alone (the reference of its system)" if base is c else "no VM alone to compare"
            if base is not None and base is not c and base.summary.max_ns and base.summary.p99_ns:
                reading = (f"max {s.max_ns / base.summary.max_ns:.2f}x, p99 {s.p99_ns / base.summary.p99_ns:.2f}x "
                           "the VM alone")
            response_rows.append([meta["environment"], meta["disturbance"], _server(detail), str(s.samples),
                                  _num(s.min_ns / 1e3, 1), _num(s.median_ns / 1e3, 1), _num(s.mean_ns / 1e3, 1),
                                  _num(s.p99_ns / 1e3, 1), _num(s.max_ns / 1e3, 1),
                                  "-" if paper.get("response_quoted") is False else "see the paper", reading])
    missing = [key for key in quoted if key not in by_key]
    gap_rows += [[key.split(": ")[0], key.split(": ")[1].split(" / ")[0], key.split(" / ")[-1], "-", "not run", "-",
                  "-", "-", "-", f"{quoted[key]['hole_ms']:g} every {quoted[key]['every_ms']:g} "
                  f"({quoted[key]['configuration']})", "not run here", "-"] for key in missing]
    tables: list[Table] = []
    if gap_rows:
        tables.append(("RT-Xen study: interruptions of a spinning thread in the RT VM (clock-tick-duration method, ms)",
                       ["scenario", "system", "disturbance", "server", "interruptions", "median hole", "max hole",
                        "every (median spacing)", "per second", "paper: hole every (ms)", "reading",
                        "holes >= half the server's period - budget"], gap_rows))
    if response_rows:
        tables.append(("RT-Xen study: an idle high-priority VM's response to the 0.5 ms interrupt source (µs); "
                       "the paper's values are not quoted in rtvirt's reference data",
                       ["system", "disturbance", "server", "samples", "min", "median", "mean", "p99", "max",
                        "paper", "reading"], response_rows))
    return tables


_BUILDERS = {"cots-hypervisor": _cots, "guest-isolation": _isolation, "interrupt-latency": _interrupt,
             "rt-xen-servers": _rt_xen}


def study_tables(data: ReportData) -> list[Table]:
    """The study tables of every study whose runs are in the report (none for other runs)."""
    by_study: dict[str, list[Configuration]] = {}
    for c in data.configurations:
        study = _study(c)
        if study is not None:
            by_study.setdefault(str(study["name"]), []).append(c)
    tables: list[Table] = []
    for name, configs in by_study.items():
        tables.append(_provenance(name, configs))
        tables += _BUILDERS[name](configs)
    return tables
