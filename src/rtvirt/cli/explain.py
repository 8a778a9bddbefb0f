"""``rtvirt explain RUN``: what held the measuring thread back in each outlier, layer by layer (docs/explain.md)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from ..errors import InputError
from .output import print_json
from .resultopts import reading_store, results_option

__all__ = ["explain"]


def _us(ns: float) -> str:
    return f"{ns / 1000:.1f} us"


def _layer_line(layer: dict[str, Any]) -> str:
    if not layer["seen"]:
        return f"{layer['layer']}: not seen ({layer['why_not']})"
    return (f"{layer['layer']}: seen (clock alignment ±{_us(layer['alignment_ns'])}, "
            f"{layer['dropped_events']} events dropped by the buffer bound)")


def explained_document(run: Any, top: int | None, threshold_ns: int | None) -> dict[str, Any]:
    """What ``--json`` prints, also the text's source: the stored numbers, narrowed to ``threshold_ns`` and
    the ``top`` largest outliers when asked."""
    from ..explain.attribute import summarize_parts
    from ..explain.stored import read_explanation

    try:
        explanation = read_explanation(run.path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"RUN {run.path}: unreadable explanation ({type(exc).__name__}: {exc})") from None
    if explanation is None:
        error = (run.manifest.get("explain") or {}).get("error")
        raise InputError(f"RUN {run.path}: no explanation stored" + (f" (explaining failed: {error})" if error else
                         "; record one with `rtvirt probe ... --explain` or an [explain] table in the scenario"))
    parts = explanation.parts
    summary = explanation.summary
    outliers = explanation.outliers
    if threshold_ns is not None:
        if threshold_ns < explanation.threshold_ns:
            raise InputError(f"option --threshold: {_us(threshold_ns)} is below the run's stored threshold; the run "
                             f"keeps parts of outliers above {_us(explanation.threshold_ns)} only")
        parts = [part for part in parts if part.latency_ns > threshold_ns]
        summary = summarize_parts(parts)
        outliers = len({part.rank for part in parts})
    by_rank: dict[int, list[Any]] = {}
    for part in parts:
        by_rank.setdefault(part.rank, []).append(part)
    ranks = sorted(by_rank)[:top] if top is not None else sorted(by_rank)
    start = int(run.manifest.get("stream_header", {}).get("start_monotonic_ns") or 0)
    return {
        "run_id": run.manifest.get("run_id"), "path": str(run.path), "probe": run.manifest.get("probe"),
        "threshold_ns": threshold_ns if threshold_ns is not None else explanation.threshold_ns,
        "threshold_rule": f"--threshold {_us(threshold_ns)}" if threshold_ns is not None else
        explanation.threshold_rule,
        "outliers": outliers, "explained": len(by_rank),
        "summary": summary,
        "layers": [{key: value for key, value in dataclasses.asdict(layer).items() if key != "occupancies"}
                   for layer in explanation.layers],
        "worst": [{"rank": rank, "sample_t_ns": by_rank[rank][0].sample_t_ns,
                   "at_s": round((by_rank[rank][0].sample_t_ns - start) / 1e9, 9) if start else None,
                   "latency_ns": by_rank[rank][0].latency_ns, "cpu": by_rank[rank][0].cpu,
                   "parts": [{"layer": p.layer, "kind": p.kind, "cause": p.cause, "offset_ns": p.offset_ns,
                              "duration_ns": p.duration_ns, "detail": json.loads(p.detail or "{}")}
                             for p in by_rank[rank]]}
                  for rank in ranks],
    }


def _print_text(document: dict[str, Any]) -> None:
    echo = click.echo
    echo(f"run {document['run_id']} ({document['probe']}): threshold {_us(document['threshold_ns'])} "
         f"[{document['threshold_rule']}]; {document['outliers']} outliers, {document['explained']} explained")
    for layer in document["layers"]:
        echo(f"  {_layer_line(layer)}")
        for note in layer["notes"]:
            echo(f"    note: {note}")
    for outlier in document["worst"]:
        at = f" at +{outlier['at_s']:.6f} s" if outlier["at_s"] is not None else ""
        echo(f"\n#{outlier['rank']}: {_us(outlier['latency_ns'])}{at} on CPU {outlier['cpu']}")
        for part in outlier["parts"]:
            share = part["duration_ns"] / outlier["latency_ns"] if outlier["latency_ns"] else 0.0
            echo(f"  +{_us(part['offset_ns']):>12}  {_us(part['duration_ns']):>12}  {share:6.1%}  "
                 f"{part['layer']:<11} {part['cause']}")
    echo("\nshare of outlier latency by cause:")
    for row in document["summary"]:
        echo(f"  {row['share']:7.1%}  {_us(row['total_ns']):>12}  {row['layer']:<11} {row['cause']}  "
             f"({row['outliers']} outliers)")


@click.command()
@click.argument("run")
@results_option("results store RUN is looked up in when it is a run id")
@click.option("--top", type=click.IntRange(min=1), default=None, help="show the N largest outliers [default: 10 in "
              "text, all in JSON]")
@click.option("--threshold", default=None, metavar="TIME", help="only outliers above this (bare numbers in us; "
              "not below the stored threshold)")
@click.option("--json", "as_json", is_flag=True, help="print the stored numbers as JSON")
def explain(run: str, results: str, top: int | None, threshold: str | None, as_json: bool) -> None:
    """The outliers of RUN (a run directory, manifest or run id) with what held the measuring thread back in
    each, layer by layer, and the share of outlier latency by cause."""
    from ..stores.base import resolve_in
    from ..units import parse_duration

    try:
        threshold_ns = None if threshold is None else parse_duration(threshold, "us")
    except ValueError as exc:
        raise InputError(f"option --threshold: {exc}") from None
    try:
        runs = resolve_in(run, reading_store(results))
    except InputError as exc:
        raise InputError(f"RUN {exc}") from None
    if len(runs) != 1:
        raise InputError(f"RUN {run}: names {len(runs)} runs; give one run directory or run id")
    document = explained_document(runs[0], top if top is not None or as_json else 10, threshold_ns)
    if as_json:
        print_json(document)
    else:
        _print_text(document)
