"""Effective length: the longest context length at which a model keeps most of its short-context score.

NoLiMa (Modarressi et al., 2025) states a model's usable context this way: its score at each
length of a sweep against its own base score, and the longest length that keeps at least 85%
of that base. Here, for any task swept over `context_length`:

- the base score is the model's score at the shortest length run (every other axis, depth
  included, pooled: a length's score is the mean over all its samples);
- the effective length is the longest length L such that every length up to L keeps at least
  `threshold` x base: a model that falls below at 2K and recovers at 4K by chance keeps 1K
  (so the shortest length always qualifies, and a sweep of one length says nothing);
- it is undefined, and said so, when the base score is zero: there is nothing to keep;
- its 95% interval is a percentile bootstrap: each resample draws the samples of every length
  with replacement, within their length, and recomputes the scores, the base and the length
  (seeded: the same records give the same interval). Resamples whose base is zero have no
  effective length; their share is reported and the interval is over the others;
- two models on the same samples: the difference of their effective lengths (a minus b, in
  tokens) with a paired bootstrap interval, each resample drawing the same sample ids, within
  each length, for both models.

A pass/fail sample that failed with an error counts as a fail, as in report, compare and check.
Pure numpy and pandas over a run's frame (one row per sample); nothing here reads a run folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from evalsuite.errors import UserError

from .tolerances import EFFECTIVE_SHARE

LENGTH = "context_length"
RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95


@dataclass(frozen=True)
class EffectiveLength:
    """One model's scores along the sweep and its effective length (None: undefined) with an interval."""

    metric: str
    threshold: float
    lengths: tuple[int, ...]
    scores: tuple[float, ...]
    counts: tuple[int, ...]
    value: int | None
    low: int | None
    high: int | None
    undefined_share: float  # resamples with a zero base score, left out of the interval

    @property
    def base(self) -> float:
        return self.scores[0]

    def text(self) -> str:
        if self.value is None:
            return f"undefined: its score at the shortest length ({self.lengths[0]} tokens) is zero"
        interval = "" if self.low is None else f" [{self.low}, {self.high}]"
        note = f"; undefined in {self.undefined_share:.0%} of resamples" if self.undefined_share > 0 else ""
        return f"{self.value} tokens{interval}{note}"


@dataclass(frozen=True)
class PairedEffectiveLength:
    """Both models' effective lengths on their shared samples, and a minus b with its paired interval."""

    a: EffectiveLength
    b: EffectiveLength
    diff: int | None
    low: int | None
    high: int | None
    n: int
    undefined_share: float

    def text(self, negated: bool = False) -> str:
        """a minus b in words, or b minus a when `negated` (the paper report's model minus baseline)."""
        if self.diff is None:
            return "undefined: a model's score at the shortest length is zero"
        sign = -1 if negated else 1
        diff, low, high = self.diff * sign, self.low, self.high
        if negated and low is not None and high is not None:
            low, high = -high, -low
        interval = "" if low is None else f" [{low:+d}, {high:+d}]"
        note = f"; undefined in {self.undefined_share:.0%} of resamples" if self.undefined_share > 0 else ""
        return f"{diff:+d} tokens{interval}{note}"


def headline_metric(spec: Any) -> str | None:
    """The metric a task's effective length is read on (a `TaskSpec`, or a task class): its primary
    metric, else its first; None when lower is better (a loss has no share of a score to keep)."""
    metric: str = spec.primary_metric or spec.metrics[0]
    return None if metric in spec.lower_is_better else metric


def length_swept(frame: pd.DataFrame, axis: str = LENGTH) -> bool:
    """Does the frame hold samples of two or more lengths?"""
    return axis in frame.columns and frame[axis].dropna().nunique() >= 2


def metric_scores(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """The metric as floats, NaN where there is none; an errored sample of a pass/fail metric is a fail."""
    values = pd.to_numeric(frame[metric], errors="coerce").to_numpy(dtype=float) if metric in frame else \
        np.full(len(frame), np.nan)
    present = values[~np.isnan(values)]
    if "error" in frame.columns and present.size and np.isin(present, (0.0, 1.0)).all():
        values = np.where(np.isnan(values) & frame["error"].notna().to_numpy(), 0.0, values)
    return values


def effective_lengths(scores: np.ndarray, lengths: np.ndarray, threshold: float) -> np.ndarray:
    """The effective length of each row of `scores` (rows x lengths, the shortest first); NaN
    where the base score is not positive."""
    base = scores[..., :1]
    keeps = scores >= threshold * base - 1e-12  # the base keeps itself, whatever rounding does
    run = np.cumprod(keeps, axis=-1).sum(axis=-1)  # lengths kept before the first that is not
    found = lengths[np.maximum(run, 1) - 1].astype(float)
    return np.where(base[..., 0] > 0, found, np.nan)


def _cells(frame: pd.DataFrame, values: np.ndarray, axis: str) -> list[tuple[int, np.ndarray]]:
    """(length, row positions with a value) per length, the shortest first (rows without a length left out)."""
    lengths = pd.to_numeric(frame[axis], errors="coerce").to_numpy(dtype=float)
    has = ~np.isnan(values) & ~np.isnan(lengths)
    return [(int(length), np.flatnonzero((lengths == length) & has)) for length in sorted(set(lengths[has].tolist()))]


def _draws(cells: list[tuple[int, np.ndarray]], resamples: int, seed: int) -> list[np.ndarray]:
    """Per length, `resamples` x n row positions drawn with replacement from that length's rows."""
    rng = np.random.default_rng(seed)
    return [rows[rng.integers(0, rows.size, size=(resamples, rows.size))] for _, rows in cells]


def _interval(values: np.ndarray) -> tuple[int | None, int | None, float]:
    """Percentile interval of the defined values (actual values, not interpolated) and the undefined share."""
    defined = values[~np.isnan(values)]
    share = 1.0 - defined.size / values.size if values.size else 1.0
    if defined.size == 0:
        return None, None, share
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(defined, [tail, 1 - tail], method="inverted_cdf")
    return int(low), int(high), share


def _one(metric: str, threshold: float, cells: list[tuple[int, np.ndarray]], values: np.ndarray,
         draws: list[np.ndarray]) -> tuple[EffectiveLength, np.ndarray]:
    lengths = np.array([length for length, _ in cells])
    scores = np.array([values[rows].mean() for _, rows in cells])
    value = effective_lengths(scores, lengths, threshold)
    resampled = effective_lengths(np.stack([values[d].mean(axis=1) for d in draws], axis=1), lengths, threshold)
    low, high, share = _interval(resampled)
    found = EffectiveLength(metric, threshold, tuple(int(n) for n in lengths), tuple(float(s) for s in scores),
                            tuple(rows.size for _, rows in cells), None if math.isnan(value) else int(value),
                            low, high, share)
    return found, resampled


def effective_length(frame: pd.DataFrame, metric: str, threshold: float = EFFECTIVE_SHARE, axis: str = LENGTH,
                     resamples: int = RESAMPLES, seed: int = SEED) -> EffectiveLength | None:
    """One model's effective length over the frame's samples (None: fewer than two lengths scored)."""
    _check(threshold)
    values = metric_scores(frame, metric)
    cells = _cells(frame, values, axis) if axis in frame.columns else []
    if len(cells) < 2:
        return None
    return _one(metric, threshold, cells, values, _draws(cells, resamples, seed))[0]


def paired_effective_length(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str, threshold: float = EFFECTIVE_SHARE,
                            axis: str = LENGTH, resamples: int = RESAMPLES, seed: int = SEED
                            ) -> PairedEffectiveLength | None:
    """Both models' effective lengths over the samples both scored (joined on `id`) and a minus b."""
    _check(threshold)
    if axis not in frame_a.columns:
        return None
    joined = frame_a[["id", axis]].reset_index(drop=True)
    other = frame_b.drop_duplicates("id").set_index("id").reindex(joined["id"]).reset_index()
    a, b = metric_scores(frame_a.reset_index(drop=True), metric), metric_scores(other, metric)
    shared = np.where(np.isnan(a) | np.isnan(b), np.nan, 0.0)  # a value for both models
    cells = _cells(joined, shared, axis)
    if len(cells) < 2:
        return None
    draws = _draws(cells, resamples, seed)  # one draw of sample ids for both models
    found_a, resampled_a = _one(metric, threshold, cells, a, draws)
    found_b, resampled_b = _one(metric, threshold, cells, b, draws)
    diff = None if found_a.value is None or found_b.value is None else found_a.value - found_b.value
    low, high, share = _interval(resampled_a - resampled_b)
    n = sum(rows.size for _, rows in cells)
    return PairedEffectiveLength(found_a, found_b, diff, low, high, n, share)


def _check(threshold: float) -> None:
    if not 0 < threshold <= 1:
        raise ValueError(f"the share of the short-context score to keep must be in (0, 1], got {threshold}")


def check_share(share: float) -> None:
    """--effective-share as the commands take it: the same rule, as one line for the user."""
    try:
        _check(share)
    except ValueError as exc:
        raise UserError(f"--effective-share: {exc}") from None


# ---- as text --------------------------------------------------------------------------------------------

def rule(found: EffectiveLength) -> str:
    return (f"the longest length up to which every length keeps at least {found.threshold:.0%} of the model's score "
            f"at {found.lengths[0]} tokens ({found.metric}); 95% bootstrap interval, samples resampled within each "
            f"length ({RESAMPLES} resamples)")


def curve_table(found: EffectiveLength) -> str:
    """Markdown: each length's score, its share of the base score, whether it keeps the threshold, n."""
    lines = [f"| length | {found.metric} | share of the {found.lengths[0]}-token score | kept | n |",
             "|---|---|---|---|---|"]
    for length, score, n in zip(found.lengths, found.scores, found.counts):
        share = score / found.base if found.base > 0 else math.nan
        kept = "yes" if found.value is not None and length <= found.value else "no"
        lines.append(f"| {length} | {score:.3f} | {'n/a' if math.isnan(share) else f'{share:.2f}'} | {kept} | {n} |")
    return "\n".join(lines)


def report_markdown(model: str, found: EffectiveLength) -> str:
    """`evalsuite report`'s section for one run."""
    return "\n".join([f"### Effective length: {model}: {found.text()}", "", f"- {rule(found)}", "",
                      curve_table(found)])


def paired_markdown(names: tuple[str, str], paired: PairedEffectiveLength) -> str:
    """`evalsuite compare`'s section: both models and their difference."""
    rows = [f"| {names[0]} | {paired.a.text()} | {paired.a.base:.3f} |",
            f"| {names[1]} | {paired.b.text()} | {paired.b.base:.3f} |",
            f"| {names[0]} minus {names[1]} | {paired.text()} | |"]
    return "\n".join(["## Effective length", "", f"- {rule(paired.a)}",
                      f"- the difference: paired bootstrap over the {paired.n} samples both runs scored, the same "
                      "sample ids drawn for both models within each length", "",
                      f"| model | effective length (95% CI) | {paired.a.metric} at {paired.a.lengths[0]} tokens |",
                      "|---|---|---|", *rows])


def paired_json(paired: PairedEffectiveLength) -> dict[str, object]:
    def one(found: EffectiveLength) -> dict[str, object]:
        return {"value": found.value, "low": found.low, "high": found.high, "base": found.base,
                "lengths": list(found.lengths), "scores": list(found.scores), "n": list(found.counts),
                "undefined_share": found.undefined_share}

    return {"metric": paired.a.metric, "threshold": paired.a.threshold, "a": one(paired.a), "b": one(paired.b),
            "diff": paired.diff, "low": paired.low, "high": paired.high, "n": paired.n,
            "undefined_share": paired.undefined_share}
