"""Intervals and paired tests. Pure functions on plain numbers; no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (well-behaved at 0 and 1)."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


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
    if n == 1:
        return (mean, math.nan, math.nan)
    half = float(sps.t.ppf(0.975, n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return (mean, mean - half, mean + half)


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Exact (binomial) McNemar test on paired pass/fail outcomes.

    Only discordant pairs carry information: b01 = a failed & b passed,
    b10 = a passed & b failed. Two-sided p-value of b10 ~ Binomial(b01+b10, 1/2).
    """
    a_arr, b_arr = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    assert a_arr.shape == b_arr.shape, "paired outcomes must align"
    only_a = int((a_arr & ~b_arr).sum())
    only_b = int((~a_arr & b_arr).sum())
    discordant = only_a + only_b
    p = 1.0 if discordant == 0 else float(sps.binomtest(only_a, discordant, 0.5).pvalue)
    return {"n": int(a_arr.size), "only_a": only_a, "only_b": only_b, "p_value": min(1.0, p)}


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], resamples: int = 10000, seed: int = 0
) -> dict[str, float]:
    """Mean difference a - b with a 95% percentile interval and a two-sided p-value
    from resampling the paired differences (seeded, so reports are reproducible)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = diff.size
    if n == 0:
        return {"n": 0, "diff": math.nan, "low": math.nan, "high": math.nan, "p_value": math.nan}
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    observed = float(diff.mean())
    # p-value: how often the resampled mean, re-centred on zero, is as extreme as observed
    centred = means - observed
    p = float((np.abs(centred) >= abs(observed)).mean()) if observed != 0 else 1.0
    low, high = np.percentile(means, [2.5, 97.5])
    return {"n": n, "diff": observed, "low": float(low), "high": float(high), "p_value": max(p, 1.0 / resamples)}
