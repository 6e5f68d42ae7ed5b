"""What `check` and `trend` read: each run's per-sample outcomes, from a run folder, a suite result
or an exported baseline file, and candidate runs matched to baseline runs on their task
configuration (`gate.py` measures each pair's drops).

An exported baseline keeps the task configuration, the per-sample outcomes of
each metric, each sample's cell of the task's gating axes and which metrics
the task gates, nothing else: small enough to commit next to the suite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from evalsuite.analysis.task_of import task_spec
from evalsuite.errors import UserError
from evalsuite.runs.identity import identity_difference, task_identity
from evalsuite.runs.records import RunFolder, open_run, write_json_atomic
from evalsuite.runs.suite_result import RESULT_FORMAT, read_json_input, suite_runs
from evalsuite.version import __version__

from .frame import score_errors
from .side_scores import scored_records, side_metrics

BASELINE_FORMAT = "evalsuite-baseline"
ALL = "all"  # the cell label of every sample pooled


@dataclass(frozen=True)
class Outcomes:
    """One run's per-sample outcomes, from a run folder or a baseline file."""

    name: str  # the suite entry's name, or the run folder's
    run: str  # the run folder's name
    config: Mapping[str, Any]  # the run's config.json
    ids: tuple[str, ...]
    scores: Mapping[str, tuple[float | None, ...]]  # metric -> value per id (None: no value)
    errors: Mapping[str, str] = field(default_factory=dict)  # id -> error, for samples that failed
    lower_is_better: tuple[str, ...] = ()
    clusters: tuple[Any, ...] | None = None  # per id: the value of the task's cluster key
    cells: tuple[str, ...] | None = None  # per id: its cell of the task's gating axes ("depth=0.5")
    gated: tuple[str, ...] | None = None  # what the gate tests by default (None: every metric)
    side: tuple[str, ...] = ()  # side-score metrics (judged outcomes): no value is an unjudged sample

    @property
    def model(self) -> str:
        return str(self.config.get("model", {}).get("name", "?"))

    def frame(self) -> pd.DataFrame:
        """A row per sample: id, each metric (an errored sample's as `frame.ERRORS_RULE` says, also
        for a baseline file that kept no value for it), error, cluster and cell."""
        frame = pd.DataFrame({"id": list(self.ids), **{m: list(v) for m, v in self.scores.items()}})
        frame["error"] = [self.errors.get(i) for i in self.ids]
        frame["cluster"] = list(self.clusters) if self.clusters is not None else list(self.ids)
        frame["cell"] = list(self.cells) if self.cells is not None else [ALL] * len(self.ids)
        return score_errors(frame, list(self.scores), self.lower_is_better)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "run": self.run, "config": dict(self.config), "ids": list(self.ids),
                "scores": {m: list(v) for m, v in self.scores.items()}, "errors": dict(self.errors),
                "lower_is_better": list(self.lower_is_better),
                "clusters": list(self.clusters) if self.clusters is not None else None,
                "cells": list(self.cells) if self.cells is not None else None,
                "gated": list(self.gated) if self.gated is not None else None, "side": list(self.side)}


def _compact(value: Any) -> float | int | None:
    """Scores as small JSON numbers: pass/fail as 0/1; a missing, non-numeric or infinite value as None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def cell_label(axes: Mapping[str, Any], names: Sequence[str]) -> str:
    """A sample's cell of the gating axes, as the table shows it: "context_length=1024, depth=0.5"."""
    present = [name for name in names if name in axes]
    return ", ".join(f"{name}={axes[name]}" for name in present) if present else ALL


def run_outcomes(folder: Path, name: str | None = None) -> Outcomes:
    run: RunFolder = open_run(folder)
    if not run.complete:
        raise UserError(f"run {folder} is not complete (no summary.json); rerun its command to finish it")
    config = run.read_config()
    records = scored_records(run)  # with the task's side scores (judged accuracy) as metrics
    spec = task_spec(config["task"], records)
    side = side_metrics(run)
    metrics = (*spec.metrics, *side)
    return Outcomes(
        name=name or run.path.name, run=run.path.name, config=config, ids=tuple(r.id for r in records),
        scores={m: tuple(_compact(r.scores.get(m)) for r in records) for m in metrics},
        errors={r.id: r.error for r in records if r.error}, lower_is_better=spec.lower_is_better,
        clusters=tuple(r.axes.get(spec.cluster_key) for r in records) if spec.cluster_key else None,
        cells=tuple(cell_label(r.axes, spec.gating_axes) for r in records),
        # a side score is the task's judged outcome (the hallucination task's judged accuracy): gated
        gated=(spec.primary_metric, *side) if spec.primary_metric else None, side=side,
    )


def _optional(raw: Mapping[str, Any], key: str) -> tuple[Any, ...] | None:
    return tuple(raw[key]) if raw.get(key) is not None else None


def baseline_outcomes(path: Path, data: Mapping[str, Any]) -> list[Outcomes]:
    """The runs of an exported baseline file (one written before cells were kept gates pooled)."""
    if data.get("version") != 1:
        raise UserError(f"{path}: unsupported baseline version {data.get('version')!r}; re-export it")
    try:
        return [Outcomes(name=r["name"], run=r["run"], config=r["config"], ids=tuple(r["ids"]),
                         scores={m: tuple(v) for m, v in r["scores"].items()}, errors=r.get("errors", {}),
                         lower_is_better=tuple(r.get("lower_is_better", ())), clusters=_optional(r, "clusters"),
                         cells=_optional(r, "cells"), gated=_optional(r, "gated"), side=tuple(r.get("side", ())))
                for r in data["runs"]]
    except (KeyError, TypeError) as exc:
        raise UserError(f"{path} is a damaged baseline file (missing {exc}); re-export it") from None


def load_outcomes(source: str | Path) -> list[Outcomes]:
    """Outcomes of a run folder, a suite result file or an exported baseline file."""
    path = Path(source)
    if path.is_dir():
        return [run_outcomes(path)]
    if not path.is_file():
        raise UserError(f"no such run folder, suite result or baseline file: {source}")
    data = read_json_input(path)
    if data.get("format") == BASELINE_FORMAT:
        return baseline_outcomes(path, data)
    if data.get("format") == RESULT_FORMAT:
        return [run_outcomes(folder, name) for name, folder in suite_runs(path, data)]
    raise UserError(f"{path} is neither a run folder, a suite result nor an exported baseline "
                    f"(format {data.get('format')!r})")


def export_baseline(outcomes: Sequence[Outcomes], path: Path, source: str) -> None:
    write_json_atomic(path, {"format": BASELINE_FORMAT, "version": 1, "source": source,
                             "evalsuite": __version__, "runs": [o.to_json() for o in outcomes]})


def match_runs(candidates: Sequence[Outcomes], baselines: Sequence[Outcomes]
               ) -> tuple[list[tuple[Outcomes, Outcomes]], list[Outcomes]]:
    """(candidate, baseline) pairs with the same task configuration, and the
    candidate runs that have no baseline. A baseline run without a candidate
    is bad input: the candidate did not run what the baseline holds."""
    pairs, unmatched, used = [], [], set()
    for cand in candidates:
        identity = task_identity(cand.config)
        found = [i for i, base in enumerate(baselines)
                 if i not in used and identity_difference(identity, task_identity(base.config)) is None]
        if found:
            named = [i for i in found if baselines[i].name == cand.name]
            index = (named or found)[0]
            used.add(index)
            pairs.append((cand, baselines[index]))
        else:
            unmatched.append(cand)
    for i, base in enumerate(baselines):
        if i not in used:
            near = [c for c in candidates if c.config["task"] == base.config["task"]]
            hint = ""
            if near:
                differ = identity_difference(task_identity(near[0].config), task_identity(base.config))
                hint = f"; the candidate's {near[0].name} differs ({differ})"
            raise UserError(f"baseline run {base.name} ({base.config['task']}) has no candidate run with the same "
                            f"task configuration{hint}")
    return pairs, unmatched


def unjudged(cand: Outcomes, base: Outcomes) -> dict[str, int]:
    """Side-score metric -> how many shared samples have no value of it in either run without
    having failed (a failed sample counts as a fail; one the judge did not answer is unknown)."""
    shared = set(cand.ids) & set(base.ids)
    counts = {}
    for metric in sorted(set(cand.side) | set(base.side)):
        missing: set[str] = set()
        for run in (cand, base):
            values = run.scores.get(metric)
            if values is not None:
                missing |= {i for i, v in zip(run.ids, values) if v is None and i not in run.errors}
        if missing & shared:
            counts[metric] = len(missing & shared)
    return counts




def coverage_notes(pairs: Sequence[tuple[Outcomes, Outcomes]], unmatched: Sequence[Outcomes]) -> list[str]:
    notes = [f"not checked, no baseline with the same task configuration: {c.name}" for c in unmatched]
    for cand, base in pairs:
        missing = len(set(base.ids) - set(cand.ids))
        if missing:
            notes.append(f"{cand.name}: {missing} of the baseline's {len(base.ids)} samples are not in the candidate "
                         f"(run with a smaller --limit?); only shared samples are compared")
        errors = sum(1 for i in cand.ids if i in cand.errors)
        if errors:
            notes.append(f"{cand.name}: {errors} candidate samples failed with an error (0 on every higher-is-better "
                         "metric; no value of a lower-is-better one)")
    return notes
