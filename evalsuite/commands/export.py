"""`evalsuite export --format lm-eval RUN... --out DIR`: finished runs in another tool's layout."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("export")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["lm-eval"]), default="lm-eval", show_default=True,
              help="Output layout: lm-eval writes <out>/<model>/results_<datetime>.json and "
              "samples_<task>_<datetime>.jsonl, as lm-evaluation-harness's --output_path --log_samples does.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder to write under.")
def export_cmd(runs: tuple[Path, ...], fmt: str, out: Path) -> None:
    """Write finished runs (folders or suite results) in lm-evaluation-harness's results layout."""
    from evalsuite import api

    for path in api.export(runs, out, fmt=fmt):
        click.echo(f"written: {path}")
