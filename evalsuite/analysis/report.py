"""`evalsuite report`: a finished run's markdown table, its task's own section and its plots.

Everything here is a pure function of the records on disk; no torch import.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from evalsuite.analysis.task_of import task_for_run
from evalsuite.contracts import TaskView
from evalsuite.errors import UserError
from evalsuite.runs.records import open_run
from evalsuite.runs.view import ReadOnlyRun, RunView

from .effective_length import Definition, effective_length, headline_metric
from .effective_text import report_markdown
from .frame import ERRORS_RULE, run_frame, summarize
from .side_scores import side_metrics
from .tables import markdown
from .thinking import thinking_summary, unended_line


def format_rate(mean: float | None, low: float | None, high: float | None) -> str:
    if mean is None:
        return "n/a"
    if low is None or high is None:
        return f"{mean:.3f}"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def markdown_table(rows: list[dict[str, Any]], keys: Sequence[str], metrics: Sequence[str]) -> str:
    """A markdown table: group keys, then each metric as 'mean [low, high]', then n."""
    header = list(keys) + [f"{m} (95% CI)" for m in metrics] + ["n"]
    body = []
    for row in rows:
        cells = [str(row.get(k)) for k in keys]
        cells += [format_rate(row.get(m), row.get(f"{m}_low"), row.get(f"{m}_high")) for m in metrics]
        cells.append(str(row.get("n")))
        body.append(cells)
    return markdown(header, body)


def view_plots(task: Any, frame: pd.DataFrame, run: RunView, folder: Path, title: str) -> list[Path] | None:
    """The plots the task's view draws into `folder`, or None when its view keeps TaskView's
    (it draws none): the run's summary and report then name no plots at all."""
    view = task.view(task)
    if type(view).plots is TaskView.plots:
        return None
    written: list[Path] = view.plots(frame, run, folder, title)
    return written


def effective_section(task: Any, frame: pd.DataFrame, effective: Definition | None = None) -> list[str]:
    """The run's effective length, as `effective` defines it (NoLiMa's by default), when its task swept
    context lengths (effective_length.py), else nothing."""
    metric = headline_metric(task)
    found = effective_length(frame, metric, effective) if metric is not None else None
    return [report_markdown(str(frame["model"].iloc[0]), found)] if found is not None else []


def report_runs(paths: Iterable[str | Path], plots: bool = True, effective: Definition | None = None) -> str:
    """Markdown tables for finished runs (and their plots rewritten when asked); a length-swept run's
    effective length as `effective` defines it (NoLiMa's by default)."""
    sections = []
    for path in paths:
        run = open_run(path)
        if not run.complete:
            raise UserError(f"run {path} is not complete (no summary.json); rerun its command to finish it")
        task = task_for_run(run)
        frame = run_frame(run)
        if frame.empty:
            raise UserError(f"run {path} holds no samples (samples.jsonl is empty or missing); rerun its command")
        metrics = (*task.metrics, *side_metrics(run))
        rows = summarize(frame, task.group_by, metrics)
        keys = [k for k in task.group_by if k in frame.columns]
        title = f"## {run.path.name} ({task.name}, {frame['model'].iloc[0]}, n={len(frame)})"
        errors = int(frame["error"].notna().sum()) if "error" in frame.columns else 0
        unended = unended_line(thinking_summary(frame, run.read_config()))  # a reasoning model's thinking
        sections.append(title + "\n\n" + markdown_table(rows, keys, metrics)
                        + f"\n\nn: scored and errored samples ({errors} errored); {ERRORS_RULE}"
                        + (f"\n\n{unended}" if unended else ""))
        section = task.view(task).report_section(ReadOnlyRun(run))  # e.g. judged accuracy, kept beside samples.jsonl
        if section:
            sections.append(section)
        sections += effective_section(task, frame, effective)
        written = view_plots(task, frame, ReadOnlyRun(run), run.plots, str(frame["model"].iloc[0])) if plots else None
        if written is not None:
            sections.append("plots: " + ", ".join(str(p) for p in written))
    return "\n\n".join(sections)
