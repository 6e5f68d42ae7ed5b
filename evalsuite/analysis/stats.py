"""Intervals and paired tests, from scipy. Pure functions on plain numbers; no torch.

One implementation of each thing, used by every report, `compare` and `check`:

- `wilson_interval` / `mean_interval`: a rate's 95% interval (Wilson for pass/fail,
  Student t otherwise);
- `mean_band`: a mean and its 95% bootstrap interval at many points at once (a curve's band);
- `paired_difference`: the mean difference of paired outcomes a - b with a 95%
  bootstrap interval and a two-sided p-value (exact McNemar for independent
  pass/fail pairs, a sign-flip permutation test otherwise), resampling whole
  clusters when samples share a source item;
- `drop_bound_test` / `bound_test`: the regression gate's one-sided test of "the
  drop exceeds the tolerance" for clustered or fractional rows, with a cluster-robust
  standard error and p no smaller than 2^-k on k clusters (`bound_test` takes many runs
  at once, for the calibration by simulation); rows of independent pass/fail pairs are
  tested exactly (`exact.py`);
- `holm_steps`: Holm's step-down adjustment for several rows gated at once, and
  the level each row was tested at (its bounds and `detectable_drop` use it);
- `not_testable`: the label of a statistic asked of fewer than two paired samples
  (or clusters), or of a gated row too small to reach its level, shown instead of a test;
- `cochran_q`: "does the order of the demonstrations matter?" on the same
  questions answered under k orders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

RESAMPLES = 9_999
SEED = 0  # every resampling is seeded: the same records give the same report


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (well-behaved at 0 and 1)."""
    if n == 0:
        return (math.nan, math.nan)
    ci = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): Wilson for 0/1 outcomes, Student t otherwise."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(arr.mean())
    if np.isin(arr, (0.0, 1.0)).all():
        low, high = wilson_interval(int(arr.sum()), n)
        return (mean, low, high)
    if n == 1 or float(arr.std()) == 0.0:
        return (mean, mean if n > 1 else math.nan, mean if n > 1 else math.nan)
    low, high = sps.ttest_1samp(arr, 0.0).confidence_interval(0.95)
    return (mean, float(low), float(high))


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool], alternative: str = "two-sided") -> dict[str, float]:
    """Exact (binomial) McNemar test on paired pass/fail outcomes: only discordant pairs
    carry information; under the null, 'only a passed' ~ Binomial(discordant, 1/2)."""
    a_arr, b_arr = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    assert a_arr.shape == b_arr.shape, "paired outcomes must align"
    only_a = int((a_arr & ~b_arr).sum())
    only_b = int((~a_arr & b_arr).sum())
    discordant = only_a + only_b
    p = 1.0 if discordant == 0 else float(sps.binomtest(only_a, discordant, 0.5, alternative=alternative).pvalue)
    return {"n": int(a_arr.size), "only_a": only_a, "only_b": only_b, "p_value": min(1.0, p)}


# ---- clusters ---------------------------------------------------------------------------------

def cluster_totals(diff: np.ndarray, clusters: Sequence[Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster: the sum of the differences and the number of samples. Without cluster ids
    every sample is its own cluster."""
    if clusters is None:
        return diff, np.ones_like(diff)
    _, index = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    sums = np.bincount(index, weights=diff)
    counts = np.bincount(index).astype(float)
    return sums, counts


def _ratio(sums: np.ndarray, counts: np.ndarray, axis: int = -1) -> np.ndarray:
    ratio: np.ndarray = np.sum(sums, axis=axis) / np.sum(counts, axis=axis)
    return ratio


# ---- comparing two models on the same samples ----------------------------------------------------

def paired_difference(a: np.ndarray, b: np.ndarray, pass_fail: bool, clusters: Sequence[Any] | None = None,
                      resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """Mean of a - b over paired samples, its 95% bootstrap interval (clusters resampled whole),
    and a two-sided p-value: exact McNemar for independent pass/fail pairs, else a sign-flip
    permutation test on the cluster totals."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = int(a.size)
    out: dict[str, Any] = {"n": n}
    if n == 0:
        return {**out, "test": not_testable(0, 0), "mean_a": math.nan, "mean_b": math.nan, "diff": math.nan,
                "low": math.nan, "high": math.nan, "p_value": math.nan, "clusters": 0}
    sums, counts = cluster_totals(a - b, clusters)
    clustered = bool(counts.max() > 1)
    observed = float(sums.sum() / counts.sum())
    out.update(mean_a=float(a.mean()), mean_b=float(b.mean()), diff=observed, clusters=int(sums.size))
    if sums.size < 2:  # no spread to compare the difference with: a number, not a test
        return {**out, "test": not_testable(n, int(sums.size)), "low": math.nan, "high": math.nan,
                "p_value": math.nan}
    low, high = _bootstrap_interval(sums, counts, resamples, seed)
    out.update(low=low, high=high)
    if pass_fail and not clustered:
        test = mcnemar_exact(a.astype(bool).tolist(), b.astype(bool).tolist())
        out.update(test="McNemar", a_only=test["only_a"], b_only=test["only_b"], p_value=test["p_value"])
    else:
        out.update(test="permutation" + (" (clustered)" if clustered else ""),
                   p_value=_sign_flip_p(sums, resamples, seed))
    return out


def _bootstrap_interval(sums: np.ndarray, counts: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    if sums.size < 2 or np.all(sums / counts == sums[0] / counts[0]):
        value = float(sums.sum() / counts.sum())
        return (value, value) if sums.size >= 2 else (math.nan, math.nan)
    result = sps.bootstrap((sums, counts), _ratio, paired=True, vectorized=True, n_resamples=resamples,
                           method="percentile", random_state=np.random.default_rng(seed))
    return (float(result.confidence_interval.low), float(result.confidence_interval.high))


def _sign_flip_p(sums: np.ndarray, resamples: int, seed: int) -> float:
    if not np.any(sums):
        return 1.0
    result = sps.permutation_test((sums,), lambda x, axis=-1: np.sum(x, axis=axis), permutation_type="samples",
                                  vectorized=True, n_resamples=resamples, alternative="two-sided",
                                  random_state=np.random.default_rng(seed))
    return float(min(1.0, result.pvalue))


def mean_band(values: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[np.ndarray, ...]:
    """(mean, low, high) per column of a (samples x points) array: the mean over samples and its
    95% percentile bootstrap interval, each resample drawing whole rows (one set of samples for
    every point). Rows of paired differences a - b give the paired bootstrap band."""
    x = np.asarray(values, dtype=float)
    mean = x.mean(axis=0)
    if x.shape[0] < 2 or np.all(x == x[0]):
        spread = np.full(mean.shape, np.nan) if x.shape[0] < 2 else mean
        return mean, spread, spread
    batch = max(1, (1 << 22) // x.size)  # resamples drawn at once: a few tens of MB, whatever the shape
    result = sps.bootstrap((x,), np.mean, axis=0, vectorized=True, n_resamples=resamples, batch=batch,
                           method="percentile", random_state=np.random.default_rng(seed))
    return mean, np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)


# ---- the regression gate ------------------------------------------------------------------------

def not_testable(n: int, clusters: int, smallest_p: float | None = None) -> str:
    """What a table shows where a test cannot reject: fewer than two paired samples (or clusters), or
    (given the smallest p-value the row's n can reach) too few to reach the level."""
    if n < 2 or clusters < 2 or smallest_p is None:
        where = f"n = {n}" if n < 2 or clusters == n else f"n = {n} in {clusters} cluster{'s' if clusters != 1 else ''}"
        return f"not testable ({where})"
    where = f"n = {n}" if clusters == n else f"n = {n} in {clusters} clusters"
    return f"not testable ({where}: p >= {smallest_p:.2g} at best)"


def bound_test(sums: np.ndarray, counts: np.ndarray, tolerance: float | np.ndarray) -> dict[str, np.ndarray]:
    """`drop_bound_test` on cluster totals, over the last axis: `sums` and `counts` of shape
    (..., clusters), one test per leading index (the simulation tests thousands of runs at once).
    Fewer than two clusters: NaN."""
    sums, counts = np.asarray(sums, dtype=float), np.asarray(counts, dtype=float)
    k = sums.shape[-1]
    total = counts.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums.sum(axis=-1) / total
        residual = sums - mean[..., None] * counts
        se = np.sqrt(k / (k - 1) * np.sum(residual**2, axis=-1)) / total if k >= 2 else np.full(mean.shape, np.nan)
        t = (mean - tolerance) / se
    # every cluster moved by exactly the same amount: no spread to scale by, so the drop's side of the
    # tolerance decides, and the floor keeps that from reading as certainty on few clusters
    flat = se == 0.0
    floor = smallest_cluster_p(k)
    p_exceeds = np.maximum(floor, np.where(flat, 1.0 - (mean > tolerance), sps.t.sf(t, max(k - 1, 1))))
    p_within = np.maximum(floor, np.where(flat, 1.0 - (mean < tolerance), sps.t.cdf(t, max(k - 1, 1))))
    nan = np.isnan(se)
    return {"drop": mean, "se": se, "df": np.full(mean.shape, max(k - 1, 0)),
            "p_exceeds": np.where(nan, np.nan, p_exceeds), "p_within": np.where(nan, np.nan, p_within),
            "clusters": np.full(mean.shape, k), "smallest_p": np.full(mean.shape, floor)}


def smallest_cluster_p(clusters: int) -> float:
    """The smallest p-value the t test of the gate gives on k clusters: 2^-k, the smallest a sign-flip
    test of k clusters can give (every cluster past the tolerance, one way of 2^k). Student's t on
    bounded scores claims more than k clusters hold, and none at all where they have no spread."""
    return 0.5 ** clusters


def drop_bound_test(drop: np.ndarray, clusters: Sequence[Any] | None, tolerance: float) -> dict[str, Any]:
    """The per-sample drop (baseline minus candidate, in the metric's good direction) against
    the tolerance, with a cluster-robust standard error and Student's t on (clusters - 1)
    degrees of freedom, p no smaller than `smallest_cluster_p`:

        p_exceeds  = P(a drop this large | true drop = tolerance)   (small: the drop exceeds it)
        p_within   = P(a drop this small | true drop = tolerance)   (small: it is within it)

    and `se` for the bounds and the power line (`detectable_drop`). Fewer than two clusters:
    NaN p-values (`not_testable`)."""
    sums, counts = cluster_totals(np.asarray(drop, dtype=float), clusters)
    result = bound_test(sums, counts, tolerance)
    return {key: int(value) if key in ("df", "clusters") else float(value) for key, value in result.items()}


def one_sided_bounds(result: dict[str, Any], level: float) -> tuple[float, float]:
    """(lower, upper) one-sided (1 - level) confidence bounds of the drop; `level` is the level the
    row was tested at (Holm's, for a gated row). Unbounded where no outcome of the row's clusters
    reaches the level (the test rejects no tolerance there)."""
    if not result["df"] or math.isnan(result["se"]):
        return (math.nan, math.nan)
    if result["smallest_p"] >= level:
        return (-math.inf, math.inf)
    q = float(sps.t.ppf(1 - level, result["df"]))
    return (result["drop"] - q * result["se"], result["drop"] + q * result["se"])


def detectable_drop(result: dict[str, Any], tolerance: float | np.ndarray, level: float | np.ndarray,
                    power: float = 0.8) -> Any:
    """The true drop that a one-sided test at `level` catches with probability `power` at this n and
    spread: tolerance + (t(1 - level) + t(power)) x SE; infinite where the row's clusters cannot reach
    the level at all. Arrays in, arrays out (NaN below two clusters)."""
    df = np.asarray(result["df"], dtype=float)
    with np.errstate(invalid="ignore"):
        quantiles = sps.t.ppf(1 - np.asarray(level), np.where(df > 0, df, np.nan)) + sps.t.ppf(power, np.where(
            df > 0, df, np.nan))
    value = tolerance + quantiles * np.asarray(result["se"], dtype=float)
    unreachable = np.asarray(result.get("smallest_p", 0.0)) >= np.asarray(level)
    value = np.where(unreachable & ~np.isnan(value), np.inf, value)
    return float(value) if np.ndim(value) == 0 else value


def holm_steps(p_values: Any, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down procedure over the last axis: (adjusted p-values, the level each
    hypothesis was tested at). NaN is not a test and stays NaN.

    Sorted ascending, the r-th p-value (r = 0, 1, ...) of m is tested at alpha / (m - r) until
    the first one that is not rejected; the procedure stops there, and the rest are held to
    that same level (never rejected, their p-values being larger). So a row's one-sided bound
    at its level lies beyond the tolerance exactly when the row is rejected."""
    p = np.asarray(p_values, dtype=float)
    valid = ~np.isnan(p)
    m = valid.sum(axis=-1, keepdims=True)
    order = np.argsort(np.where(valid, p, np.inf), axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1)  # NaN last
    rank = np.arange(p.shape[-1])
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - rank) * ranked), axis=-1)
    stop = np.sum(adjusted < alpha, axis=-1, keepdims=True)  # the rejections are a prefix
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = np.where(np.isnan(ranked), np.nan, alpha / (m - np.minimum(rank, stop)))
    out_p, out_level = np.empty_like(p), np.empty_like(p)
    np.put_along_axis(out_p, order, adjusted, axis=-1)
    np.put_along_axis(out_level, order, levels, axis=-1)
    return out_p, out_level


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count as a test)."""
    values: list[float] = holm_steps(p_values, 0.05)[0].tolist()
    return values


# ---- order robustness -------------------------------------------------------------------------

def cochran_q(outcomes: np.ndarray) -> dict[str, float]:
    """Cochran's Q on a (questions x orders) matrix of 0/1 outcomes: under the null that the
    order does not matter, Q ~ chi2(orders - 1). Questions answered the same way under every
    order carry no information and drop out."""
    x = np.asarray(outcomes, dtype=float)
    x = x[~np.isnan(x).any(axis=1)]
    n, k = x.shape if x.ndim == 2 else (0, 0)
    if n == 0 or k < 2:
        return {"q": math.nan, "df": max(0, k - 1), "p_value": math.nan}
    columns, rows = x.sum(axis=0), x.sum(axis=1)
    total = rows.sum()
    denominator = k * total - float(np.sum(rows**2))
    if denominator == 0:
        return {"q": 0.0, "df": k - 1, "p_value": 1.0}
    q = (k - 1) * (k * float(np.sum(columns**2)) - total**2) / denominator
    return {"q": float(q), "df": k - 1, "p_value": float(sps.chi2.sf(q, k - 1))}
