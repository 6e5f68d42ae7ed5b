"""A run's scores: its records' own, plus the side scores its task keeps beside them.

A task's `side_scores` (the hallucination task's: one judged-accuracy metric
per judge whose verdicts the run holds) adds per-sample values that are not in
samples.jsonl, because they are made after the run and may be redone
with another judge. Report, compare, check and the HTML report read a run's
records through `scored_records` and its extra metric names through
`side_metrics`, so these metrics are gated and compared like declared ones.
"""

from __future__ import annotations

from dataclasses import replace

from evalsuite.analysis.task_of import installed_task
from evalsuite.runs.records import Record
from evalsuite.runs.view import ReadOnlyRun, RunView


def side_scores(run: RunView) -> dict[str, dict[str, float | None]]:
    """Sample id -> {metric: value} from the task's side files; empty when it keeps none or
    its module is not installed here."""
    task = installed_task(run)
    return {} if task is None else task.side_scores(ReadOnlyRun(run))


def side_metrics(run: RunView, scores: dict[str, dict[str, float | None]] | None = None) -> tuple[str, ...]:
    """The extra metric names this run has, sorted."""
    scores = side_scores(run) if scores is None else scores
    return tuple(sorted({metric for values in scores.values() for metric in values}))


def scored_records(run: RunView) -> list[Record]:
    """The run's records, each with its side scores merged into `scores`."""
    records = run.read_records()
    scores = side_scores(run)
    if not scores:
        return records
    return [replace(r, scores={**r.scores, **scores.get(r.id, {})}) for r in records]
