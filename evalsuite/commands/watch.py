"""`evalsuite watch DIR`: evaluate each new checkpoint of a training folder as it is saved."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from evalsuite.api import DEFAULT_MAX_DROP


def _executor_options(values: tuple[str, ...]) -> dict[str, Any]:
    """`--executor-option gpus_per_node=1`: numbers as numbers, the rest as text (submitit's types)."""
    from evalsuite.params import split_pairs

    options: dict[str, Any] = {}
    for key, value in split_pairs(values, "--executor-option").items():
        try:
            options[key] = int(value)
        except ValueError:
            try:
                options[key] = float(value)
            except ValueError:
                options[key] = value
    return options


@click.command("watch")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--task", default=None, help="Task to run on each checkpoint (see `evalsuite list`).")
@click.option("--suite", default=None, help="Suite to run on each checkpoint instead: a TOML file or a shipped name.")
@click.option("-T", "task_options", multiple=True, metavar="KEY=VALUE", help="Task parameter (repeatable).")
@click.option("-M", "model_options", multiple=True, metavar="KEY=VALUE", help="Backend option (repeatable).")
@click.option("--scale", default=None, help="With --suite: its [run.scale.NAME] parameters.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="With --suite: its {data_dir}.")
@click.option("--model-pattern", "pattern", default="checkpoint-*", show_default=True,
              help="Sub-folders of FOLDER that are checkpoints (a shell pattern).")
@click.option("--ready-file", "marker", default=None, metavar="NAME",
              help="A checkpoint is ready once this file exists in it (instead of: weights complete and unchanged).")
@click.option("--settle", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds a complete checkpoint's files must stay unchanged before it is evaluated.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds between looks at FOLDER when no file-system event comes.")
@click.option("--poll", "polling", is_flag=True, help="Look every --interval seconds only (network file systems: no events).")
@click.option("--once", is_flag=True, help="Evaluate the checkpoints that are complete now and exit (cron, CI).")
@click.option("--until-step", type=click.IntRange(min=0), default=None,
              help="Stop once the checkpoint at this step (or a later one) is done.")
@click.option("--against", type=click.Choice(["previous", "best"]), default="previous", show_default=True,
              help="Gate each checkpoint against the previous one or the best one before it.")
@click.option("--max-drop", "max_drop", multiple=True, metavar="[METRIC=]VALUE",
              help=f"Tolerated drop, as for `evalsuite check` (default {DEFAULT_MAX_DROP:g}).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME", help="Also gate this metric per cell.")
@click.option("--alpha", type=float, default=0.05, show_default=True,
              help="Significance level of each gate, between 0 and 1 (as for `evalsuite check`).")
@click.option("--webhook", default=None, metavar="URL", help="Post a failed gate here (Slack-compatible JSON).")
@click.option("--log-to", "log_to", multiple=True, type=click.Choice(["wandb", "tensorboard"]),
              help="Send each finished run to a tracker (repeatable), at its checkpoint's step.")
@click.option("--executor", type=click.Choice(["local", "slurm", "local-submitit"]), default="local",
              show_default=True, help="Where each checkpoint is evaluated: here, or one job each through submitit.")
@click.option("--executor-option", "executor_options", multiple=True, metavar="KEY=VALUE",
              help="A submitit resource (timeout_min=60, gpus_per_node=1, slurm_partition=gpu...; repeatable).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Evaluate only the first N samples.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--device", default="auto", show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--out", type=click.Path(), default="results", show_default=True,  # text: '' is refused, not "."
              help="Folder of the run folders; the ledger goes to OUT/watch, the trend to OUT/trend.")
@click.option("--no-progress", is_flag=True, help="Hide progress bars.")
def watch(folder: Path, task: str | None, suite: str | None, task_options: tuple[str, ...],
          model_options: tuple[str, ...], scale: str | None, data_dir: Path | None, max_drop: tuple[str, ...],
          executor_options: tuple[str, ...], no_progress: bool, **settings: Any) -> None:
    """Follow FOLDER, a training run's output folder, and evaluate each new checkpoint once it is
    complete, lowest step first: append it to the trend (OUT/trend), gate it against the previous
    (or best) one with `check`'s per-cell gate, post a regression to --webhook. Started again, it
    evaluates nothing twice. Exit 1 when a checkpoint evaluated here regressed or did not load; 2 on
    bad input (gate options by `check`'s rules, refused at the start)."""
    from evalsuite import api
    from evalsuite.params import split_pairs

    default, by_metric = api.parse_max_drop(max_drop)
    common = {key: settings.pop(key) for key in ("out", "limit", "batch_size", "device", "seed", "log_to")}
    result = api.watch(folder, task=task, suite=suite, params=split_pairs(task_options, "-T"),
                       model_options=split_pairs(model_options, "-M"), scale=scale, data_dir=data_dir,
                       progress=not no_progress, echo=click.echo, max_drop=default, max_drop_by_metric=by_metric,
                       executor_options=_executor_options(executor_options), **common, **settings)
    done = len(result.evaluated) + len(result.already)
    click.echo(f"{len(result.evaluated)} checkpoint(s) evaluated now, {done} in all; waiting for "
               f"{len(result.waiting)}; trend: {result.trend}")
    if result.failed:
        sys.exit(1)
