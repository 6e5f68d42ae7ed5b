"""A run's records as one tidy DataFrame (a row per sample), and summaries of it.

Pure functions of the records on disk (with the task's side scores); no torch import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from evalsuite.analysis.task_of import task_spec
from evalsuite.runs.records import open_run
from evalsuite.runs.view import RunView

from .side_scores import scored_records, side_metrics
from .stats import mean_interval


def run_frame(run: RunView) -> pd.DataFrame:
    """One row per record: run, model, task, the sample's axes and scores as columns; an errored
    sample's metrics as `ERRORS_RULE` says (`score_errors`)."""
    config = run.read_config()
    records = scored_records(run)
    rows = []
    for record in records:
        row: dict[str, Any] = {"run": run.path.name, "model": record.model, "task": record.task, "id": record.id}
        row.update(record.axes)
        row.update({k: v for k, v in record.info.items() if not isinstance(v, (list, dict))})
        row.update({k: v for k, v in record.scores.items() if not isinstance(v, (list, dict))})
        row["error"] = record.error
        rows.append(row)
    frame = pd.DataFrame(rows)
    spec = task_spec(config["task"], records)
    metrics = (*spec.metrics, *side_metrics(run))
    _numeric_metrics(frame, metrics)
    return score_errors(frame, metrics, spec.lower_is_better)


def _numeric_metrics(frame: pd.DataFrame, metrics: Sequence[str]) -> None:
    """A metric's value that is not a number (a damaged record, no verdict) becomes missing, and a
    metric no record holds is a column of missing values: tables and tests then show n = 0."""
    for metric in metrics:
        if metric not in frame.columns:
            frame[metric] = float("nan")
        elif not pd.api.types.is_numeric_dtype(frame[metric]):  # object, or pandas' own text type
            numbers = frame[metric].map(lambda v: float(v) if isinstance(v, (bool, int, float)) else float("nan"))
            if numbers.isna().any():
                frame[metric] = numbers


# the rule for a sample that failed with an error, in words: the reports print it under their tables
ERRORS_RULE = ("a sample that failed with an error counts as a fail: 0 on every higher-is-better metric, fractional "
               "scores included; a lower-is-better metric (a loss such as nll) has no value for it")


def errored_values(frame: pd.DataFrame, metric: str, lower_is_better: bool = False) -> pd.Series:
    """The metric as floats (NaN: no value) with the one rule for an errored sample (a row whose
    `error` is set) applied: 0 on a higher-is-better metric, pass/fail or fractional alike, so a
    crashing checkpoint never shows a higher rate than its passes earn; no value on a
    lower-is-better one, where 0 would be the best score (the error count is shown instead).
    Report, compare, check, trend, the effective length and the Python frame all read it."""
    if metric not in frame.columns:
        return pd.Series(float("nan"), index=frame.index)
    values = pd.to_numeric(frame[metric], errors="coerce").astype(float)
    if "error" not in frame.columns:
        return values
    return values.mask(frame["error"].notna(), float("nan") if lower_is_better else 0.0)


def score_errors(frame: pd.DataFrame, metrics: Sequence[str], lower_is_better: Sequence[str] = ()) -> pd.DataFrame:
    """`frame` (changed in place, and returned) with each of `metrics` read through `errored_values`
    where a sample errored; a frame without errors is left as it is."""
    if "error" not in frame.columns or not frame["error"].notna().any():
        return frame
    for metric in dict.fromkeys(metrics):
        if metric in frame.columns:
            frame[metric] = errored_values(frame, metric, metric in lower_is_better)
    return frame


def load_frame(paths: Iterable[str | Path]) -> pd.DataFrame:
    frames = [run_frame(open_run(p)) for p in paths]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return frame


def summarize(frame: pd.DataFrame, group_by: Sequence[str], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Per group and metric: mean, n and a 95% interval (Wilson for pass/fail)."""
    rows = []
    keys = [k for k in group_by if k in frame.columns]
    grouped = frame.groupby(keys, sort=True, dropna=False) if keys else [((), frame)]
    for key, part in grouped:
        key = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(keys, key))
        for metric in metrics:
            if metric not in part.columns:
                continue
            values = pd.to_numeric(part[metric], errors="coerce").dropna()  # errors already scored (run_frame)
            mean, low, high = mean_interval(values.tolist())
            row[metric] = mean
            row[f"{metric}_low"], row[f"{metric}_high"] = low, high
        row["n"] = _counted(part, metrics)
        row["errors"] = int(part["error"].notna().sum()) if "error" in part.columns else 0
        rows.append(row)
    return [{k: plain(v) for k, v in row.items()} for row in rows]


def _counted(part: pd.DataFrame, metrics: Sequence[str]) -> int:
    """Samples that were scored or failed: a sample the task skipped on purpose (a text
    document shorter than the window) has neither scores nor an error and is not counted."""
    present = [m for m in metrics if m in part.columns]
    if not present:
        return len(part)
    scored = part[present].apply(pd.to_numeric, errors="coerce").notna().any(axis=1)
    failed = part["error"].notna() if "error" in part.columns else False
    return int((scored | failed).sum())


def plain(value: Any) -> Any:
    """A table's value as plain Python for JSON: numpy scalars -> Python; NaN -> None (valid JSON)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
