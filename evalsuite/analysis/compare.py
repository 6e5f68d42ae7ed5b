"""Two runs of one task on the same samples, side by side.

Runs are joined on sample id; runs made with different task configurations
are refused. Every metric a task declares (its `metrics` ClassVar) is compared
on the paired per-sample outcomes, overall and per cell of the task's
`group_by` axes:

- a metric whose values are all 0/1 is pass/fail: exact McNemar test on the
  discordant pairs;
- any other metric is continuous: paired bootstrap of the mean difference.

Every difference comes with a 95% paired-bootstrap interval. Tables are
written as markdown, CSV and LaTeX; a task's view adds its own pictures of
the pair (`pair_report`: e.g. difference heatmaps with significant cells marked).
`check.py` reuses the pairing.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evalsuite.analysis.task_of import TaskSpec, installed_task, task_spec
from evalsuite.errors import UserError
from evalsuite.runs.confine import file_name
from evalsuite.runs.identity import identity_difference, task_identity
from evalsuite.runs.records import RunFolder, config_hash, open_run, write_json_atomic

from .effective_length import Definition, PairedEffectiveLength, headline_metric, paired_effective_length
from .effective_text import paired_json, paired_markdown
from .frame import ERRORS_RULE, plain, run_frame
from .side_scores import side_metrics
from .stats import paired_difference
from .tables import csv_frame, display_rows, latex, markdown, p_text

# ---- what a run is: its task identity and the metrics it declares ----------------------------


# ---- pairing --------------------------------------------------------------------------------

def paired_frames(run_a: RunFolder, run_b: RunFolder) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two runs' frames restricted to their common samples, in the same order."""
    differ = identity_difference(task_identity(run_a.read_config()), task_identity(run_b.read_config()))
    if differ:
        raise UserError(f"cannot compare {run_a.path.name} with {run_b.path.name}: their task configurations "
                        f"differ ({differ}); compare runs of the same task parameters")
    frame_a, frame_b = run_frame(run_a), run_frame(run_b)
    if frame_a.empty or frame_b.empty:
        raise UserError(f"{(run_a if frame_a.empty else run_b).path} holds no samples yet")
    common = sorted(set(frame_a["id"]) & set(frame_b["id"]))
    if not common:
        raise UserError(f"{run_a.path.name} and {run_b.path.name} share no samples")
    aligned_a = frame_a.set_index("id").loc[common].reset_index()
    aligned_b = frame_b.set_index("id").loc[common].reset_index()
    aligned_a.attrs["unpaired"] = (len(frame_a) - len(common), len(frame_b) - len(common))
    return aligned_a, aligned_b


def is_pass_fail(*arrays: np.ndarray) -> bool:
    values = np.concatenate([a[~np.isnan(a)] for a in arrays])
    return values.size > 0 and bool(np.isin(values, (0.0, 1.0)).all())


def metric_values(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """A metric as floats (True -> 1.0); NaN where a sample has no value, a value that is not a
    number or an infinite one (a mean over it would say nothing)."""
    if metric not in frame.columns:
        return np.full(len(frame), np.nan)
    values = np.array([float(v) if isinstance(v, (numbers.Real, np.bool_)) else np.nan for v in frame[metric]],
                      dtype=float)
    values[~np.isfinite(values)] = np.nan
    return values


def paired_values(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str, cluster_key: str | None = None
                  ) -> tuple[np.ndarray, np.ndarray, bool, list[Any] | None]:
    """(a, b, pass_fail, clusters) over the pairs where both runs have a value; `clusters` holds
    each pair's value of the task's cluster key (None when the task declares none).

    The frames come from `run_frame` or `Outcomes.frame`, which score an errored sample
    (`frame.ERRORS_RULE`: 0 on a higher-is-better metric, never a missing pair, so a checkpoint
    that crashes cannot look like one that passes)."""
    a, b = metric_values(frame_a, metric), metric_values(frame_b, metric)
    pass_fail = is_pass_fail(a, b)
    keep = ~(np.isnan(a) | np.isnan(b))
    clusters = None
    if cluster_key and cluster_key in frame_a.columns:
        clusters = [c for c, k in zip(frame_a[cluster_key].tolist(), keep) if k]
    return a[keep], b[keep], pass_fail, clusters


# ---- paired statistics ----------------------------------------------------------------------

def paired_test(a: np.ndarray, b: np.ndarray, pass_fail: bool, clusters: Sequence[Any] | None = None
                ) -> dict[str, Any]:
    """Mean difference a - b over paired samples, its 95% interval and a two-sided p-value
    (`stats.paired_difference`: McNemar for independent pass/fail pairs, else a sign-flip
    permutation test; clusters resampled whole)."""
    return paired_difference(a, b, pass_fail, clusters)


def compare_frames(frame_a: pd.DataFrame, frame_b: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str],
                   alpha: float = 0.05, cluster_key: str | None = None) -> list[dict[str, Any]]:
    """One row per (cell of `keys`, metric) with the paired test of a vs b."""
    keys = [k for k in keys if k in frame_a.columns]
    grouped = frame_a.groupby(keys, sort=True, dropna=False) if keys else [((), frame_a)]
    by_id = frame_b.set_index("id")
    rows = []
    for key, part_a in grouped:
        key = key if isinstance(key, tuple) else (key,)
        part_b = by_id.loc[part_a["id"]].reset_index()
        for metric in metrics:
            a, b, pass_fail, clusters = paired_values(part_a, part_b, metric, cluster_key)
            if a.size == 0 and metric not in frame_a.columns:
                continue
            row = {**dict(zip(keys, (plain(k) for k in key))), "metric": metric,
                   **paired_test(a, b, pass_fail, clusters)}
            # an untestable row (p NaN) is neither significant nor not: None, an empty CSV cell
            row["significant"] = None if math.isnan(row["p_value"]) else bool(row["p_value"] < alpha)
            rows.append(row)
    return rows


# ---- tables ---------------------------------------------------------------------------------


# ---- the comparison of two runs -------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """Two paired runs and their tests: overall and per cell."""

    run_a: RunFolder
    run_b: RunFolder
    task: str
    names: tuple[str, str]
    spec: TaskSpec
    frame_a: pd.DataFrame
    frame_b: pd.DataFrame
    overall: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    alpha: float
    effective: PairedEffectiveLength | None = None  # a task swept over context_length: effective_length.py

    @property
    def keys(self) -> list[str]:
        return [k for k in self.spec.group_by if k in self.frame_a.columns]

    def notes(self) -> list[str]:
        only_a, only_b = self.frame_a.attrs.get("unpaired", (0, 0))
        notes = [f"{len(self.frame_a)} paired samples (joined on sample id)"]
        if only_a or only_b:
            notes.append(f"left out, present in one run only: {only_a} of {self.names[0]}, {only_b} of {self.names[1]}")
        errored = [int(f["error"].notna().sum()) if "error" in f.columns else 0 for f in (self.frame_a, self.frame_b)]
        if any(errored):
            notes.append(f"errored samples: {errored[0]} of {self.names[0]}, {errored[1]} of {self.names[1]}; {ERRORS_RULE}")
        clustered = f", samples resampled by {self.spec.cluster_key}" if self.spec.cluster_key else ""
        notes.append(f"difference = {self.names[0]} minus {self.names[1]}; pass/fail metrics: exact McNemar test, "
                     f"otherwise a sign-flip permutation test; 95% paired bootstrap intervals{clustered}; "
                     f"two-sided, significant at p < {self.alpha}, per cell without correction for multiple cells")
        return notes

    def markdown(self, cells: bool = True) -> str:
        title = f"# {self.task}: {self.names[0]} vs {self.names[1]}"
        parts = [title, "", *(f"- {note}" for note in self.notes()), "", "## Overall", "",
                 markdown(*display_rows(self.overall, [], self.names))]
        if self.effective is not None:
            parts += ["", paired_markdown(self.names, self.effective, self.alpha)]
        if cells and self.keys:
            parts += ["", "## Per cell", "", markdown(*display_rows(self.cells, self.keys, self.names))]
        return "\n".join(parts) + "\n"

    def latex(self) -> str:
        caption = f"{self.task}: {self.names[0]} vs {self.names[1]}"
        tables = [latex(*display_rows(self.overall, [], self.names), caption + ", overall")]
        if self.keys:
            tables.append(latex(*display_rows(self.cells, self.keys, self.names), caption + ", per cell"))
        return "\n\n".join(tables) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "a": {"run": self.run_a.path.name, "model": self.names[0]},
                "b": {"run": self.run_b.path.name, "model": self.names[1]}, "alpha": self.alpha,
                "group_by": self.keys, "overall": self.overall, "cells": self.cells,
                "effective_length": paired_json(self.effective) if self.effective is not None else None}


def run_names(frame_a: pd.DataFrame, frame_b: pd.DataFrame, run_a: RunFolder, run_b: RunFolder) -> tuple[str, str]:
    """Model names, or run folder names when both runs used the same model."""
    names = (str(frame_a["model"].iloc[0]), str(frame_b["model"].iloc[0]))
    return names if names[0] != names[1] else (run_a.path.name, run_b.path.name)


def compare(path_a: str | Path, path_b: str | Path, alpha: float = 0.05, effective: Definition | None = None
            ) -> Comparison:
    """Pair two runs and test every declared metric, overall and per cell; a length-swept task's
    effective lengths as `effective` defines them (NoLiMa's by default)."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be between 0 and 1, got {alpha}")
    run_a, run_b = open_run(path_a), open_run(path_b)
    for run in (run_a, run_b):
        if not run.complete:
            raise UserError(f"run {run.path} is not complete (no summary.json); rerun its command to finish it")
    frame_a, frame_b = paired_frames(run_a, run_b)
    task = str(run_a.read_config()["task"])
    spec = task_spec(task, run_a.read_records())
    shared_side = [m for m in side_metrics(run_a) if m in side_metrics(run_b)]  # e.g. a judge both runs had
    spec = replace(spec, metrics=(*spec.metrics, *shared_side))
    metric = headline_metric(spec)
    return Comparison(
        run_a=run_a, run_b=run_b, task=task, names=run_names(frame_a, frame_b, run_a, run_b), spec=spec,
        frame_a=frame_a, frame_b=frame_b, alpha=alpha,
        overall=compare_frames(frame_a, frame_b, (), spec.metrics, alpha, spec.cluster_key),
        cells=compare_frames(frame_a, frame_b, spec.group_by, spec.metrics, alpha, spec.cluster_key)
        if spec.group_by else [],
        effective=paired_effective_length(frame_a, frame_b, metric, effective) if metric is not None else None,
    )


def metric_groups(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metrics: Sequence[str]) -> dict[str, list[str]]:
    """The metrics grouped by their values: metrics that agree on every paired sample of both runs
    (for one query per sample the needle's strict and mean scores do) fall under the first of them."""
    groups: dict[str, list[str]] = {}
    values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for metric in metrics:
        a, b = metric_values(frame_a, metric), metric_values(frame_b, metric)
        same = [first for first, (fa, fb) in values.items()
                if np.array_equal(a, fa, equal_nan=True) and np.array_equal(b, fb, equal_nan=True)]
        if same:
            groups[same[0]].append(metric)
        else:
            groups[metric], values[metric] = [metric], (a, b)
    return groups


def comparison_plots(comparison: Comparison, folder: Path) -> list[Path]:
    """The side-by-side outputs of the task's view (`pair_report`), when its module is installed
    here, and for any task the per-cell difference with its interval along the first axis, once
    per distinct metric."""
    from . import plots

    folder.mkdir(parents=True, exist_ok=True)
    task = installed_task(comparison.run_a)
    view = task.view(task) if task is not None else None
    extra = view.pair_report(comparison, folder) if view is not None else []
    if not comparison.keys:
        return extra
    groups = metric_groups(comparison.frame_a, comparison.frame_b, comparison.spec.metrics)
    return extra + plots.paired_difference_plots(pd.DataFrame(comparison.cells), comparison.keys, folder,
                                                 comparison.names, stands_for=groups,
                                                 labels=view.axis_labels if view is not None else None,
                                                 alpha=comparison.alpha)


def write_comparison(comparison: Comparison, folder: Path) -> list[Path]:
    """comparison.md / .tex / .json, overall.csv, cells.csv and the plots, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "comparison.md", folder / "comparison.tex", folder / "overall.csv"]
    written[0].write_text(comparison.markdown(), encoding="utf-8")
    written[1].write_text(comparison.latex(), encoding="utf-8")
    csv_frame(comparison.overall, []).to_csv(written[2], index=False)
    if comparison.keys:
        written.append(folder / "cells.csv")
        csv_frame(comparison.cells, comparison.keys).to_csv(written[-1], index=False)
    write_json_atomic(folder / "comparison.json", comparison.to_json())
    written.append(folder / "comparison.json")
    return written + comparison_plots(comparison, folder)


DEFAULT_ALPHA = 0.05  # the significance level of `compare` and of the comparisons `run` writes


def comparison_folder(comparison: Comparison, out: str | Path) -> Path:
    digest = config_hash({"a": comparison.run_a.path.name, "b": comparison.run_b.path.name})[:8]
    safe = [n.replace("/", "_") for n in comparison.names]
    name = f"compare-{comparison.task}-{safe[0]}-vs-{safe[1]}-{digest}{settings_suffix(comparison)}"
    return Path(out) / file_name(name)  # one folder under out


def settings_suffix(comparison: Comparison) -> str:
    """'' under the default settings (the folder `run` writes); else the settings that differ
    (-alpha0.01, -share0.9, -base500_1000, -floor0.3), so a comparison made with other settings
    gets a folder of its own instead of replacing the default one."""
    parts = [f"alpha{comparison.alpha:g}"] if comparison.alpha != DEFAULT_ALPHA else []
    if comparison.effective is not None:
        given, default = comparison.effective.a.definition, Definition()
        if given.share != default.share:
            parts.append(f"share{given.share:g}")
        if given.base != default.base:
            parts.append("base" + "_".join(str(n) for n in given.base))
        if given.floor != default.floor:
            parts.append(f"floor{given.floor:g}")
    return "".join(f"-{part}" for part in parts)


def compare_runs(path_a: str | Path, path_b: str | Path, out: str | Path, alpha: float = 0.05) -> Path:
    """Write the comparison of two runs under `out`; returns its folder."""
    comparison = compare(path_a, path_b, alpha)
    folder = comparison_folder(comparison, out)
    write_comparison(comparison, folder)
    return folder


def _pairs(path_a: Path, path_b: Path) -> list[tuple[Path, Path]]:
    """Two run folders, or the runs of two suite results matched on task configuration."""
    from evalsuite.runs.suite_result import suite_runs

    for path in (path_a, path_b):
        if not path.exists():
            raise UserError(f"no such run folder or suite result: {path}")
    if path_a.is_dir() and path_b.is_dir():
        return [(path_a, path_b)]
    if not (path_a.is_file() and path_b.is_file()):
        raise UserError(f"compare takes two run folders or two suite result files, got {path_a} and {path_b}")
    runs_b = [folder for _, folder in suite_runs(path_b)]
    identities_b = [task_identity(open_run(f).read_config()) for f in runs_b]
    pairs = []
    for _, folder in suite_runs(path_a):
        identity = task_identity(open_run(folder).read_config())
        match = [b for b, ident in zip(runs_b, identities_b) if identity_difference(identity, ident) is None]
        if match:
            pairs.append((folder, match[0]))
    if not pairs:
        raise UserError(f"{path_a} and {path_b} hold no runs with the same task configuration")
    return pairs


def compare_inputs(path_a: str | Path, path_b: str | Path, out: str | Path, alpha: float = 0.05,
                   effective: Definition | None = None) -> list[tuple[Comparison, Path]]:
    """Compare two runs, or two suite results run by run; write each comparison under `out`."""
    written = []
    for run_a, run_b in _pairs(Path(path_a), Path(path_b)):
        comparison = compare(run_a, run_b, alpha, effective)
        folder = comparison_folder(comparison, out)
        write_comparison(comparison, folder)
        written.append((comparison, folder))
    return written


def summary_line(comparison: Comparison) -> str:
    parts = []
    for row in comparison.overall:
        mark = "*" if row["significant"] else ""
        test = row["test"] if row["test"].startswith("not testable") else f"p={p_text(row['p_value'])}, n={row['n']}"
        parts.append(f"{row['metric']} {row['diff']:+.3f}{mark} ({test})")
    return f"{comparison.task} {comparison.names[0]} - {comparison.names[1]}: " + ", ".join(parts)
