"""`detects` of a pass/fail row by simulation: the true drop the gate catches with 80% power.

The closed form tolerance + (t(1 - level) + t(power)) x SE assumes the drop's
t statistic is close to Student's t, which fails in small cells with few
discordant pairs: at 50 pairs and 10% discordant, a passing row showed 0.18,
a drop caught 54% of the time. For a row of independent pass/fail pairs the
test is simulated instead, at the row's own n, discordance and level:

- a pair is discordant with probability q = max(observed discordance, d) (a
  drop of d needs at least d discordant pairs), and a discordant pair goes
  against the candidate with probability (q + d) / 2q, so the true drop is d;
- each run draws the counts from the binomial (numpy, seeded) and applies the
  gate's own test (the drop's t against the tolerance, scipy's Student t);
- `detects` is the smallest d on a 0.005 grid whose share of failed runs
  reaches 80%; none up to a drop of 1 (every pair against the candidate)
  means the row cannot detect any drop, shown as such (`math.inf`).

Rows of clustered or fractional per-sample drops keep the closed form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

RUNS = 4_000  # a power near 0.8 is measured to about +-0.006
STEP = 0.005
SEED = 0


def simulable(drop: np.ndarray, clusters: Sequence[Any] | None) -> bool:
    """Independent pass/fail pairs: every per-sample drop is -1, 0 or 1 and no two samples share a cluster."""
    values = np.asarray(drop, dtype=float)
    independent = clusters is None or len({str(c) for c in clusters}) == len(clusters)
    return values.size >= 2 and independent and bool(np.isin(values, (-1.0, 0.0, 1.0)).all())


def rejection_rate(n: int, discordance: float, true_drop: float, tolerance: float, level: float,
                   runs: int = RUNS, seed: int = SEED) -> float:
    """The share of simulated rows of n independent pairs that the gate fails at `level`."""
    q = min(1.0, max(discordance, true_drop))
    rng = np.random.default_rng(seed)
    discordant = rng.binomial(n, q, size=runs)
    against = rng.binomial(discordant, min(1.0, 0.5 + true_drop / (2 * q)) if q > 0 else 0.5)
    mean = (2 * against - discordant) / n
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(n / (n - 1) * (discordant - n * mean**2)) / n
        t = (mean - tolerance) / se
    # no spread at all: the gate's test says the drop is exactly what was seen (stats.bound_test)
    p = np.where(se == 0.0, 1.0 - (mean > tolerance), sps.t.sf(t, n - 1))
    return float(np.mean(p < level))


def simulated_detectable_drop(drop: np.ndarray, tolerance: float, level: float, power: float = 0.8) -> float:
    """The smallest true drop (on a 0.005 grid past the tolerance) caught with `power` at this row's
    n, discordance and level; `math.inf` when not even a drop of 1 is. The power grows with the
    drop, so the grid is bisected."""
    values = np.asarray(drop, dtype=float)
    n, discordance = int(values.size), float(np.mean(values != 0.0))
    grid = np.round(np.arange(math.floor(max(tolerance, 0.0) / STEP) * STEP + STEP, 1.0 + STEP / 2, STEP), 3)
    caught = [False] * grid.size

    def enough(i: int) -> bool:
        caught[i] = rejection_rate(n, discordance, float(grid[i]), tolerance, level) >= power
        return caught[i]

    if grid.size == 0 or not enough(grid.size - 1):
        return math.inf
    low, high = -1, grid.size - 1  # grid[high] is caught; grid[low] is not (or below the grid)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return round(float(grid[high]), 3)
