"""Scores a model could have had at each length, drawn for the effective length's intervals.

A pass/fail rate is drawn from its Jeffreys posterior (scipy's beta; two models' joint outcomes from
scipy's Dirichlet), any other score by a bootstrap of the length's samples; seeded, so the same records
give the same draws.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

RESAMPLES = 2000
SEED = 0


def _draws(cells: list[tuple[int, np.ndarray]], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per length, `resamples` x n row positions drawn with replacement from that length's rows."""
    return [rows[rng.integers(0, rows.size, size=(resamples, rows.size))] for _, rows in cells]


def pass_fail(*arrays: np.ndarray) -> bool:
    """Are all the values (NaN left out) 0 or 1, and is there one at least?"""
    values = np.concatenate([x[~np.isnan(x)] for x in arrays])
    return values.size > 0 and bool(np.isin(values, (0.0, 1.0)).all())


def drawn_scores(values: np.ndarray, cells: list[tuple[int, np.ndarray]], resamples: int = RESAMPLES,
                 seed: int = SEED) -> np.ndarray:
    """Resamples x lengths: scores the model could have had. A pass/fail metric's rate at each length is
    drawn from its Jeffreys posterior, Beta(passes + 1/2, fails + 1/2), which, like the Wilson interval of
    the rate tables, keeps its width at 0 or n passes (a bootstrap of n passes only ever redraws passes);
    any other metric's is the mean of a bootstrap resample of the length's samples."""
    rng = np.random.default_rng(seed)
    if not pass_fail(values):
        return np.stack([values[d].mean(axis=1) for d in _draws(cells, resamples, rng)], axis=1)
    passes = [float(values[rows].sum()) for _, rows in cells]
    return np.stack([sps.beta.rvs(k + 0.5, rows.size - k + 0.5, size=resamples, random_state=rng)
                     for k, (_, rows) in zip(passes, cells)], axis=1)


def drawn_pairs(a: np.ndarray, b: np.ndarray, cells: list[tuple[int, np.ndarray]], resamples: int = RESAMPLES,
                seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Both models' drawn scores, paired: for a pass/fail metric, each length's four joint outcomes (both
    pass, only a, only b, neither) drawn from their Jeffreys posterior, Dirichlet(counts + 1/2), so that
    the draws keep the models' agreement; otherwise the same bootstrap resample of sample ids for both."""
    rng = np.random.default_rng(seed)
    if not pass_fail(a, b):
        draws = _draws(cells, resamples, rng)
        return np.stack([a[d].mean(axis=1) for d in draws], axis=1), np.stack([b[d].mean(axis=1) for d in draws], axis=1)
    drawn = []
    for _, rows in cells:
        x, y = a[rows] > 0.5, b[rows] > 0.5
        counts = np.array([(x & y).sum(), (x & ~y).sum(), (~x & y).sum(), (~x & ~y).sum()], dtype=float)
        drawn.append(sps.dirichlet.rvs(counts + 0.5, size=resamples, random_state=rng))
    return (np.stack([p[:, 0] + p[:, 1] for p in drawn], axis=1), np.stack([p[:, 0] + p[:, 2] for p in drawn], axis=1))
