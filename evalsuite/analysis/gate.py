"""The regression gate's statistics: each run pair's paired drops, and the verdict on each row.

The candidate (a run folder or a suite result) and the baseline (a run folder,
a suite result or an exported baseline file) are matched run by run on their
task configuration (`outcomes.py`), and each run's samples are paired on
sample id. A row is one metric over one set of samples:

    drop = mean(baseline) - mean(candidate)     over the row's paired samples
           (candidate - baseline for metrics the task marks lower_is_better)

The gate tests "the drop exceeds the tolerance". A row of independent pass/fail pairs
(every per-sample drop -1, 0 or 1, no shared cluster) is tested exactly (`exact.py`:
exact at any n, so two pairs that both went wrong give p >= 0.26, never the t test's
p = 0 from no spread); other rows (clustered, fractional) by `stats.drop_bound_test` (a
cluster-robust standard error, samples that share the task's cluster key counted as one
unit, Student's t, and p no smaller than 2^-k on k clusters). A row whose n cannot reach
alpha at all (its smallest possible p is alpha or more: two pairs, four clusters) is "not
testable" and left out of Holm, a choice made on n alone. The task's primary metric (and
its side scores, such as judged accuracy) is gated over all samples and in every cell of
the task's gating axes (needle: length x depth), because a long-context regression lives
in one length or one depth and drowns in the pooled mean; `--metric` gates more metrics
the same way, and the others are reported, not gated. Every testable gated row of the
check, over all run pairs, is one Holm family: a row fails when Holm's step-down procedure
rejects "true drop <= tolerance" for it, so a true drop exactly at the tolerance in every
cell fails the check at most alpha of the time. Each row's one-sided bounds (the exact
test inverted, or Student's t) and `detects` (the true drop caught with 80% power, under
the alternative it names: `power.py`) are at the level Holm tested that row at, so a
bound past the tolerance never stands beside "within noise". With
`require_non_inferiority` the gate is reversed for release gates: it passes only when
every gated row's upper bound shows the drop within its tolerance (each row at alpha: an
intersection-union test needs no adjustment; a row too small to show it fails).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evalsuite.errors import UserError

from .compare import paired_values
from .exact import bounds as exact_bounds
from .exact import counts, independent_pass_fail, p_exceeds, p_within, smallest_p
from .outcomes import ALL, Outcomes
from .power import ALTERNATIVES, PERSIST, TURN, exact_detects
from .stats import detectable_drop, drop_bound_test, holm_steps, not_testable, one_sided_bounds
from .tolerances import DEFAULT_MAX_DROP, Tolerances

# ---- the paired drops of a run pair -------------------------------------------------------------

@dataclass(frozen=True)
class Measured:
    """One row (a metric over all samples or over one cell) of one run pair, before Holm."""

    name: str
    metric: str
    n: int
    baseline: float
    candidate: float
    drop: np.ndarray  # per sample, in the metric's good direction
    clusters: list[Any] | None
    cell: str = ALL
    max_drop: float = DEFAULT_MAX_DROP
    gated: bool = True


def _goodness(values: np.ndarray, pass_fail: bool, lower_is_better: bool) -> np.ndarray:
    if not lower_is_better:
        return values
    return 1.0 - values if pass_fail else -values


def _paired_frames(cand: Outcomes, base: Outcomes) -> tuple[Any, Any]:
    """Both runs' frames on their shared ids, in the candidate's (plan) order, with the candidate's
    cells and whichever run's clusters are known."""
    frame_c, frame_b = cand.frame(), base.frame()
    shared = set(frame_b["id"])
    common = [i for i in frame_c["id"] if i in shared]
    if not common:
        raise UserError(f"candidate run {cand.name} and baseline run {base.name} share no sample ids")
    frame_c = frame_c.set_index("id").loc[common].reset_index()
    frame_b = frame_b.set_index("id").loc[common].reset_index()
    if cand.cells is not None or base.cells is None:
        frame_b["cell"] = frame_c["cell"].to_numpy()
    if base.clusters is None and cand.clusters is not None:
        frame_b["cluster"] = frame_c["cluster"].to_numpy()
    return frame_c, frame_b


def wanted_metrics(cand: Outcomes, base: Outcomes, extra: Sequence[str] = ()) -> list[str]:
    """What the gate tests on this pair: the task's default (primary and side scores; every metric of
    either run for a task whose module is not installed) and those asked for that either run has.
    Each must be in both runs (`check` refuses a pair where one lacks it: never a pass on nothing)."""
    default = cand.gated if cand.gated is not None else base.gated
    either = list(dict.fromkeys([*cand.scores, *base.scores]))
    chosen = set(either if default is None else default) | {m for m in extra if m in either}
    return [m for m in dict.fromkeys([*(default or ()), *either]) if m in chosen]


def gated_metrics(cand: Outcomes, base: Outcomes, extra: Sequence[str] = ()) -> list[str]:
    """The wanted metrics that both runs have, in the candidate's (the task's) order."""
    wanted = set(wanted_metrics(cand, base, extra))
    return [m for m in cand.scores if m in base.scores and m in wanted]


def measure_pair(cand: Outcomes, base: Outcomes, tolerance: Callable[[str], float] = lambda metric: DEFAULT_MAX_DROP,
                 metrics: Sequence[str] = ()) -> list[Measured]:
    """Every shared metric's paired drop over all samples; a gated metric's (`gated_metrics`) also
    per cell, each with its `tolerance(metric)`. A sample that failed with an error counts as a fail."""
    refuse_broken_rates(cand, base)
    frame_c, frame_b = _paired_frames(cand, base)
    gated = gated_metrics(cand, base, metrics)
    labels = list(dict.fromkeys(frame_b["cell"]))  # first appearance: the plan's order
    rows = []
    for metric in [m for m in cand.scores if m in base.scores]:
        b_values, c_values, pass_fail, clusters = paired_values(frame_b, frame_c, metric, "cluster")
        cells = np.asarray(paired_values(frame_b, frame_c, metric, "cell")[3] or [], dtype=object)
        lower = metric in base.lower_is_better or metric in cand.lower_is_better
        drop = _goodness(b_values, pass_fail, lower) - _goodness(c_values, pass_fail, lower)
        subsets = [(ALL, np.ones(drop.size, dtype=bool))]
        if metric in gated and len(labels) > 1:
            subsets += [(label, cells == label) for label in labels]
        for label, keep in subsets:
            rows.append(Measured(
                name=cand.name, metric=metric, n=int(keep.sum()),
                baseline=float(np.mean(b_values[keep])) if keep.any() else math.nan,
                candidate=float(np.mean(c_values[keep])) if keep.any() else math.nan,
                drop=drop[keep], clusters=[c for c, k in zip(clusters, keep) if k] if clusters is not None else None,
                cell=label, max_drop=tolerance(metric), gated=metric in gated))
    return rows


def refuse_broken_rates(cand: Outcomes, base: Outcomes) -> None:
    """A metric that is pass/fail in one run (every value 0 or 1) cannot hold a value outside 0..1
    in the other: that run's records are damaged, and gating them would call damage a regression."""
    def numbers(run: Outcomes, metric: str) -> list[tuple[str, float]]:  # a baseline file may hold anything
        return [(i, v) for i, v in zip(run.ids, run.scores[metric]) if isinstance(v, (int, float))]

    for metric in [m for m in cand.scores if m in base.scores]:
        for run, other in ((cand, base), (base, cand)):
            values = [v for _, v in numbers(other, metric)]
            if not values or any(v not in (0, 1) for v in values):
                continue
            bad = next(((i, v) for i, v in numbers(run, metric) if not 0 <= v <= 1), None)
            if bad is not None:
                raise UserError(f"{run.name}: {metric} is {bad[1]} in sample {bad[0]}, outside 0..1 where "
                                f"{other.name} holds pass/fail values: its records are damaged; rerun it")


# ---- the decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MetricCheck:
    name: str  # the run's (suite entry) name
    metric: str
    n: int
    clusters: int
    baseline: float
    candidate: float
    drop: float
    low: float  # one-sided (1 - level) lower bound of the drop
    high: float  # one-sided (1 - level) upper bound
    p_value: float  # Holm-adjusted p of the mode's null (raw for a row not gated); NaN: not testable
    detects_persist: float  # the true drop caught with 80% power at this n and level if ordinary disagreements persist
    detects_turn: float  # the same if disagreements turn against the candidate (NaN: not a pass/fail row)
    failed: bool
    verdict: str
    cell: str = ALL
    max_drop: float = DEFAULT_MAX_DROP
    level: float = math.nan  # the level the row was tested at (Holm's step), alpha for a row not gated
    gated: bool = True
    alternative: str = PERSIST  # the alternative `detectable` (and the table) shows (power.ALTERNATIVES)
    exact: bool = False  # tested exactly (independent pass/fail pairs), else by the cluster-robust t test

    @property
    def detectable(self) -> float:
        """`detects` under the chosen alternative."""
        return self.detects_persist if self.alternative == PERSIST else self.detects_turn


def row_test(m: Measured) -> dict[str, Any]:
    """A row's tests of "the drop exceeds the tolerance" (`p_exceeds`) and of "it is within it"
    (`p_within`), and the smallest p of each its n can reach (`smallest`, by mode): exact for
    independent pass/fail pairs (`exact.py`), the cluster-robust t test otherwise."""
    if m.n and independent_pass_fail(m.drop, m.clusters):
        lost, gained, n = counts(m.drop)
        return {"exact": True, "drop": float(np.mean(m.drop)), "clusters": n, "lost": lost, "gained": gained,
                "p_exceeds": p_exceeds(lost, gained, n, m.max_drop), "p_within": p_within(lost, gained, n, m.max_drop),
                "smallest": {False: smallest_p(n, m.max_drop), True: smallest_p(n, m.max_drop, within=True)}}
    test = drop_bound_test(m.drop, m.clusters, m.max_drop)
    return {**test, "exact": False, "smallest": {False: test["smallest_p"], True: test["smallest_p"]}}


def testable(test: dict[str, Any], alpha: float, non_inferiority: bool) -> bool:
    """Whether the row's n can reach alpha at all: a row that cannot is shown as not testable and
    left out of Holm (a choice made on n alone, before any outcome, so the family keeps its level)."""
    return test["clusters"] >= 2 and test["smallest"][non_inferiority] < alpha


def _levels(tests: Sequence[dict[str, Any]], measured: Sequence[Measured], alpha: float, non_inferiority: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """(p, level) per row: Holm over the gated testable rows; a release gate and rows not gated at
    alpha, unadjusted; NaN for a row that is not testable."""
    key = "p_within" if non_inferiority else "p_exceeds"
    raw = np.array([t[key] if testable(t, alpha, non_inferiority) else math.nan for t in tests], dtype=float)
    family = np.array([m.gated and not non_inferiority for m in measured], dtype=bool)
    p, level = raw.copy(), np.where(np.isnan(raw), np.nan, alpha)
    if family.any():
        p[family], level[family] = holm_steps(raw[family], alpha)
    return p, level


def decide(measured: Sequence[Measured], alpha: float, non_inferiority: bool = False,
           alternative: str = PERSIST) -> list[MetricCheck]:
    """Each row's verdict: the gated rows of one check are one Holm family."""
    if alternative not in ALTERNATIVES:
        raise UserError(f"detects: unknown alternative {alternative!r}; one of {', '.join(ALTERNATIVES)}")
    tests = [row_test(m) for m in measured]
    p_values, levels = _levels(tests, measured, alpha, non_inferiority)
    checks = []
    for m, t, p, level in zip(measured, tests, p_values, levels):
        tested = not math.isnan(p)
        low, high = _bounds(m, t, level) if tested else (math.nan, math.nan)
        significant = tested and bool(p < alpha)
        failed = m.gated and ((not significant) if non_inferiority else significant)
        if not m.gated:  # reported rows show no `detects`
            persist, turn = math.nan, math.nan
        else:
            persist, turn = _detectable(m, t, level) if tested else (math.inf, math.inf if t["exact"] else math.nan)
        checks.append(MetricCheck(
            name=m.name, metric=m.metric, n=m.n, clusters=t["clusters"], baseline=m.baseline, candidate=m.candidate,
            drop=t["drop"], low=low, high=high, p_value=float(p), detects_persist=persist, detects_turn=turn,
            failed=failed, verdict=_verdict(m, t, tested, failed, non_inferiority), cell=m.cell,
            max_drop=m.max_drop, level=float(level), gated=m.gated, alternative=alternative, exact=t["exact"]))
    return checks


def _bounds(m: Measured, test: dict[str, Any], level: float) -> tuple[float, float]:
    if test["exact"]:
        return exact_bounds(test["lost"], test["gained"], test["clusters"], m.max_drop, level)
    return one_sided_bounds(test, level)


def _detectable(m: Measured, test: dict[str, Any], level: float) -> tuple[float, float]:
    """(`detects` if ordinary disagreements persist, if they turn against the candidate): exact for
    independent pass/fail pairs; the closed form (the observed spread persisting) otherwise."""
    if test["exact"]:
        row = (test["clusters"], test["lost"] + test["gained"], m.max_drop, float(level))
        return exact_detects(*row, PERSIST), exact_detects(*row, TURN)
    return float(detectable_drop(test, m.max_drop, level)), math.nan


def _verdict(m: Measured, test: dict[str, Any], tested: bool, failed: bool, non_inferiority: bool) -> str:
    if not tested:
        enough = test["clusters"] >= 2 and m.n >= 2
        return not_testable(m.n, test["clusters"], test["smallest"][non_inferiority] if enough else None)
    if not m.gated:
        return "not gated"
    if non_inferiority:
        return "NOT SHOWN WITHIN TOLERANCE" if failed else "within tolerance"
    if failed:
        return "REGRESSION"
    return "drop within noise" if test["drop"] > m.max_drop else "ok"


def check_pair(cand: Outcomes, base: Outcomes, max_drop: float = DEFAULT_MAX_DROP, alpha: float = 0.05,
               non_inferiority: bool = False, metrics: Sequence[str] = ()) -> list[MetricCheck]:
    """One run pair's rows, Holm-adjusted among themselves (`check` adjusts over all pairs)."""
    return decide(measure_pair(cand, base, Tolerances(max_drop).of, metrics), alpha, non_inferiority)
