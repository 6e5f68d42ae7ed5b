"""The regression gate's exact test for a row of independent pass/fail pairs.

Each pair of a row is lost (the baseline right, the candidate wrong: a drop of 1), gained
(a drop of -1) or tied (0). Over n independent pairs the counts are trinomial, and the true
drop is P(lost) - P(gained). The gate asks whether it exceeds the tolerance:

    H0: true drop <= tolerance        H1: true drop > tolerance

A t test on such a row has no spread to work with when every pair moved the same way (two
pairs, both lost: p = 0, "certain"). This test is exact at any n:

- outcomes are ordered by the score statistic: the observed drop minus the tolerance over
  its standard error under H0 (the discordance P(lost) + P(gained) estimated by maximum
  likelihood given a true drop equal to the tolerance). At a tolerance of 0 it is McNemar's
  z, (lost - gained) / sqrt(lost + gained);
- the discordance is a nuisance parameter, so the p-value is the largest probability of a
  statistic at least as large over every discordance H0 allows (an exact unconditional
  test). The statistic grows when a tie becomes a loss or a gain a tie, so the largest is on
  the boundary (true drop = tolerance), searched on a grid of discordances dense near its
  smallest value and refined around the three highest grid points;
- the one-sided bounds invert the test (the tolerances it does and does not reject at the
  row's level), and `rejected_limits` gives the outcomes the test rejects at a level, from
  which `power` is the exact probability of a rejection under any alternative.

Two pairs, both lost, give p = 0.25 at a tolerance of 0 (McNemar's exact one-sided p) and
((1 + tolerance) / 2)^2 above it: no row of two pairs can reach 0.05. `smallest_p` is what
a row of n pairs can reach at best.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as sps

BOUND_PRECISION = 1e-4  # the bounds are shown to three decimals
# the discordances searched, as a share of the way from the smallest H0 allows to 1: dense near both
# ends, where the probability of a region changes on a scale of 1 / n
_ENDS = np.geomspace(1e-5, 0.5, 16)
_GRID = np.unique(np.concatenate([[0.0, 1.0], _ENDS, 1.0 - _ENDS, np.linspace(0.0, 1.0, 25)]))
_PEAKS = 3  # grid maxima refined: the largest probability can sit between two grid points
_ZOOMS = 3  # refinements of each: 17 points between its neighbours, then between the best one's


def independent_pass_fail(drop: np.ndarray, clusters: Sequence[Any] | None) -> bool:
    """A row this test applies to: every per-sample drop is -1, 0 or 1 and no two samples share a cluster."""
    values = np.asarray(drop, dtype=float)
    independent = clusters is None or len({str(c) for c in clusters}) == len(clusters)
    return values.size >= 1 and independent and bool(np.isin(values, (-1.0, 0.0, 1.0)).all())


def counts(drop: np.ndarray) -> tuple[int, int, int]:
    """(lost, gained, n) of a row of per-sample drops in {-1, 0, 1}."""
    values = np.asarray(drop, dtype=float)
    return int(np.sum(values == 1.0)), int(np.sum(values == -1.0)), int(values.size)


# ---- the statistic --------------------------------------------------------------------------

def _null_discordance(lost: np.ndarray, gained: np.ndarray, n: int, margin: float) -> np.ndarray:
    """The maximum-likelihood P(lost) + P(gained) given P(lost) - P(gained) = margin: the root of the
    score equation in x = P(gained), a quadratic (mirrored for a negative margin)."""
    if margin < 0:
        return _null_discordance(gained, lost, n, -margin)
    ties = n - lost - gained
    b = lost * (1 - margin) + gained * (1 - 3 * margin) - 2 * ties * margin
    x = (b + np.sqrt(b * b + 8 * n * gained * margin * (1 - margin))) / (4 * n)
    result: np.ndarray = 2 * x + margin
    return result


def statistic(lost: Any, gained: Any, n: int, margin: float) -> np.ndarray:
    """The score statistic of "true drop <= margin" (arrays in, arrays out); 0 where nothing is
    discordant at a margin of 0."""
    lost, gained = np.asarray(lost, dtype=float), np.asarray(gained, dtype=float)
    variance = n * (_null_discordance(lost, gained, n, margin) - margin**2)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (lost - gained - n * margin) / np.sqrt(variance)
    return np.where(variance > 0, z, 0.0)


def _limits(n: int, margin: float, z: float) -> np.ndarray:
    """For each discordant count d = 0..n: the fewest losses among d with a statistic >= z (d + 1
    where none has). The statistic grows with the losses at fixed d, so each is a bisection."""
    discordant = np.arange(n + 1)
    low, high = np.full(n + 1, -1), discordant + 1  # low: below z (or below 0); high: at or above (or past d)
    while np.any(high - low > 1):
        middle = np.clip((low + high) // 2, 0, discordant)
        open_ = high - low > 1
        above = open_ & (statistic(middle, discordant - middle, n, margin) >= z - 1e-12)
        high = np.where(above, middle, high)
        low = np.where(open_ & ~above, middle, low)
    return high


# ---- probabilities ----------------------------------------------------------------------------

def _probability(n: int, limits: np.ndarray, p_lost: Any, p_gained: Any) -> np.ndarray:
    """P(losses >= limits[discordant]) for n pairs with these P(lost), P(gained) (arrays of one shape):
    the discordant count is binomial, and the losses among it binomial again. Counts more than 12
    standard deviations (and 10) from the mean are left out: their probability is below 1e-30."""
    p_lost, p_gained = np.atleast_1d(np.asarray(p_lost, dtype=float)), np.atleast_1d(np.asarray(p_gained, dtype=float))
    q = np.clip(p_lost + p_gained, 0.0, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip(np.where(q > 0, p_lost / np.where(q > 0, q, 1.0), 0.5), 0.0, 1.0)
    spread = 12 * np.sqrt(n * q * (1 - q)) + 10
    first = np.clip(np.floor(n * q - spread), 0, n).astype(int)
    sizes = np.clip(np.ceil(n * q + spread), 0, n).astype(int) - first + 1
    which = np.repeat(np.arange(q.size), sizes)  # one entry per (value, discordant count) kept
    discordant = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes) + first[which]
    terms = sps.binom.pmf(discordant, n, q[which]) * sps.binom.sf(limits[discordant] - 1, discordant, share[which])
    result: np.ndarray = np.bincount(which, weights=terms, minlength=q.size)
    return result


def _on_boundary(n: int, margin: float, limits: np.ndarray, q: Any) -> np.ndarray:
    """The probability of the region under H0's boundary (true drop = margin) at discordance q."""
    q = np.atleast_1d(np.asarray(q, dtype=float))
    return _probability(n, limits, (q + margin) / 2, (q - margin) / 2)


def _largest(n: int, margin: float, limits: np.ndarray) -> float:
    """The largest probability of the region over every discordance H0 allows (|margin| to 1): the
    grid's, then around its highest local maxima, zoomed in (each step one vectorised evaluation)."""
    grid = abs(margin) + (1 - abs(margin)) * _GRID
    values = _on_boundary(n, margin, limits, grid)
    inner = np.flatnonzero((values[1:-1] >= values[:-2]) & (values[1:-1] >= values[2:])) + 1
    peaks = sorted({0, grid.size - 1, *inner.tolist()}, key=lambda i: -values[i])[:_PEAKS]
    best = float(values.max())
    spans = np.array([(grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]) for i in peaks])
    for _ in range(_ZOOMS):
        points = spans[:, :1] + (spans[:, 1:] - spans[:, :1]) * np.linspace(0.0, 1.0, 17)
        found = _on_boundary(n, margin, limits, points.ravel()).reshape(points.shape)
        best = max(best, float(found.max()))
        top = found.argmax(axis=1)
        step = (spans[:, 1] - spans[:, 0]) / 16
        centre = points[np.arange(len(peaks)), top]
        spans = np.stack([np.maximum(centre - step, spans[:, 0]), np.minimum(centre + step, spans[:, 1])], axis=1)
    return min(1.0, best)


def _p_at(n: int, margin: float, z: float) -> float:
    """The p-value of an outcome whose statistic is z: the largest probability, under H0, of one as large."""
    return _largest(n, margin, _limits(n, margin, z))


# ---- the test ---------------------------------------------------------------------------------

def p_exceeds(lost: int, gained: int, n: int, margin: float) -> float:
    """p of "true drop <= margin" (small: the drop exceeds it) for `lost` and `gained` of n pairs."""
    if margin >= 1:
        return 1.0  # no drop exceeds 1
    if margin <= -1:
        return 1.0 if gained == n else 0.0  # a drop of -1 gains every pair
    return _p_at(n, margin, float(statistic(lost, gained, n, margin)))


def p_within(lost: int, gained: int, n: int, margin: float) -> float:
    """p of "true drop >= margin" (small: the drop is within it): the mirror of `p_exceeds`."""
    return p_exceeds(gained, lost, n, -margin)


@lru_cache(maxsize=4096)
def smallest_p(n: int, margin: float, within: bool = False) -> float:
    """The smallest p-value a row of n pairs can give: every pair lost (gained, for `within`)."""
    return p_within(0, n, n, margin) if within else p_exceeds(n, 0, n, margin)


def _normal_bound(lost: int, gained: int, n: int, level: float) -> float:
    """The lower bound the normal approximation to the statistic gives: where it equals the normal
    (1 - level) quantile (the statistic falls as the margin grows). A first guess for `_lower`."""
    ends = (-1 + 1e-9, 1 - 1e-9)
    z = float(sps.norm.isf(level))
    values = [float(statistic(lost, gained, n, m)) - z for m in ends]
    if values[0] <= 0 or values[1] >= 0:
        return ends[0] if values[0] <= 0 else ends[1]
    return float(optimize.brentq(lambda m: float(statistic(lost, gained, n, m)) - z, *ends, xtol=1e-6))


def _crossing(rejects: Any, rejected: float, kept: float, guess: float) -> float:
    """The margin between one the test rejects and one it keeps, to `BOUND_PRECISION` (the kept end):
    the bracket is first narrowed around `guess`, in steps that double, then bisected."""
    toward = 1.0 if kept > rejected else -1.0
    if (guess - rejected) * toward > 0 and (kept - guess) * toward > 0:
        step = 4 * BOUND_PRECISION * toward
        if rejects(guess):
            rejected, probe = guess, guess + step
            while (kept - probe) * toward > 0 and rejects(probe):
                rejected, probe, step = probe, probe + 2 * step, 2 * step
            kept = probe if (kept - probe) * toward > 0 else kept
        else:
            kept, probe = guess, guess - step
            while (probe - rejected) * toward > 0 and not rejects(probe):
                kept, probe, step = probe, probe - 2 * step, 2 * step
            rejected = probe if (probe - rejected) * toward > 0 else rejected
    while abs(kept - rejected) > BOUND_PRECISION:
        middle = (rejected + kept) / 2
        rejected, kept = (middle, kept) if rejects(middle) else (rejected, middle)
    return kept


def _lower(lost: int, gained: int, n: int, margin: float, level: float) -> float:
    """The lower one-sided (1 - level) bound: where p_exceeds crosses `level`, searched on the side of
    `margin` that the test there says (so it lies above `margin` exactly when p_exceeds < level there)."""
    def rejects(m: float) -> bool:
        return p_exceeds(lost, gained, n, m) < level

    at, guess = min(max(margin, -1.0), 1.0), _normal_bound(lost, gained, n, level)
    return _crossing(rejects, at, 1.0, guess) if rejects(at) else _crossing(rejects, -1.0, at, guess)


def bounds(lost: int, gained: int, n: int, margin: float, level: float) -> tuple[float, float]:
    """(lower, upper) one-sided (1 - level) confidence bounds of the true drop, by inverting the test:
    the lower bound lies above `margin` exactly when p_exceeds < level there, and the upper (the
    mirror's lower bound: lost and gained swapped) below it exactly when p_within < level."""
    return _lower(lost, gained, n, margin, level), -_lower(gained, lost, n, -margin, level)


# ---- power --------------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def rejected_limits(n: int, margin: float, level: float) -> tuple[int, ...]:
    """The outcomes `p_exceeds` rejects at `level`, as the fewest losses per discordant count
    (`_limits`). p falls as the statistic grows, so the region is every statistic at or above the
    smallest one whose p is below `level`: bracketed from the normal quantile, bisected until few
    outcomes lie between, then found among those. Empty (every limit past its count) when not
    even every pair lost is rejected."""
    if smallest_p(n, margin) >= level:
        return tuple(range(1, n + 2))
    top = float(statistic(n, 0, n, margin))
    high = min(float(sps.norm.isf(level)), top)
    low = high - 0.5
    while _p_at(n, margin, high) >= level:  # high is rejected, low kept
        low, high = high, min(top, high + 1.0)
    while _p_at(n, margin, low) < level:
        low, high = low - 1.0, low
    kept, rejected = _limits(n, margin, low), _limits(n, margin, high)
    while np.sum(kept - rejected) > 32:
        middle = (low + high) / 2
        limits = _limits(n, margin, middle)
        if _largest(n, margin, limits) < level:
            high, rejected = middle, limits
        else:
            low, kept = middle, limits
    discordant = np.repeat(np.arange(n + 1), rejected - kept)
    lost = np.concatenate([np.arange(k, r) for k, r in zip(kept, rejected)]).astype(int)
    candidates = np.unique(statistic(lost, discordant - lost, n, margin))  # those between, ascending
    first, last = 0, candidates.size  # the answer's index: candidates[last:] are rejected
    while first < last:
        middle = (first + last) // 2
        limits = _limits(n, margin, float(candidates[middle]))
        if _largest(n, margin, limits) < level:
            last, rejected = middle, limits
        else:
            first = middle + 1
    return tuple(int(v) for v in rejected)


def power(n: int, margin: float, level: float, p_lost: float, p_gained: float) -> float:
    """The probability that the test rejects at `level` when pairs are lost with probability p_lost
    and gained with p_gained."""
    limits = np.asarray(rejected_limits(n, margin, level))
    return float(_probability(n, limits, p_lost, p_gained)[0])

