"""`evalsuite log RUN... --to wandb|tensorboard`: send finished runs to experiment trackers."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("log")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--to", "trackers", multiple=True, required=True, type=click.Choice(["wandb", "tensorboard"]),
              help="Tracker to send to (repeatable): W&B (its own settings: WANDB_PROJECT, WANDB_MODE...) or "
              "TensorBoard event files.")
@click.option("--project", default=None, help="W&B project (default: WANDB_PROJECT, else evalsuite).")
@click.option("--tensorboard-dir", type=click.Path(path_type=Path), default=None,
              help="Folder of the TensorBoard event files (default: tensorboard/ beside the first run).")
def log_cmd(runs: tuple[Path, ...], trackers: tuple[str, ...], project: str | None,
            tensorboard_dir: Path | None) -> None:
    """Send finished runs (folders or suite results) to W&B or TensorBoard: summary metrics, plots and a
    samples table, at the run's training step."""
    from evalsuite import api

    api.log(runs, trackers, tensorboard_dir=tensorboard_dir, project=project,
            on_sent=lambda run, tracker, where: click.echo(f"{run}: {tracker}: {where}"))
