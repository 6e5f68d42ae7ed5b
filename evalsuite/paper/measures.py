"""Per-model rates with 95% intervals and paired tests against the baseline, for a section's cells.

Everything here is read from the analysis modules: `frame.summarize` (Wilson intervals for
pass/fail metrics, Student t otherwise) and `compare.paired_frames` / `compare.compare_frames`
(exact McNemar or a sign-flip permutation test, paired bootstrap intervals, clusters resampled
whole), so a number in the paper report is the number `evalsuite report` and `compare` print.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from evalsuite.analysis.compare import compare_frames, paired_frames
from evalsuite.analysis.frame import run_frame, summarize
from evalsuite.analysis.tables import p_text
from evalsuite.analysis.task_of import task_spec
from evalsuite.runs.records import RunFolder

ALPHA = 0.05
Key = tuple[Any, ...]
# the fewest paired samples in every cell, and the fewest documents, before a section reads its
# differences in words ("above ... at 3 of 4 settings", "a band clear of zero"): below them the
# numbers are shown with their n, and the reading says there are too few to read
MIN_SAMPLES = 10
MIN_DOCUMENTS = 10


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.mean):
            return "n/a"
        interval = "" if math.isnan(self.low) else f" [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        return f"{self.mean:.{digits}f}{interval}, n={self.n}"


@dataclass(frozen=True)
class Paired:
    """A model minus the baseline on paired samples (the sign flipped from compare's baseline minus model)."""

    diff: float
    low: float
    high: float
    p_value: float
    n: int
    test: str

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_value) and self.p_value < ALPHA

    def text(self, digits: int = 3) -> str:
        if math.isnan(self.diff):
            return "n/a"
        interval = "" if math.isnan(self.low) else f" [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        p = "not testable" if math.isnan(self.p_value) else f"p={p_text(self.p_value)}"
        return f"{self.diff:+.{digits}f}{interval}, {p}, n={self.n}" + (" *" if self.significant else "")


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def _negated(value: Any) -> float:
    """-value, without the -0.0 that would print as "-0.000"."""
    return -_nan(value) + 0.0


def estimates(run: RunFolder, keys: Sequence[str], metric: str,
              frame: Callable[[RunFolder], pd.DataFrame] = run_frame) -> dict[Key, Estimate]:
    """The run's mean of `metric` with its 95% interval, per cell of `keys`."""
    rows = summarize(frame(run), keys, [metric])
    out = {}
    for row in rows:
        if metric not in row:
            continue
        key = tuple(row[k] for k in keys if k in row)
        out[key] = Estimate(_nan(row[metric]), _nan(row[f"{metric}_low"]), _nan(row[f"{metric}_high"]), int(row["n"]))
    return out


def paired(baseline: RunFolder, other: RunFolder, keys: Sequence[str], metric: str) -> dict[Key, Paired]:
    """`other` minus `baseline` on their common samples, per cell of `keys` (all samples: keys ())."""
    frame_a, frame_b = paired_frames(baseline, other)
    cluster = task_spec(str(baseline.read_config()["task"])).cluster_key
    rows = compare_frames(frame_a, frame_b, keys, [metric], ALPHA, cluster)
    out = {}
    for row in rows:
        key = tuple(row[k] for k in keys if k in row)
        out[key] = Paired(_negated(row["diff"]), _negated(row["high"]), _negated(row["low"]), _nan(row["p_value"]),
                          int(row["n"]), str(row["test"]))
    return out


def reading(model: str, baseline: str, cells: dict[Key, Paired], what: str, lower_is_better: bool = False) -> str:
    """One line: at how many cells the model is better than the baseline, and how many significantly."""
    tested = [p for p in cells.values() if not math.isnan(p.diff)]
    if not tested:
        return f"{model} vs {baseline}: no paired samples"
    fewest = min(p.n for p in tested)
    if fewest < MIN_SAMPLES:
        return (f"{model} vs {baseline}: as few as {fewest} paired samples in one of the {len(tested)} {what}, fewer "
                f"than the {MIN_SAMPLES} a reading needs; the differences are shown, not read")
    better = [p for p in tested if (p.diff < 0 if lower_is_better else p.diff > 0)]
    significant = [p for p in better if p.significant]
    worse = [p for p in tested if p.significant and p not in better]
    word = "below" if lower_is_better else "above"
    line = (f"{model} {word} {baseline} at {len(better)} of {len(tested)} {what}, {len(significant)} significant "
            f"(p < {ALPHA})")
    return line + (f"; significantly worse at {len(worse)}" if worse else "")
