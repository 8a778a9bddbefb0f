"""``rtvirt explain RUN``: what held the measuring thread back in each outlier, layer by layer (docs/explain.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from .output import plural, print_json
from .resultopts import reading_store, results_option

__all__ = ["explain"]


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def _layer_line(layer: dict[str, Any]) -> str:
    if not layer["seen"]:
        return f"{layer['layer']}: not seen ({layer['why_not']})"
    return (f"{layer['layer']}: seen (clock alignment ±{_us(layer['alignment_ns'])}, "
            f"{layer['dropped_events']} events dropped by the buffer bound)")


def headline_text(document: dict[str, Any]) -> str:
    """"N outliers: X explained by a traced layer, Y held back by a layer not traced (by what: how many),
    Z unexplained" (of the explained ones, when not all were)."""
    counts = document["headline"]
    held = ", ".join(f"{culprit}: {count}" for culprit, count in counts["held_by"].items())
    of = f" (the {document['explained']} largest explained)" if document["explained"] < document["outliers"] else ""
    return (f"{plural(document['outliers'], 'outlier')}{of}: {counts['traced']} explained by a traced layer, "
            f"{counts['held']} held back by a layer not traced" + (f" ({held})" if held else "") +
            f", {counts['unexplained']} unexplained")


def _exit_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The KVM layer's exits by reason, as ``perf kvm stat`` shows them: count, time, mean and longest."""
    if not rows:
        return []
    lines = ["VM exits by reason (count; time, mean and longest of those traced whole):"]
    for row in rows:
        timed = (f"{row['total_ns'] / 1e6:10.1f} ms  mean {_us(row['mean_ns'] or 0):>10}  "
                 f"max {_us(row['max_ns'] or 0):>10}  ({row['timed']} timed)") if row["timed"] else "not timed"
        lines.append(f"  vCPU {row['vcpu']} {row['reason'] + ' (' + row['raw_reason'] + ')':<34} "
                     f"{row['count']:>9}  {timed}")
    return lines


def explained_document(run: Any, top: int | None, threshold_ns: int | None, merge: bool = True) -> dict[str, Any]:
    """What ``--json`` prints, also the text's source: the stored numbers, narrowed to ``threshold_ns`` and
    the ``top`` largest outliers when asked (the report's JSON carries the same document)."""
    from ..explain.document import explanation_document
    from ..explain.stored import read_explanation

    try:
        explanation = read_explanation(run.path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"RUN {run.path}: unreadable explanation ({type(exc).__name__}: {exc})") from None
    if explanation is None:
        error = (run.manifest.get("explain") or {}).get("error")
        raise InputError(f"RUN {run.path}: no explanation stored" + (f" (explaining failed: {error})" if error else
                         "; record one with `rtvirt probe ... --explain` or an [explain] table in the scenario"))
    return explanation_document(explanation, run.manifest, str(run.path), top, threshold_ns, merge)


def _pieces_text(part: dict[str, Any]) -> str:
    """What a joined line of the listing joins: its pieces, and the brief interruptions between them."""
    if part.get("pieces", 1) == 1:
        return ""
    interruptions = part.get("interruptions") or []
    if not interruptions:
        return f"  ({part['pieces']} pieces)"
    count = sum(item["count"] for item in interruptions)
    named = ", ".join(f"{item['cause']} x{item['count']}" for item in interruptions[:3])
    more = f", {len(interruptions) - 3} more" if len(interruptions) > 3 else ""
    return (f"  ({part['pieces']} pieces; between them {count} brief interruption{'s' if count > 1 else ''}, "
            f"{_us(sum(item['duration_ns'] for item in interruptions))}: {named}{more})")


def _print_text(document: dict[str, Any]) -> None:
    echo = click.echo
    echo(f"run {document['run_id']} ({document['probe']}): threshold {_us(document['threshold_ns'])} "
         f"[{document['threshold_rule']}]")
    echo(f"  {headline_text(document)}")
    if document["missed_periods"]:
        echo(f"  also: {plural(document['missed_periods'], 'period')} passed without a sample (the probe's "
             "overruns): a hold over them is in the outlier before them only when it began before the probe's "
             "thread woke; one that began after is in no outlier (the gap probe sees every hole)")
    for layer in document["layers"]:
        echo(f"  {_layer_line(layer)}")
        for note in layer["notes"]:
            echo(f"    note: {note}")
        for line in _exit_lines(layer.get("tables", {}).get("kvm_exits", [])):
            echo(f"    {line}")
    for outlier in document["worst"]:
        at = f" at +{outlier['at_s']:.6f} s" if outlier["at_s"] is not None else ""
        echo(f"\n#{outlier['rank']}: {_us(outlier['latency_ns'])}{at} on CPU {outlier['cpu']}")
        for part in outlier["parts"]:
            share = part["duration_ns"] / outlier["latency_ns"] if outlier["latency_ns"] else 0.0
            echo(f"  +{_us(part['offset_ns']):>12}  {_us(part['duration_ns']):>12}  {share:6.1%}  "
                 f"{part['layer']:<11} {part['cause']}{_pieces_text(part)}")
    echo("\nshare of outlier latency by culprit (its variants beneath):")
    for row in document["summary"]:
        echo(f"  {row['share']:7.1%}  {_us(row['total_ns']):>12}  {row['layer']:<11} {row['culprit']}  "
             f"({plural(row['outliers'], 'outlier')})")
        variants = row.get("variants") or []
        if len(variants) > 1 or (variants and variants[0]["variant"]):
            for variant in variants:
                echo(f"  {'':7}  {variant['share']:12.1%}  {variant['layer']:<11}   "
                     f"{variant['variant'] or '(as such)'}  ({plural(variant['outliers'], 'outlier')})")


def _import_trace(run: Any, trace_file: Path, threshold_ns: int | None, top: int | None) -> None:
    """Explain RUN from a trace file and store it as the run's explanation (its ``top`` largest outliers when
    given), its manifest's ``explain`` entry saying where it came from."""
    from ..explain.config import ExplainConfig
    from ..explain.imported import explain_with_trace
    from ..explain.session import manifest_entry
    from ..explain.stored import write_explanation
    from ..fileio import write_atomically

    config = ExplainConfig.model_validate({**({} if threshold_ns is None else {"threshold": f"{threshold_ns}ns"}),
                                           **({} if top is None else {"top": top})})
    explanation = explain_with_trace(run, trace_file, config)
    manifest = {**run.manifest, "explain": {**manifest_entry(explanation), "imported": trace_file.name[:200]}}
    try:
        write_explanation(run.path, explanation)
        write_atomically(run.path / "manifest.json", json.dumps(manifest, indent=2, default=str))
    except OSError as exc:
        raise InputError(f"RUN {run.path}: cannot store its explanation ({exc.strerror})") from None


@click.command()
@click.argument("run")
@results_option("results store RUN is looked up in when it is a run id")
@click.option("--top", type=click.IntRange(min=1), default=None, help="show the N largest outliers [default: 10 in "
              "text, all in JSON]")
@click.option("--threshold", default=None, metavar="TIME", help="only outliers above this (bare numbers in us; "
              "not below the stored threshold)")
@click.option("--json", "as_json", is_flag=True, help="print the stored numbers as JSON")
@click.option("--unmerged", is_flag=True, help="list each outlier's parts as stored, without joining the runs of "
              "one cause (consecutive, or between brief interruptions)")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="join this trace with RUN and store the result as its explanation: a trace-cmd .dat or a text "
              "trace (tracefs format, rtla timerlat's saved trace) on the run's sample clock (docs/explain.md)")
def explain(run: str, results: str, top: int | None, threshold: str | None, as_json: bool, unmerged: bool,
            trace_file: Path | None) -> None:
    """The outliers of RUN (a run directory, manifest or run id) with what held the measuring thread back in
    each, layer by layer, and the share of outlier latency by cause."""
    from ..stores.base import resolve_in
    from ..units import parse_duration

    try:
        threshold_ns = None if threshold is None else parse_duration(threshold, "us")
    except ValueError as exc:
        raise InputError(f"option --threshold: {exc}") from None
    try:
        store = reading_store(results)
        runs = resolve_in(run, store)
    except InputError as exc:
        raise InputError(f"RUN {exc}") from None
    if len(runs) != 1:
        raise InputError(f"RUN {run}: names {len(runs)} runs; give one run directory or run id")
    if trace_file is not None:
        if store.shared and runs[0].path.is_relative_to(store.data):  # type: ignore[attr-defined]
            raise InputError(f"--trace: RUN {run} is a run of the shared store {store.label}, whose runs stay as "
                             "delivered: join the trace with the run's directory in the results it was written to")
        _import_trace(runs[0], trace_file, threshold_ns, top)
        threshold_ns = None  # the imported explanation was cut at it
    document = explained_document(runs[0], top if top is not None or as_json else 10, threshold_ns, not unmerged)
    if as_json:
        print_json(document)
    else:
        _print_text(document)
