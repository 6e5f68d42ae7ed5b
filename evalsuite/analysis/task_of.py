"""The task a run was made with, and what its readers know of that task.

A reader of a finished run asks here, never the engine: the task object rebuilt from config.json
(for its hooks and view), or, where the task is not installed here (a plugin's run, an older
run), what its records show of its axes and metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evalsuite.errors import UserError
from evalsuite.params import build_params
from evalsuite.registry import get_task, installed_task_class
from evalsuite.runs.records import Record
from evalsuite.runs.view import RunView


def task_for_run(run: RunView) -> Any:
    """The task object a run was made with (from its config), for its axes, hooks and view."""
    config = run.read_config()
    cls = get_task(config["task"])
    raw = {k: ",".join(map(str, v)) if isinstance(v, list) else str(v) for k, v in config["params"].items()}
    return build_params(cls, raw)


def installed_task(run: RunView) -> Any | None:
    """`task_for_run`, or None when the run's task cannot be made here (its module is not
    installed, or its parameters are not this version's): analysis then reads the records alone."""
    try:
        return task_for_run(run)
    except UserError:
        return None


@dataclass(frozen=True)
class TaskSpec:
    """What a comparison needs to know about a task."""

    group_by: tuple[str, ...]
    metrics: tuple[str, ...]
    lower_is_better: tuple[str, ...] = ()  # metrics where a drop is an improvement
    cluster_key: str | None = None  # the axis that groups dependent samples (one source item)
    gating_axes: tuple[str, ...] = ()  # `check` gates each cell of these axes (and all samples pooled)
    primary_metric: str | None = None  # what `check` gates by default (None: every metric, pooled)


def task_spec(task: str, records: Sequence[Record] = ()) -> TaskSpec:
    """The task's declared axes and metrics; inferred from the records when the
    task's module is not installed here (a plugin task, an older run)."""
    cls = installed_task_class(task)
    if cls is not None:
        return TaskSpec(tuple(cls.group_by), tuple(cls.metrics), tuple(cls.lower_is_better), cls.cluster_key,
                        tuple(cls.group_by if cls.gating_axes is None else cls.gating_axes),
                        cls.primary_metric or cls.metrics[0])
    axes = sorted({k for r in records for k in r.axes})
    metrics = sorted({k for r in records for k, v in r.scores.items() if isinstance(v, (bool, int, float))})
    return TaskSpec(tuple(axes), tuple(metrics))
