"""`evalsuite trend RUNS...`: metrics against the training step, and the checkpoint-series gate."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from evalsuite.api import DEFAULT_MAX_DROP


@click.command("trend")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(), default="trend", show_default=True,
              help="Folder for trend.csv, trend.md and trend_<metric>.png.")
@click.option("--gate", is_flag=True,
              help="Check each checkpoint against an earlier one of its series (exit 1 when one regressed).")
@click.option("--against", type=click.Choice(["previous", "best"]), default="previous", show_default=True,
              help="The earlier checkpoint a checkpoint is gated against: the previous step, or the best "
              "(primary metric over all samples) before it.")
@click.option("--latest-only", is_flag=True,
              help="Gate only each series' latest checkpoint (CI: earlier ones were gated when they were new).")
@click.option("--max-drop", "max_drop", multiple=True, metavar="[METRIC=]VALUE",
              help=f"Tolerated drop, as for `evalsuite check` (default {DEFAULT_MAX_DROP:g}).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="Also gate this metric per cell (repeatable), as for `evalsuite check`.")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="Significance level of each checkpoint's gate (Holm over its gated rows).")
@click.option("--allow-unjudged", is_flag=True, help="Gate judged metrics on the judged samples only.")
@click.option("--pooled-only", is_flag=True, help="Draw only the all-samples line of each series (not each cell).")
def trend(runs: tuple[Path, ...], out: str, gate: bool, against: str, latest_only: bool, max_drop: tuple[str, ...],
          metrics: tuple[str, ...], alpha: float, allow_unjudged: bool, pooled_only: bool) -> None:
    """Each metric against the training step, for the runs with a step (`evalsuite run --step N`, or a
    checkpoint folder named like checkpoint-1500) among RUNS (run folders, results folders, suite
    results): one line per model family and cell with 95% intervals in trend_<metric>.png, and
    trend.csv, trend.md. Runs are compared only within one task configuration. With --gate, each
    checkpoint is checked against the previous one (or --against best) by `evalsuite check`'s
    per-cell gate: exit 1 when any checkpoint regressed, 0 otherwise, 2 on bad input."""
    from evalsuite import api

    if (against != "previous" or latest_only) and not gate:
        raise click.UsageError("--against and --latest-only choose what --gate checks: add --gate")
    if not out.strip():
        raise click.UsageError("--out must name a folder (an empty name would write into the current folder)")
    note = api.version_note(runs)
    if note is not None:
        click.echo(note, err=True)
    default, by_metric = api.parse_max_drop(max_drop)
    result = api.trend(runs, out=Path(out), gate=against if gate else None, max_drop=default,
                       max_drop_by_metric=by_metric, metrics=metrics, alpha=alpha, allow_unjudged=allow_unjudged,
                       latest_only=latest_only, pooled_only=pooled_only)
    click.echo(api.trend_text(result, most=20))
    for note in result.notes:
        click.echo(f"note: {note}")
    click.echo("written: " + ", ".join(str(path) for path in result.files))
    if result.failed:
        sys.exit(1)
