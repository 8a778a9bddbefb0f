"""``rtvirt design MODEL.toml``: smallest budgets per vCPU for each hypervisor scheduler, and the configuration
to apply them (docs/analysis.md, "Design")."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..analysis.deploy import kvm_script, libvirt_cputune, model_toml, scenario_toml, xen_commands
from ..analysis.design import DESIGNABLE, Design, design_model
from ..analysis.record import write_analysis_run
from ..errors import InputError, VerdictFailed
from ..model import load_model, parse_assignment
from .output import console, print_json
from .resultopts import results_option, store_for_writing

__all__ = ["design"]


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:g}"


def _summary(designs: list[Design]) -> Table:
    table = Table(title="designs (times in us)", title_justify="left")
    for column in ("scheduler", "verdict", "pCPU bandwidth", "first problem"):
        table.add_column(column)
    for d in designs:
        bandwidth = ", ".join(f"{cpu}: {bw:.3f}" for cpu, bw in sorted(d.cpu_bandwidth().items()))
        failing = d.problems[:1] or ([f"{t.vm}/{t.task}: " + (t.reason or f"bound {_us(t.wcrt)} > {_us(t.deadline)}")
                                      for t in d.analysis.tasks if not t.schedulable][:1] if d.analysis else [])
        if not failing and d.analysis:
            failing = [f"chain {c.name}: bound {_us(c.bound)} > {_us(c.deadline)}"
                       for c in d.analysis.chains if not c.schedulable][:1]
        table.add_row(d.label, "[green]schedulable[/]" if d.schedulable else "[red]not proven[/]", bandwidth,
                      failing[0] if failing else "")
    return table


def _parameters(design: Design) -> Table:
    table = Table(title=f"{design.label}: designed vCPU parameters (us)", title_justify="left")
    for column in ("vCPU", "pCPU", "budget", "period", "priority", "window", "note"):
        table.add_column(column)
    for v in design.vcpus:
        window = "-" if v.window is None else f"[{_us(v.window[0])}, {_us(v.window[1])})"
        table.add_row(f"{v.vm}.vcpu{v.vcpu}", str(v.cpu), _us(v.budget), _us(v.period), str(v.priority), window,
                      v.note)
    return table


def _write_configs(design: Design, model_name: str, model: object, out: Path) -> Path:
    folder = out / design.label
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "xen.sh").write_text(xen_commands(design))
        (folder / "kvm.sh").write_text(kvm_script(design))
        for vm in sorted({v.vm for v in design.vcpus}):
            (folder / f"libvirt-{vm}.xml").write_text(libvirt_cputune(design, vm))
        (folder / "scenario.toml").write_text(scenario_toml(design, model))  # type: ignore[arg-type]
        if DESIGNABLE[design.label][0] != "deadline":  # libvirt has no SCHED_DEADLINE vcpusched
            (folder / "scenario-libvirt.toml").write_text(
                scenario_toml(design, model, kind="libvirt"))  # type: ignore[arg-type]
        if design.model is not None:
            (folder / f"{model_name}-{design.label}.toml").write_text(model_toml(design.model))
    except OSError as exc:
        raise InputError(f"option --out: cannot write to {folder} ({exc.strerror})") from None
    return folder


@click.command("design")
@click.argument("model_path", metavar="MODEL.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-s", "--scheduler", "schedulers", multiple=True, type=click.Choice(list(DESIGNABLE)),
              help="design for this hypervisor scheduler only (repeatable) [default: all]")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="override a model field (repeatable)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="write Xen/KVM/libvirt configuration, a scenario and the designed model per scheduler here")
@results_option("results store the design record is written to")
@click.option("--json", "as_json", is_flag=True, help="print the designs as JSON")
@click.option("--strict", is_flag=True, help="exit with status 3 when no scheduler gets a proven design")
@click.option("--workers", type=click.IntRange(1, 1024), help="design the schedulers on this many local worker "
              "processes [default: one after the other in this process]")
@click.option("--cluster", "--dask", "cluster", metavar="ADDRESS",
              help="design the schedulers on an existing Dask cluster (tcp://HOST:8786 or a scheduler file)")
def design(model_path: Path, schedulers: tuple[str, ...], assignments: tuple[str, ...], out: Path | None,
           results: str, as_json: bool, strict: bool, workers: int | None, cluster: str | None) -> None:
    """Smallest budget per vCPU that keeps every guest task of MODEL.toml schedulable, per hypervisor scheduler.

    Each design is checked by the same analysis as `rtvirt analyze`; with --out, each gets xen.sh, kvm.sh,
    libvirt-VM.xml (<cputune>), scenario.toml (measure it with `rtvirt run`), scenario-libvirt.toml (the
    same as a libvirt domain with that <cputune>; not for deadline designs) and the designed model (check
    it with `rtvirt sim`).
    """
    model = load_model(model_path, [parse_assignment(a, "--set") for a in assignments])
    labels = list(schedulers or DESIGNABLE)
    if workers is None and cluster is None:
        designs = [design_model(model, label) for label in labels]
    else:
        from ..experiment.executors import open_pool, pool_map

        pool = open_pool(cluster, workers)
        try:
            designs = pool_map(pool, design_model, [(model, label) for label in labels])
        finally:
            pool.close()
    proven = [d for d in designs if d.schedulable]
    shown = proven[0] if proven else next((d for d in designs if d.analysis is not None), None)
    folders = {d.label: str(_write_configs(d, model.name, model, out)) for d in designs} if out else {}
    run_id, path = None, None
    if shown is not None and shown.analysis is not None:
        target = store_for_writing(results).write_dir
        run, _ = write_analysis_run(shown.analysis, target, model_path=str(model_path),
                                    extra={"kind": "design", "design_scheduler": shown.label,
                                           "designs": [d.as_dict() for d in designs]})
        run_id, path = run.run_id, str(run.path)
    if as_json:
        print_json({"run_id": run_id, "path": path, "model": model.name, "proven": [d.label for d in proven],
                    "designs": [d.as_dict() | ({"files": folders[d.label]} if d.label in folders else {})
                                for d in designs]})
    else:
        console.print(_summary(designs))
        for d in proven or designs[:1]:
            console.print(_parameters(d))
        if folders:
            console.print(f"configuration written under {out}")
        if run_id:
            console.print(f"design {run_id} written to {path}")
    if strict and not proven:
        raise VerdictFailed(f"model {model_path}: no scheduler gets a proven design")
