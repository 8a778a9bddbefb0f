"""``rtvirt import FORMAT FILE …``: bring cyclictest, jitterdebugger, rtla and CSV/Parquet results into the store."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ..importers import IMPORTERS, ImportOptions, import_file
from .output import console, print_json, us
from .resultopts import results_option, store_for_writing

__all__ = ["import_command"]

_HELP = "\n".join(f"  {name}: {spec.summary}" for name, spec in IMPORTERS.items())


@click.command("import", help=f"Import FILES of FORMAT as runs.\n\nFormats:\n\n\b\n{_HELP}")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(list(IMPORTERS)))
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@results_option("results store the runs are written to")
@click.option("--unit", type=click.Choice(["ns", "us", "ms"]), help="unit of the file's values when the format "
              "does not say [cyclictest: us; column: ns]")
@click.option("--column", help="latency column (format 'column')")
@click.option("--name", help="run name [default: the file name]")
@click.option("--config", help="configuration label for grouping in the report")
@click.option("--json", "as_json", is_flag=True, help="print the manifests' summaries as JSON")
def import_command(fmt: str, files: tuple[Path, ...], results: str, unit: str | None, column: str | None,
                   name: str | None, config: str | None, as_json: bool) -> None:
    options = ImportOptions(unit=unit, column=column)
    target = store_for_writing(results).write_dir
    written = [import_file(target, fmt, path, options, name=name, config=config) for path in files]
    if as_json:
        print_json({m["run_id"]: {"summary": m["summary"], "warnings": m["system"]["warnings"]} for m in written})
        return
    for manifest in written:
        overall = manifest["summary"]["all"]
        console.print(f"{manifest['run_id']}: {overall['samples']} samples, median {us(overall['median_ns'])} µs, "
                      f"max {us(overall['max_ns'])} µs")
        for warning in manifest["system"]["warnings"]:
            console.print(f"  [yellow]warning:[/] {escape(warning)}", markup=True)
