"""`evalsuite view RESULTS_DIR`: click through runs, samples and comparisons in a browser."""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_PORT = 7575


@click.command("view")
@click.argument("results", metavar="RESULTS_DIR", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(min=0, max=65535), default=DEFAULT_PORT, show_default=True,
              help="Port on 127.0.0.1 to serve the viewer on (0: any free port).")
@click.option("--write", "write_file", type=click.Path(path_type=Path), default=None,
              help="Write one self-contained HTML file (data and images inside it) instead of serving.")
def view(results: Path, port: int, write_file: Path | None) -> None:
    """Browse the runs and comparisons under RESULTS_DIR (the --out folder of `evalsuite run`): each run's
    table and plots, every sample filterable by cell and by right/wrong, two runs of the same task side
    by side on one sample, and each comparison's table. Serves on 127.0.0.1 until Ctrl+C, or with
    --write writes one HTML file that opens anywhere, offline."""
    from evalsuite import api

    if write_file is not None:
        click.echo(f"written: {api.write_view(results, write_file)}")
        return
    api.serve_view(results, port, lambda url: click.echo(f"evalsuite view: serving {results} at {url} (Ctrl+C to stop)"))
