"""Finished runs sent to experiment trackers: Weights & Biases and TensorBoard.

A tracker gets what a finished run folder holds, read through the run-folder format
(`runs.records.open_run`), never from a live model: the metrics (overall and per cell),
computed from the records as `report` computes them (summary.json, a cache of them, must be a
readable object; numbers of it that disagree with the records are said in a warning line and
not sent; a run with no readable record is refused), the images under plots/, and a table of
samples. Everything is keyed by the
run's training step (config.json's `checkpoint.step`, 0 when the run has none), so runs of
one model's checkpoints (one `checkpoint.family`) draw a curve over training.

    evalsuite run ... --log-to wandb --log-to tensorboard     # after each run folder is finished
    evalsuite log RUN... --to wandb                            # runs that exist already

Each tracker is used through its own Python package (`wandb`; TensorBoard through
`torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package); a tracker
whose package is missing is refused before a run starts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, first_line, unknown
from evalsuite.runs.confine import file_name
from evalsuite.runs.records import RunFolder, open_run
from evalsuite.runs.safe_json import read_json

PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}  # tracker -> the package it needs
MAX_TABLE_ROWS = 10_000  # a samples table beyond this is cut (a tracker's page would not load it)
MAX_TEXT_ROWS = 200  # TensorBoard shows its table as markdown text: the first rows only
MAX_OUTPUT_CHARS = 500  # an output longer than this is cut in the table (64K-token echoes exist)


def check_trackers(names: Iterable[str]) -> tuple[str, ...]:
    """The trackers asked for, each once, after checking that each is known and its package is
    installed: one line naming the install command otherwise. Cheap: nothing is imported."""
    wanted = tuple(dict.fromkeys(names))
    for name in wanted:
        if name not in PACKAGES:
            raise unknown("tracker", name, PACKAGES)
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise UserError(f"--log-to {name} needs the {PACKAGES[name]} package: pip install {PACKAGES[name]}")
    return wanted


@dataclass(frozen=True)
class RunContent:
    """What a tracker is sent of one finished run."""

    name: str  # the run folder's name
    series: str  # task and model: the runs of one model's checkpoints share it
    step: int
    config: dict[str, Any]
    scalars: dict[str, float]
    images: tuple[Path, ...]
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def run_content(path: str | Path) -> RunContent:
    """A finished run folder read for the trackers."""
    run = open_run(path)
    if not run.complete:
        raise UserError(f"run {run.path} is not complete (no summary.json); rerun its command to finish it")
    config = run.read_config()  # a checkpoint that is not an object, a step that is not a number: one line
    summary = records_summary(run)
    scalars = summary_scalars(summary)
    _warn_if_stale(run, summary_scalars(read_summary(run)), scalars)
    columns, rows = sample_table(run)
    checkpoint = config.get("checkpoint") or {}  # the training step and the checkpoints' family, when known
    family = str(checkpoint.get("family") or config.get("model", {}).get("name", "model"))
    step = checkpoint.get("step", config.get("step"))
    return RunContent(
        name=run.path.name, series=f"{config.get('task', 'task')}-{family}", step=int(step or 0),
        config=_tracker_config(config), scalars=scalars,
        images=tuple(sorted(run.plots.glob("*.png"))) if run.plots.is_dir() else (), columns=columns, rows=rows)


def read_summary(run: RunFolder) -> dict[str, Any]:
    """summary.json as an object, or one line saying why it is not one (a rerun rewrites it)."""
    try:
        summary = read_json(run.summary_path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{run.summary_path} is not readable ({exc}); delete it and rerun the run's "
                        "command to write it again") from None
    if not isinstance(summary, dict):
        raise UserError(f"{run.summary_path} holds a {type(summary).__name__}, not a JSON object; delete "
                        "it and rerun the run's command to write it again")
    return summary


def _warn_if_stale(run: RunFolder, stored: Mapping[str, float], computed: Mapping[str, float]) -> None:
    """One warning line when summary.json's numbers are not the records' (an edit, a stale copy)."""
    differ = [key for key, value in computed.items() if key in stored and not math.isclose(stored[key], value)]
    if differ:
        key = differ[0]
        print(f"warning: {run.summary_path} disagrees with the records on {len(differ)} number(s) (first: {key} "
              f"{stored[key]:g} there, {computed[key]:g} in the records); sent the records' numbers, and rerunning "
              "the run's command writes the summary again", file=sys.stderr)


def records_summary(run: RunFolder) -> dict[str, Any]:
    """The summary's numbers (n, errors, overall and per-cell rows) computed from the run's records,
    with the metrics `report` shows (the task's and its judges'), or one line when no record is
    readable: a tracker's curve never shows a number the records do not hold."""
    from evalsuite.analysis.frame import run_frame, summarize
    from evalsuite.analysis.side_scores import side_metrics
    from evalsuite.analysis.task_of import task_spec

    frame = run_frame(run)
    if frame.empty:
        raise UserError(f"run {run.path} holds no readable samples (samples.jsonl is empty, missing or damaged); "
                        "rerun its command")
    spec = task_spec(str(run.read_config()["task"]), run.read_records())
    metrics = (*spec.metrics, *side_metrics(run))
    return {"n": len(frame), "errors": int(frame["error"].notna().sum()) if "error" in frame.columns else 0,
            "overall": summarize(frame, (), metrics)[0], "cells": summarize(frame, spec.group_by, metrics)}


def _tracker_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of config.json a tracker shows as the run's configuration."""
    keys = ("task", "params", "limit", "model", "checkpoint", "hash", "versions", "git_commit")
    return {key: config[key] for key in keys if key in config}


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """Every number of the summary as a flat name: `overall/<metric>`, `cell/<axis=value,...>/<metric>`,
    `n`, `errors`. Booleans and missing rates (NaN) are left out: a tracker plots numbers."""
    scalars = {key: float(summary[key]) for key in ("n", "errors") if _number(summary.get(key))}
    for key, value in summary.get("overall", {}).items():
        if _number(value):
            scalars[f"overall/{key}"] = float(value)
    cell_axes = _cell_axes(summary)
    for cell in summary.get("cells", []):
        axes = {k: v for k, v in cell.items() if not _number(v) or k in cell_axes}
        label = ",".join(f"{k}={v}" for k, v in axes.items())
        for key, value in cell.items():
            if key not in axes and _number(value):
                scalars[f"cell/{label}/{key}"] = float(value)
    return scalars


def _cell_axes(summary: Mapping[str, Any]) -> set[str]:
    """The axis names of the summary's cells: a cell's keys that the overall row does not have."""
    overall = set(summary.get("overall", {}))
    return {key for cell in summary.get("cells", []) for key in cell if key not in overall}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sample_table(run: RunFolder) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """One row per sample (the first MAX_TABLE_ROWS): id, axes, target, first output, scores, error.
    Lists and objects (a per-query hit list) are shown as JSON text."""
    records = run.read_records()[:MAX_TABLE_ROWS]
    axes = list(dict.fromkeys(k for r in records for k in r.axes))
    scores = list(dict.fromkeys(k for r in records for k in r.scores))
    columns = ("id", *axes, "target", "output", *scores, "error")
    rows = []
    for record in records:
        output = record.outputs[0] if record.outputs else ""
        rows.append((record.id, *(_cell(record.axes.get(k)) for k in axes), " | ".join(record.target),
                     _cell(output)[:MAX_OUTPUT_CHARS], *(_cell(record.scores.get(k)) for k in scores),
                     record.error or ""))
    return columns, tuple(rows)


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# ---- the trackers --------------------------------------------------------------------------


def send_wandb(content: RunContent, project: str | None = None) -> str:
    """One W&B run per run folder (grouped by task and model), with its metrics at its step, its
    plots as images and its samples as a table; where it went depends on WANDB_MODE, WANDB_DIR...
    as W&B's own settings say. Returns where the run is (its URL, or its local folder offline)."""
    import wandb

    run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "evalsuite", name=content.name,
                     group=content.series, job_type="eval", config=content.config,
                     reinit="create_new")  # a caller's own W&B run stays open
    try:
        logged: dict[str, Any] = dict(content.scalars)
        logged.update({f"plots/{image.stem}": wandb.Image(str(image)) for image in content.images})
        logged["samples"] = wandb.Table(columns=list(content.columns), data=[list(row) for row in content.rows])
        run.log(logged, step=content.step)
        run.summary.update({**content.scalars, "step": content.step})
        where = run.url or str(Path(run.dir).parent)  # offline: the run's local folder (its .wandb file)
    finally:
        run.finish()
    return str(where)


def send_tensorboard(content: RunContent, log_dir: Path) -> str:
    """Event files under `log_dir/<task>-<family>` (the checkpoints' family, else the model's
    name, as one file name: `org/name` is `org_name`, and nothing in config.json leads outside
    `log_dir`), so that runs of one model's checkpoints add points to the same curves: scalars,
    plots as images, samples as a markdown table."""
    from torch.utils.tensorboard import SummaryWriter

    from evalsuite.analysis.tables import markdown as markdown_table

    folder = log_dir / file_name(content.series)
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for tag, value in content.scalars.items():
            writer.add_scalar(tag, value, global_step=content.step)
        for image in content.images:
            writer.add_image(f"plots/{image.stem}", _image_array(image), global_step=content.step,
                             dataformats="HWC")
        writer.add_text("samples", markdown_table(content.columns, content.rows[:MAX_TEXT_ROWS]),
                        global_step=content.step)
        writer.add_text("config", f"```\n{json.dumps(content.config, indent=1, sort_keys=True)}\n```",
                        global_step=content.step)
    finally:
        writer.close()
    return str(folder)


def _image_array(path: Path) -> Any:
    """A PNG as an RGB array (height, width, 3) of uint8, as SummaryWriter takes it."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(path))  # float in [0, 1] for PNG, RGB or RGBA
    if pixels.ndim == 2:
        pixels = np.stack([pixels] * 3, axis=-1)
    return (np.clip(pixels[..., :3], 0.0, 1.0) * 255).round().astype(np.uint8)


def log_runs(paths: Sequence[str | Path], trackers: Iterable[str], *, tensorboard_dir: Path | None = None,
             project: str | None = None, on_sent: Callable[[Path, str, str], None] | None = None) -> list[str]:
    """Send each finished run to each tracker; `tensorboard_dir` defaults to `tensorboard/` beside
    the first run folder. `on_sent(run, tracker, where)` hears of each. Returns where each went."""
    wanted = check_trackers(trackers)
    contents = [(Path(path), run_content(path)) for path in paths]  # every folder checked before anything is sent
    sent = []
    for path, content in contents:
        for tracker in wanted:
            try:
                if tracker == "wandb":
                    where = send_wandb(content, project)
                else:
                    where = send_tensorboard(content, tensorboard_dir or path.parent / "tensorboard")
            except (UserError, KeyboardInterrupt):
                raise
            except Exception as exc:  # a tracker's own failure (no login, no network): the run itself is safe on disk
                why = first_line(exc).rstrip(".")
                raise UserError(f"{tracker} did not take run {path}: {why}; the run folder is complete, "
                                f"send it again with: evalsuite log {path} --to {tracker}") from None
            sent.append(where)
            if on_sent is not None:
                on_sent(path, tracker, where)
    return sent


def tracker_hook(trackers: Iterable[str], out: Path) -> Callable[[RunFolder], None] | None:
    """For `run --log-to`: the trackers checked now (before any run starts), then each finished run
    folder sent as it finishes (a tracker that refuses it is a warning line: the runs go on);
    TensorBoard's files go under `out/tensorboard`. None for no tracker."""
    wanted = check_trackers(trackers)
    if not wanted:
        return None

    def send(run: RunFolder) -> None:
        try:
            log_runs([run.path], wanted, tensorboard_dir=out / "tensorboard")
        except UserError as exc:  # a tracker's refusal must not stop the models still to run
            print(f"warning: {exc}", file=sys.stderr)

    return send
