"""`evalsuite trend`: each metric against the training step over a series of checkpoints, and a
gate that checks every checkpoint against the one before it (or the best one before it).

The runs are those with a training step in their config.json (`evalsuite run --step N`, or a
step read from the checkpoint folder). A series is one model family (the `checkpoint.family`
the run recorded: the model's name without its step part) on one task configuration
(`runs.identity.task_identity`): runs of different task parameters are never compared.

A point is one checkpoint's metric over one cell of the task's gating axes (needle: length x
depth), or over all samples ("all"), with its 95% interval (`stats.mean_interval`: Wilson for
pass/fail outcomes). A sample that failed with an error scores 0 on a higher-is-better metric
and has no value of a lower-is-better one (`frame.ERRORS_RULE`), as in report, compare and `check`.

The gate is `check`'s calibrated per-cell gate, unchanged, with the earlier checkpoint as the
baseline: each checkpoint's gated rows (primary metric over all samples and per cell) are one
Holm family, exactly as `evalsuite check CHECKPOINT --baseline EARLIER` would test them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite.errors import UserError
from evalsuite.runs.identity import task_identity
from evalsuite.runs.records import open_run
from evalsuite.runs.suite_result import suite_runs

from .check import CheckResult, check
from .compare import metric_values
from .gate import MetricCheck
from .outcomes import ALL, Outcomes, run_outcomes
from .stats import mean_interval
from .tolerances import Tolerances

AGAINST = ("previous", "best")


@dataclass(frozen=True)
class Checkpoint:
    """One finished run of a checkpoint with a training step."""

    step: int
    family: str
    path: Path
    outcomes: Outcomes


@dataclass(frozen=True)
class Series:
    """One model family on one task configuration, its checkpoints by step."""

    label: str
    family: str
    task: str
    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class StepGate:
    """One checkpoint checked against an earlier one of its series."""

    series: str
    step: int
    against: int
    run: str
    result: CheckResult

    @property
    def failed(self) -> list[MetricCheck]:
        return self.result.failed


@dataclass(frozen=True)
class TrendResult:
    series: tuple[Series, ...]
    points: pd.DataFrame  # a row per series, step, metric and cell: mean, low, high, n
    gates: tuple[StepGate, ...] = ()
    against: str = "previous"
    notes: tuple[str, ...] = ()
    files: tuple[Path, ...] = field(default_factory=tuple)

    @property
    def gated(self) -> bool:
        return bool(self.gates)

    @property
    def failed(self) -> list[StepGate]:
        return [g for g in self.gates if g.failed]


# ---- finding the checkpoints --------------------------------------------------------------------

def _run_paths(inputs: Sequence[str | Path]) -> list[Path]:
    """Run folders from run folders, folders of run folders (a results folder) and suite result
    files, each once, in the order given."""
    found: dict[Path, None] = {}
    for item in inputs:
        path = Path(item)
        if path.is_file():
            paths = [folder for _, folder in suite_runs(path)]
        elif (path / "config.json").is_file():
            paths = [path]
        elif path.is_dir():
            paths = sorted(child for child in path.iterdir() if (child / "config.json").is_file())
        else:
            raise UserError(f"no such run folder, results folder or suite result: {item}")
        found.update((p.resolve(), None) for p in paths)
    return list(found)


def find_checkpoints(inputs: Sequence[str | Path]) -> tuple[list[Checkpoint], list[str]]:
    """The finished runs with a training step, and notes on the runs left out."""
    checkpoints, without_step, unfinished = [], 0, []
    for path in _run_paths(inputs):
        run = open_run(path)
        checkpoint = run.read_config().get("checkpoint")
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("step"), int):
            without_step += 1
        elif not run.complete:
            unfinished.append(path.name)
        else:
            checkpoints.append(Checkpoint(checkpoint["step"], str(checkpoint.get("family") or "model"), path,
                                          run_outcomes(path)))
    notes = [f"left out, not finished (no summary.json): {name}" for name in unfinished]
    if without_step:
        notes.append(f"left out: {without_step} run{'s' if without_step != 1 else ''} without a training step "
                     "(`evalsuite run --step N`, or a checkpoint folder named like checkpoint-1500)")
    if not checkpoints:
        raise UserError("no finished run with a training step in " + ", ".join(str(i) for i in inputs)
                        + "; record one with `evalsuite run --step N` (or a folder named like checkpoint-1500)")
    return checkpoints, notes


def build_series(checkpoints: Sequence[Checkpoint]) -> list[Series]:
    """Checkpoints grouped by family and task configuration, each group ordered by step; two runs
    of one group at one step are refused (which of them is the checkpoint?)."""
    groups: dict[tuple[str, str], list[Checkpoint]] = {}
    for cp in checkpoints:
        identity = json.dumps(task_identity(cp.outcomes.config), sort_keys=True, default=str)
        groups.setdefault((cp.family, identity), []).append(cp)
    labels = _labels(list(groups))
    series = []
    for key, members in groups.items():
        members.sort(key=lambda cp: cp.step)
        for first, second in zip(members, members[1:]):
            if first.step == second.step:
                raise UserError(f"two runs of {key[0]} at step {first.step} with the same task configuration: "
                                f"{first.path} and {second.path}; give only one of them")
        task = str(members[0].outcomes.config["task"])
        series.append(Series(labels[key], key[0], task, tuple(members)))
    return series


def _labels(keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """"family", or "family task" when a family ran several tasks, "#k" added for several
    configurations of one task."""
    tasks = {key: json.loads(key[1])["task"] for key in keys}
    labels = {}
    for key in keys:
        same_family = [k for k in keys if k[0] == key[0]]
        same_task = [k for k in same_family if tasks[k] == tasks[key]]
        label = key[0] if len({tasks[k] for k in same_family}) == 1 else f"{key[0]} {tasks[key]}"
        labels[key] = label if len(same_task) == 1 else f"{label} #{same_task.index(key) + 1}"
    return labels


# ---- the points ---------------------------------------------------------------------------------

def checkpoint_points(series: Series, cp: Checkpoint) -> list[dict[str, object]]:
    """One row per metric and cell (all samples first, then each cell in the plan's order)."""
    frame = cp.outcomes.frame()
    labels = list(dict.fromkeys(frame["cell"]))
    cells = [(ALL, np.ones(len(frame), dtype=bool))]
    if len(labels) > 1:
        cells += [(label, (frame["cell"] == label).to_numpy()) for label in labels]
    rows = []
    for metric in cp.outcomes.scores:
        values = metric_values(frame, metric)  # an errored sample scored by Outcomes.frame (ERRORS_RULE)
        for cell, keep in cells:
            picked = values[keep & ~np.isnan(values)]
            mean, low, high = mean_interval(picked.tolist())
            rows.append({"series": series.label, "family": series.family, "task": series.task, "step": cp.step,
                         "run": cp.path.name, "metric": metric, "cell": cell, "n": int(picked.size), "mean": mean,
                         "low": low, "high": high, "lower_is_better": metric in cp.outcomes.lower_is_better})
    return rows


def trend_points(series: Sequence[Series]) -> pd.DataFrame:
    rows = [row for s in series for cp in s.checkpoints for row in checkpoint_points(s, cp)]
    if not rows:
        raise UserError("the runs with a training step hold no scored sample")
    frame = pd.DataFrame(rows)
    return frame[frame["n"] > 0].reset_index(drop=True)  # a metric this run never scored


# ---- the gate -----------------------------------------------------------------------------------

def _primary(cp: Checkpoint) -> str:
    gated = cp.outcomes.gated
    return gated[0] if gated else next(iter(cp.outcomes.scores))


def _best_before(series: Series, index: int, points: pd.DataFrame) -> Checkpoint:
    """The earlier checkpoint with the best primary metric over all samples (the latest of equals)."""
    earlier = series.checkpoints[:index]
    metric = _primary(series.checkpoints[index])
    pooled = points[(points["series"] == series.label) & (points["metric"] == metric) & (points["cell"] == ALL)]
    by_step = dict(zip(pooled["step"], pooled["mean"]))
    sign = -1.0 if metric in series.checkpoints[index].outcomes.lower_is_better else 1.0
    scored = [cp for cp in earlier if cp.step in by_step]
    if not scored:
        return earlier[-1]
    return max(reversed(scored), key=lambda cp: sign * by_step[cp.step])


def gate(series: Sequence[Series], points: pd.DataFrame, against: str, tolerances: Tolerances, alpha: float,
         metrics: Sequence[str] = (), allow_unjudged: bool = False, latest_only: bool = False) -> list[StepGate]:
    """Every checkpoint after a series' first (or only its latest) checked against the previous
    one, or the best one before it, by `check` itself."""
    if against not in AGAINST:
        raise UserError(f"--against takes {' or '.join(AGAINST)}, got {against!r}")
    gates = []
    for s in series:
        indices = range(1, len(s.checkpoints))
        for index in indices[-1:] if latest_only else indices:
            cp = s.checkpoints[index]
            base = s.checkpoints[index - 1] if against == "previous" else _best_before(s, index, points)
            result = check(cp.path, base.path, tolerances, alpha, False, metrics, allow_unjudged)
            gates.append(StepGate(s.label, cp.step, base.step, cp.path.name, result))
    return gates


# ---- the result, in words -----------------------------------------------------------------------

def _value(row: pd.Series) -> str:
    if pd.isna(row["low"]):
        return f"{row['mean']:.3f}"
    return f"{row['mean']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def _table(rows: pd.DataFrame, column: str) -> list[str]:
    """A row per step, a column per value of `column` (in first-appearance order)."""
    columns = list(dict.fromkeys(rows[column]))
    lines = ["| step | " + " | ".join(str(c) for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for step, at_step in rows.groupby("step", sort=True):
        values = {row[column]: _value(row) for _, row in at_step.iterrows()}
        lines.append(f"| {step} | " + " | ".join(values.get(c, "") for c in columns) + " |")
    return lines + [""]


def series_tables(result: TrendResult, cells: bool = True) -> list[str]:
    """Per series: each metric over all samples by step (mean [95% interval]); with `cells`, each
    metric's table of every cell too."""
    lines = []
    for s in result.series:
        part = result.points[result.points["series"] == s.label]
        lines += [f"### {s.label}: {s.task}", "", "All samples, mean [95% interval]:", ""]
        lines += _table(part[part["cell"] == ALL], "metric")
        if cells and part["cell"].nunique() > 1:
            for metric, rows in part.groupby("metric", sort=False):
                lines += [f"{metric} by cell:", ""] + _table(rows, "cell")
    return lines


def gate_lines(result: TrendResult, most: int | None = None) -> list[str]:
    """The gate's table (a row per checkpoint checked) and one line per failed row (the first
    `most` of them, when given)."""
    if not result.gates:
        return []
    count = f"{len(result.gates)} checkpoint{'s' if len(result.gates) != 1 else ''}"
    status = f"FAIL ({len(result.failed)} of {count} regressed)" if result.failed else f"PASS ({count} checked)"
    lines = [f"## evalsuite trend gate: {status}", "",
             f"Each checkpoint against the {'previous one' if result.against == 'previous' else 'best one before it'}"
             f" of its series, by `evalsuite check` (tolerance {result.gates[0].result.tolerances.text()}, alpha "
             f"{result.gates[0].result.alpha:g}, Holm over each checkpoint's gated rows).", "",
             "| series | step | against step | gated rows | failed | verdict |", "|---|---|---|---|---|---|"]
    for g in result.gates:
        verdict = "**REGRESSION**" if g.failed else "pass"
        lines.append(f"| {g.series} | {g.step} | {g.against} | {len(g.result.checks)} | {len(g.failed)} | {verdict} |")
    failures = [_failure_line(g, c) for g in result.gates for c in g.failed]
    if most is not None and len(failures) > most:
        failures = failures[:most] + [f"- ... and {len(failures) - most} more failed rows (trend.md lists them all)"]
    return lines + ([""] + failures if failures else []) + [""]


def _failure_line(g: StepGate, c: MetricCheck) -> str:
    where = "over all samples" if c.cell == ALL else f"in cell {c.cell}"
    return (f"- step {g.step} ({g.series}) failed {c.metric} {where}: {c.baseline:.3f} at step {g.against} -> "
            f"{c.candidate:.3f} (drop {c.drop:+.3f}, one-sided bounds [{c.low:+.3f}, {c.high:+.3f}], tolerance "
            f"{c.max_drop:g}, p {'< 0.001' if c.p_value < 0.001 else f'= {c.p_value:.3f}'} (Holm), n {c.n})")


def markdown(result: TrendResult, cells: bool = True) -> str:
    lines = ["# evalsuite trend", ""] + series_tables(result, cells) + gate_lines(result)
    lines += [f"- {note}" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


# ---- the command's work -------------------------------------------------------------------------

def trend(inputs: Sequence[str | Path], out: Path, *, gate_against: str | None = None,
          tolerances: Tolerances | None = None, alpha: float = 0.05, metrics: Sequence[str] = (),
          allow_unjudged: bool = False, latest_only: bool = False, pooled_only: bool = False) -> TrendResult:
    """The series found in `inputs`, their points, plots and tables written under `out`; with
    `gate_against` ("previous" or "best"), every checkpoint (or each series' latest) gated."""
    from .trend_plot import plot_trends

    checkpoints, notes = find_checkpoints(inputs)
    series = build_series(checkpoints)
    points = trend_points(series)
    gates = gate(series, points, gate_against, tolerances or Tolerances(), alpha, metrics, allow_unjudged,
                 latest_only) if gate_against is not None else []
    if gate_against is not None and not gates:
        notes.append("nothing gated: no series has two checkpoints yet (the first is the baseline of the next)")
    result = TrendResult(tuple(series), points, tuple(gates), gate_against or "previous", tuple(notes))
    try:
        out.mkdir(parents=True, exist_ok=True)
        points.to_csv(out / "trend.csv", index=False)
        report = markdown(result, cells=True)
        for g in result.failed:  # the full check table of each regression, under the summary
            report += f"\n### step {g.step} of {g.series} against step {g.against}\n\n" + g.result.markdown()
        (out / "trend.md").write_text(report, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    plots = plot_trends(points, out, pooled_only, {g.step for g in result.failed})
    _publish(result)
    files = (out / "trend.csv", out / "trend.md", *plots)
    return TrendResult(result.series, points, result.gates, result.against, result.notes, files)


def _publish(result: TrendResult) -> None:
    """The gate's table into GitHub's step summary when running there."""
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file and result.gates:
        try:
            with open(summary_file, "a", encoding="utf-8") as fh:
                fh.write("\n".join(gate_lines(result)) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write {summary_file}: {exc.strerror or exc}") from None
