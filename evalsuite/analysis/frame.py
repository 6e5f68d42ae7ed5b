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
    """One row per record: run, model, task, the sample's axes and scores as columns."""
    config = run.read_config()
    rows = []
    for record in scored_records(run):
        row: dict[str, Any] = {"run": run.path.name, "model": record.model, "task": record.task, "id": record.id}
        row.update(record.axes)
        row.update({k: v for k, v in record.info.items() if not isinstance(v, (list, dict))})
        row.update({k: v for k, v in record.scores.items() if not isinstance(v, (list, dict))})
        row["error"] = record.error
        rows.append(row)
    frame = pd.DataFrame(rows)
    _numeric_metrics(frame, config["task"], side_metrics(run))
    return frame


def _numeric_metrics(frame: pd.DataFrame, task: str, extra: Sequence[str]) -> None:
    """A metric's value that is not a number (a damaged record, no verdict) becomes missing, and a
    metric no record holds is a column of missing values: tables and tests then show n = 0."""
    for metric in (*task_spec(task).metrics, *extra):
        if metric not in frame.columns:
            frame[metric] = float("nan")
        elif not pd.api.types.is_numeric_dtype(frame[metric]):  # object, or pandas' own text type
            numbers = frame[metric].map(lambda v: float(v) if isinstance(v, (bool, int, float)) else float("nan"))
            if numbers.isna().any():
                frame[metric] = numbers


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
            values = _with_errors_as_fails(part, metric).dropna()  # a non-number is no value
            mean, low, high = mean_interval(values.tolist())
            row[metric] = mean
            row[f"{metric}_low"], row[f"{metric}_high"] = low, high
        row["n"] = _counted(part, metrics)
        row["errors"] = int(part["error"].notna().sum()) if "error" in part.columns else 0
        rows.append(row)
    return [{k: plain(v) for k, v in row.items()} for row in rows]


ERRORS_RULE = "a sample that failed with an error counts as a fail in a pass/fail rate (as in compare and check)"


def _with_errors_as_fails(part: pd.DataFrame, metric: str) -> pd.Series:
    """The metric's values with errored samples of a pass/fail metric as 0: one rule in report, compare
    and check, so a crashing checkpoint never shows a higher rate than its passes earn. A metric that
    is not pass/fail (NLL, a mean over queries) has no value for an errored sample."""
    values = pd.to_numeric(part[metric], errors="coerce")
    present = values.dropna()
    if "error" not in part.columns or present.empty or not present.isin((0.0, 1.0)).all():
        return values
    return values.mask(values.isna() & part["error"].notna(), 0.0)


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
