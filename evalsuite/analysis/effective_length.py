"""Effective length as NoLiMa defines it: the longest context length at which a model keeps 85% of its
short-context score.

NoLiMa (Modarressi et al., ICML 2025: its §4.3 and the results table of its README) states a model's
usable context against the model's own base score. Here, for any task swept over `context_length`:

- the base score is the model's score over its samples at the base lengths (`Definition.base`, by
  default NoLiMa's 250, 500 and 1000 tokens), every other axis pooled. NoLiMa's paper takes each
  question-needle pair's best score of the three (each a mean of 130 tests) and averages those; with the
  few samples a pair has at a length here, a best of three would lift the base of a noisy model and so
  shorten its length, so the samples are pooled instead (docs/nolima.md);
- the candidates are the lengths from the longest base length up (NoLiMa's 1K, 2K...); the effective
  length is the longest candidate whose score keeps at least `share` x base ("the largest tested length
  that exceeds this threshold": a model below at 2K and above at 4K keeps 4K), and "<1000 tokens" (below
  the first candidate, NoLiMa's "<1K") when none does; 0 stands for that in arrays and differences;
- a run that lacks a base length says so and takes the shortest length it ran as the base instead (the
  first candidate then, which keeps itself): not NoLiMa's base, and named so;
- not measurable, and said so, when the base score is under `floor`: a model that fails most short
  contexts drops over lengths by its accuracy, not by its context;
- its 95% interval: 2000 draws of the score at every length (a pass/fail rate from its Jeffreys
  posterior, Beta(passes + 1/2, fails + 1/2), which keeps its width at 0 or n passes as the Wilson
  interval of the rate tables does; any other metric by a bootstrap of the length's samples), the base
  and the length recomputed from each, the 2.5th and 97.5th percentiles (seeded: the same records give
  the same interval). It is given only when the base and every candidate hold at least 1 / (1 - share)
  samples (7 at 85%): with fewer, one failure at a length decides the length, and the line says so;
- two models on the same samples: the difference of their effective lengths (a minus b, in tokens) with
  a paired interval (each length's four joint outcomes drawn from Dirichlet(counts + 1/2), or the same
  bootstrap sample ids for both); beside it the paired test of their base scores and of each length's
  scores (stats.paired_difference: exact McNemar for pass/fail), since lengths measured against
  different bases differ partly by accuracy.

A sample that failed with an error scores 0 (`frame.ERRORS_RULE`), as in report, compare and check.
numpy, pandas and scipy over a run's frame (one row per sample); nothing here reads a run folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from evalsuite.errors import UserError

from .effective_draws import RESAMPLES, SEED, drawn_pairs, drawn_scores, pass_fail
from .frame import errored_values
from .stats import paired_difference
from .tolerances import EFFECTIVE_BASE, EFFECTIVE_FLOOR, EFFECTIVE_SHARE

LENGTH = "context_length"
CONFIDENCE = 0.95
NOLIMA_BASE = (250, 500, 1000)  # NoLiMa's short lengths, whatever the default becomes
NOLIMA_SHARE = 0.85


def _problems(share: float, base: Sequence[int], floor: float) -> dict[str, str]:
    """What is wrong with each setting, by the command-line option that sets it (empty: nothing)."""
    found = {}
    if not 0 < share <= 1:
        found["--effective-share"] = f"the share of the base score to keep must be in (0, 1], got {share}"
    if not base or min(base) < 1 or len(set(base)) < len(base):
        found["--effective-base"] = f"the base lengths must be distinct token counts of 1 or more, got {list(base)}"
    if not 0 <= floor < 1:
        found["--effective-floor"] = f"the floor of the base score must be in [0, 1), got {floor}"
    return found


@dataclass(frozen=True)
class Definition:
    """What an effective length is measured against: the share of the base score a length must keep, the
    lengths whose score is the base, and the floor under which a base says nothing about degradation."""

    share: float = EFFECTIVE_SHARE
    base: tuple[int, ...] = EFFECTIVE_BASE
    floor: float = EFFECTIVE_FLOOR

    def __post_init__(self) -> None:
        problems = _problems(self.share, self.base, self.floor)
        if problems:
            raise ValueError(next(iter(problems.values())))
        object.__setattr__(self, "base", tuple(sorted(int(n) for n in self.base)))

    @property
    def min_samples(self) -> int | None:
        """The fewest samples at which one failure, among passes, keeps the share (None: no number does,
        at a share of 100%)."""
        if self.share >= 1:
            return None
        return math.ceil(1 / (1 - self.share) - 1e-9)  # the 1e-9: 1 / (1 - 0.9) is 10.000000000000002


def definition(share: float = EFFECTIVE_SHARE, base: Sequence[int] = EFFECTIVE_BASE,
               floor: float = EFFECTIVE_FLOOR) -> Definition:
    """The commands' options as a Definition, or one line for the user naming the option that is wrong."""
    problems = _problems(share, base, floor)
    if problems:
        option, problem = next(iter(problems.items()))
        raise UserError(f"{option}: {problem}")
    return Definition(share, tuple(base), floor)


def tokens_text(tokens: int, first: int) -> str:
    """A length as shown: 0 stands for "below the first candidate"."""
    return f"<{first}" if tokens == 0 else str(tokens)


def words(lengths: Sequence[int]) -> str:
    """250, 500 and 1000."""
    items = [str(n) for n in lengths]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _interval_text(missing: str | None, low: int | None, high: int | None, show: Callable[[int], str]) -> str:
    """" [low, high]", or why no interval is given, or nothing (no resample had a length)."""
    if missing is not None:
        return f" ({missing})"
    return "" if low is None or high is None else f" [{show(low)}, {show(high)}]"


def _unmeasured(share: float) -> str:
    """The draws whose base fell under the floor, left out of the interval, as a count."""
    return f"not measurable in {round(share * RESAMPLES)} of {RESAMPLES} draws"


@dataclass(frozen=True)
class EffectiveLength:
    """One model's scores along the sweep, its base score and its effective length (None: not measurable;
    0: below the first candidate) with an interval (None: none given)."""

    metric: str
    definition: Definition
    lengths: tuple[int, ...]
    scores: tuple[float, ...]
    counts: tuple[int, ...]
    base_lengths: tuple[int, ...]  # the declared base lengths, or the shortest length run where one is missing
    base: float
    base_n: int
    value: int | None
    low: int | None
    high: int | None
    undefined_share: float  # resamples whose base is under the floor, left out of the interval

    @property
    def declared(self) -> bool:
        """Is the base the declared one (the run holds every base length)?"""
        return self.base_lengths == self.definition.base

    @property
    def candidates(self) -> tuple[int, ...]:
        return tuple(n for n in self.lengths if n >= max(self.base_lengths))

    @property
    def smallest_n(self) -> int:
        """The fewest samples behind the base or a candidate length's score."""
        return min([self.base_n] + [n for length, n in zip(self.lengths, self.counts) if length in self.candidates])

    def too_few(self) -> str | None:
        """Why no interval is given (None: one is)."""
        need = self.definition.min_samples
        if need is None:
            return f"no interval at a share of {self.definition.share:.0%}: one failure anywhere decides the length"
        if self.smallest_n < need:
            return f"no interval: {self.smallest_n} sample{'s' * (self.smallest_n != 1)} at a length, {need} needed"
        return None

    def tokens(self, value: int) -> str:
        return tokens_text(value, self.candidates[0])

    def base_text(self) -> str:
        return f"{self.base:.3f} (n = {self.base_n})"

    def text(self) -> str:
        """The effective length with its interval, or why there is none."""
        if self.value is None:
            if self.base < self.definition.floor:
                return f"not measurable: base score {self.base_text()} is under the floor of {self.definition.floor:g}"
            return f"not measurable: base score {self.base_text()}, nothing to keep"
        missing = self.too_few()
        interval = _interval_text(missing, self.low, self.high, self.tokens)
        note = f"; {_unmeasured(self.undefined_share)}" if self.undefined_share > 0 and missing is None else ""
        return f"{self.tokens(self.value)} tokens{interval}{note}"

    def line(self) -> str:
        """The effective length and the base score it was measured against (and where, when the run
        lacks the declared base lengths)."""
        where = "" if self.declared else f" at {self.base_lengths[0]} tokens, the shortest length run, for want " \
            f"of the base lengths {words(self.definition.base)}"
        return self.text() + where if self.value is None else f"{self.text()}; base score {self.base_text()}{where}"


@dataclass(frozen=True)
class PairedEffectiveLength:
    """Both models' effective lengths on their shared samples, a minus b with its paired interval, and
    the paired tests of their base scores and of each length's scores (stats.paired_difference rows)."""

    a: EffectiveLength
    b: EffectiveLength
    diff: int | None
    low: int | None
    high: int | None
    n: int
    undefined_share: float
    base_test: dict[str, Any]
    per_length: tuple[dict[str, Any], ...]  # each with its "length"

    def text(self, negated: bool = False) -> str:
        """a minus b in words, or b minus a when `negated` (the paper report's model minus baseline)."""
        if self.diff is None:
            floor = self.a.definition.floor
            under = min(self.a.base, self.b.base) < floor
            return f"not measurable: a base score is {f'under the floor of {floor:g}' if under else 'zero'}"
        sign = -1 if negated else 1
        diff, low, high = self.diff * sign, self.low, self.high
        if negated and low is not None and high is not None:
            low, high = -high, -low
        missing = self.a.too_few()
        interval = _interval_text(missing, low, high, lambda value: f"{value:+d}")
        below = 0 in (self.a.value, self.b.value, self.a.low, self.b.low)
        notes = [_unmeasured(self.undefined_share)] * (self.undefined_share > 0 and missing is None)
        notes += [f"a length below {self.a.candidates[0]} tokens counts as 0"] * below
        return f"{diff:+d} tokens{interval}" + "".join(f"; {note}" for note in notes)

    def base_difference(self, negated: bool = False) -> str:
        """The difference of the base scores with its interval and its paired test."""
        test = self.base_test
        if math.isnan(test["diff"]):
            return test["test"]
        sign = -1.0 if negated else 1.0
        diff, low, high = test["diff"] * sign, test["low"] * sign, test["high"] * sign
        interval = "" if math.isnan(low) else f" [{min(low, high):+.3f}, {max(low, high):+.3f}]"
        p = "" if math.isnan(test["p_value"]) else f", {test['test']} p = {test['p_value']:.3g}"
        return f"{diff:+.3f}{interval}{p}"

    def bases_differ(self, alpha: float) -> bool | None:
        """Do the base scores differ at `alpha` (None: not testable)?"""
        p = self.base_test["p_value"]
        return None if math.isnan(p) else bool(p < alpha)


def headline_metric(spec: Any) -> str | None:
    """The metric a task's effective length is read on (a `TaskSpec`, or a task class): its primary
    metric, else its first; None when lower is better (a loss has no share of a score to keep)."""
    metric: str = spec.primary_metric or spec.metrics[0]
    return None if metric in spec.lower_is_better else metric


def length_swept(frame: pd.DataFrame, axis: str = LENGTH) -> bool:
    """Does the frame hold samples of two or more lengths?"""
    return axis in frame.columns and frame[axis].dropna().nunique() >= 2


def metric_scores(frame: pd.DataFrame, metric: str) -> np.ndarray:
    """The metric as floats, NaN where there is none; an errored sample scores 0 (`frame.errored_values`:
    the effective length is read on a higher-is-better metric, `headline_metric`)."""
    return errored_values(frame, metric).to_numpy(dtype=float)


def effective_lengths(scores: np.ndarray, base: np.ndarray, lengths: np.ndarray, first: int, share: float,
                      floor: float = 0.0) -> np.ndarray:
    """The effective length of each row of `scores` (rows x lengths, the shortest first) against its `base`:
    the longest length from `first` up whose score keeps `share` x base; 0 where none does, NaN where
    the base is under `floor` or not positive."""
    lengths = np.asarray(lengths)
    candidates = lengths >= first
    keeps = scores[..., candidates] >= share * base[..., None] - 1e-12  # a length equal to the base keeps it
    count = keeps.shape[-1]
    last = np.where(keeps.any(axis=-1), count - 1 - np.argmax(keeps[..., ::-1], axis=-1), -1)
    found = np.concatenate(([0], lengths[candidates]))[last + 1].astype(float)
    return np.where((base > 0) & (base >= floor), found, np.nan)


def _cells(frame: pd.DataFrame, values: np.ndarray, axis: str) -> list[tuple[int, np.ndarray]]:
    """(length, row positions with a value) per length, the shortest first (rows without a length left out)."""
    lengths = pd.to_numeric(frame[axis], errors="coerce").to_numpy(dtype=float)
    has = ~np.isnan(values) & ~np.isnan(lengths)
    return [(int(length), np.flatnonzero((lengths == length) & has)) for length in sorted(set(lengths[has].tolist()))]


def _interval(values: np.ndarray) -> tuple[int | None, int | None, float]:
    """Percentile interval of the defined values (actual values, not interpolated) and the undefined share."""
    defined = values[~np.isnan(values)]
    share = 1.0 - defined.size / values.size if values.size else 1.0
    if defined.size == 0:
        return None, None, share
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(defined, [tail, 1 - tail], method="inverted_cdf")
    return int(low), int(high), share


def base_lengths(lengths: Sequence[int], declared: Definition) -> tuple[int, ...]:
    """The declared base lengths when the run holds them all, else the shortest length it ran."""
    return declared.base if set(declared.base) <= set(lengths) else (min(lengths),)


class _Sweep:
    """The lengths a frame's samples were scored at, and what the definition makes of any scores there."""

    def __init__(self, cells: list[tuple[int, np.ndarray]], declared: Definition):
        self.cells = cells
        self.definition = declared
        self.lengths = np.array([length for length, _ in cells])
        self.counts = np.array([rows.size for _, rows in cells])
        self.base_lengths = base_lengths(self.lengths.tolist(), declared)
        self.in_base = np.isin(self.lengths, self.base_lengths)

    def base(self, scores: np.ndarray) -> np.ndarray:
        """The base score of each row of per-length scores: its base lengths' samples pooled."""
        weights = self.counts[self.in_base]
        return np.asarray((scores[..., self.in_base] * weights).sum(axis=-1) / weights.sum())

    def lengths_of(self, scores: np.ndarray) -> np.ndarray:
        return effective_lengths(scores, self.base(scores), self.lengths, max(self.base_lengths),
                                 self.definition.share, self.definition.floor)

    def measure(self, metric: str, values: np.ndarray, drawn: np.ndarray) -> tuple[EffectiveLength, np.ndarray]:
        """The effective length of one model's `values`, and its value at each row of `drawn` scores."""
        scores = np.array([values[rows].mean() for _, rows in self.cells])
        value = self.lengths_of(scores)
        resampled = self.lengths_of(drawn)
        low, high, share = _interval(resampled)
        found = EffectiveLength(
            metric, self.definition, tuple(int(n) for n in self.lengths), tuple(float(s) for s in scores),
            tuple(int(n) for n in self.counts), self.base_lengths, float(self.base(scores)),
            int(self.counts[self.in_base].sum()), None if math.isnan(value) else int(value), low, high, share)
        if found.too_few() is not None:  # a bootstrap of too few samples has no width to show
            found = replace(found, low=None, high=None)
        return found, resampled


def effective_length(frame: pd.DataFrame, metric: str, declared: Definition | None = None, axis: str = LENGTH,
                     resamples: int = RESAMPLES, seed: int = SEED) -> EffectiveLength | None:
    """One model's effective length over the frame's samples (None: fewer than two lengths scored)."""
    declared = declared or Definition()
    values = metric_scores(frame, metric)
    cells = _cells(frame, values, axis) if axis in frame.columns else []
    if len(cells) < 2:
        return None
    return _Sweep(cells, declared).measure(metric, values, drawn_scores(values, cells, resamples, seed))[0]


def paired_effective_length(frame_a: pd.DataFrame, frame_b: pd.DataFrame, metric: str,
                            declared: Definition | None = None, axis: str = LENGTH, resamples: int = RESAMPLES,
                            seed: int = SEED) -> PairedEffectiveLength | None:
    """Both models' effective lengths over the samples both scored (joined on `id`), a minus b, and the
    paired tests of their bases and of each length."""
    declared = declared or Definition()
    if axis not in frame_a.columns:
        return None
    joined = frame_a[["id", axis]].reset_index(drop=True)
    other = frame_b.drop_duplicates("id").set_index("id").reindex(joined["id"]).reset_index()
    a, b = metric_scores(frame_a.reset_index(drop=True), metric), metric_scores(other, metric)
    shared = np.where(np.isnan(a) | np.isnan(b), np.nan, 0.0)  # a value for both models
    cells = _cells(joined, shared, axis)
    if len(cells) < 2:
        return None
    sweep = _Sweep(cells, declared)
    found_a = sweep.measure(metric, a, drawn_scores(a, cells, resamples, seed))[0]  # as `report` gives them
    found_b = sweep.measure(metric, b, drawn_scores(b, cells, resamples, seed))[0]
    drawn_a, drawn_b = drawn_pairs(a, b, cells, resamples, seed)
    diff = None if found_a.value is None or found_b.value is None else found_a.value - found_b.value
    low, high, share = _interval(sweep.lengths_of(drawn_a) - sweep.lengths_of(drawn_b))
    if found_a.too_few() is not None:
        low = high = None
    base_rows = np.concatenate([rows for length, rows in cells if length in sweep.base_lengths])
    both_pass_fail = pass_fail(a, b)
    per_length = tuple({"length": length, **paired_difference(a[rows], b[rows], both_pass_fail)} for length, rows in cells)
    return PairedEffectiveLength(found_a, found_b, diff, low, high, int(sweep.counts.sum()), share,
                                 paired_difference(a[base_rows], b[base_rows], both_pass_fail), per_length)
