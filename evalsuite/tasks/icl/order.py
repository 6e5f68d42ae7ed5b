"""The icl task's order statistics: does the order of the demonstrations matter, and is one
model more robust to it than another. Pure numpy/scipy on the run's frame; no torch.

Questions are not independent under a permutation: a demonstration order that puts one
class last pulls every question of that class the same way (recency), so the questions of
one class share each permutation's effect. Cochran's Q, which takes questions as independent,
then calls order effects that average out over classes significant (60% of runs at alpha
0.05 with 25 topics and a topic x permutation effect of sd 1 logit; benchmarks/simulate_order.py).
So both statistics here resample whole clusters, by default the test question's class
(`label`; the task's cluster axis, `test_index`, in runs recorded before the label was):

- `order_test`: a permutation test of Cochran's Q in which each cluster's outcomes are
  permuted across the demonstration orders as one block (`scipy.stats.permutation_test`,
  `permutation_type="samples"`, the clusters being the paired observations). It is exact
  whenever the permutation effects are exchangeable within a cluster, whatever they share;
- `spread_difference`: two models' spreads (best - worst accuracy over the orders), each
  corrected by its noise floor, the spread expected when the order does not matter
  (uncorrected, the model with the higher accuracy has the smaller binomial noise and so the
  smaller spread, order effect or not), and the test of "one is more sensitive to the order":
  the difference of their order variances beyond noise, by a bootstrap that resamples the
  permutations, a random sample of the possible orders, together with the clusters.

`order_rows` and `robustness_rows` apply them per (order, shot count) and Holm-adjust
the p-values over every row tested, the family of one run's (or one pair's) claims.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import integrate
from scipy import stats as sps

from evalsuite.analysis.stats import cochran_q, holm, mean_interval

RESAMPLES = 9_999
SEED = 0  # every resampling is seeded: the same records give the same summary
BATCH = 1_000  # resamples drawn at once: memory stays small for any number of clusters
DECLARED_CLUSTER = "cluster"  # a local file's `cluster` column, when the data declares one
CLUSTER = "label"  # questions of one class share a permutation's effect
FALLBACK_CLUSTER = "test_index"  # runs recorded without the label axis: each question its own cluster


# ---- the matrices --------------------------------------------------------------------------

def cluster_totals(outcomes: np.ndarray, clusters: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per cluster and order: correct answers, per cluster: questions) of a (questions x
    orders) 0/1 matrix; questions missing an outcome under some order are left out."""
    x = np.asarray(outcomes, dtype=float)
    complete = ~np.isnan(x).any(axis=1)
    _, index = np.unique(np.asarray([str(c) for c in clusters])[complete], return_inverse=True)
    totals = np.zeros((int(index.max()) + 1 if index.size else 0, x.shape[1]))
    np.add.at(totals, index, x[complete])
    return totals, np.bincount(index, minlength=totals.shape[0]).astype(float)


@functools.lru_cache(maxsize=64)
def expected_range(k: int) -> float:
    """E[max - min] of k independent standard normals (d2 of quality control):
    the integral of 1 - Phi(x)^k - (1 - Phi(x))^k over the real line."""
    value, _ = integrate.quad(lambda x: 1.0 - sps.norm.cdf(x) ** k - sps.norm.sf(x) ** k, -np.inf, np.inf)
    return float(value)


def noise_floor(totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The spread expected if the order did not matter: when each cluster's row of totals is
    shuffled across the k orders, the column totals are exchangeable with variance
    v = sum of the rows' variances (ddof 0) and covariance -v / (k - 1), so their range is that
    of k independent normals of variance v k / (k - 1). Works on leading batch axes
    (totals (..., clusters, k), counts (..., clusters))."""
    k = totals.shape[-1]
    variance = np.sum(np.var(totals, axis=-1), axis=-1) * k / (k - 1)
    floor: np.ndarray = expected_range(k) * np.sqrt(variance) / np.sum(counts, axis=-1)
    return floor


def spread(totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Best minus worst accuracy over the orders (on leading batch axes too)."""
    accuracy = np.sum(totals, axis=-2) / np.sum(counts, axis=-1)[..., None]
    result: np.ndarray = np.ptp(accuracy, axis=-1)
    return result


# ---- does the order matter? ------------------------------------------------------------------

def _sum_of_squared_order_totals(*orders: np.ndarray, axis: int = -1) -> np.ndarray:
    # each cluster's row total is fixed by the shuffles, so Cochran's Q is an increasing
    # function of this sum: the permutation test of either is the same test
    totals = np.stack([np.sum(o, axis=axis) for o in orders])
    result: np.ndarray = np.sum(totals**2, axis=0)
    return result


def order_test(outcomes: np.ndarray, clusters: Sequence[Any] | np.ndarray, resamples: int = RESAMPLES,
               seed: int = SEED) -> dict[str, Any]:
    """H0 "the order does not matter" on a (questions x orders) 0/1 matrix: each cluster's
    outcomes move across the orders as one block, so the test holds its level when the
    questions of a cluster share each order's effect. One-sided (large Q: the order matters)."""
    totals, counts = cluster_totals(outcomes, clusters)
    k = totals.shape[1]
    out: dict[str, Any] = {"clusters": int(counts.size), "p_value": math.nan}
    if counts.size < 2 or k < 2:
        return out
    if np.all(totals == totals[:, :1]):  # no cluster changes with the order: nothing to permute
        return {**out, "p_value": 1.0}
    result = sps.permutation_test(tuple(totals.T), _sum_of_squared_order_totals, permutation_type="samples",
                                  vectorized=True, n_resamples=resamples, batch=BATCH, alternative="greater",
                                  random_state=np.random.default_rng(seed))
    return {**out, "p_value": float(result.pvalue)}


# ---- is one model more robust to the order than the other? ----------------------------------

def spread_difference(outcomes_a: np.ndarray, outcomes_b: np.ndarray, clusters: Sequence[Any] | np.ndarray,
                      resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """Two models' (questions x orders) 0/1 matrices on the same questions and orders: their
    spreads and noise floors and the difference of their excess spreads (spread - floor, A - B),
    as the paper's measure; the test is `order_variance_difference` (the permutations a random
    sample, resampled with the clusters), its interval and p-value those of the excess order
    variance difference A - B. A percentile bootstrap of the excess spread over clusters alone
    held the permutations fixed and called one of two equally sensitive models more robust
    15-42% of the time (docs/statistics.md)."""
    a, b = np.asarray(outcomes_a, dtype=float), np.asarray(outcomes_b, dtype=float)
    both = ~(np.isnan(a).any(axis=1) | np.isnan(b).any(axis=1))  # questions answered under every order by both
    keep = [c for c, k in zip(clusters, both) if k]
    totals_a, counts = cluster_totals(a[both], keep)
    totals_b, _ = cluster_totals(b[both], keep)
    out: dict[str, Any] = {"n": int(both.sum()), "clusters": int(counts.size)}
    if counts.size == 0 or a.shape[1] < 2:
        return {**out, **dict.fromkeys(("spread_a", "spread_b", "floor_a", "floor_b", "diff", "excess_diff",
                                        "order_sd_a", "order_sd_b", "var_diff", "low", "high", "p_value"), math.nan)}
    observed = _excess_difference(totals_a, totals_b, counts, np.arange(counts.size))
    out.update(spread_a=float(spread(totals_a, counts)), spread_b=float(spread(totals_b, counts)),
               floor_a=float(noise_floor(totals_a, counts)), floor_b=float(noise_floor(totals_b, counts)))
    out.update(diff=out["spread_a"] - out["spread_b"], excess_diff=float(observed))
    return {**out, **order_variance_difference(totals_a, totals_b, counts, resamples, seed)}


def order_variance_difference(totals_a: np.ndarray, totals_b: np.ndarray, counts: np.ndarray,
                              resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, float]:
    """Each model's order variance beyond noise (the variance of its accuracy over the permutations
    less what noise alone gives), the difference A - B, and its 95% percentile interval and
    two-sided p-value from a bootstrap that resamples the permutations (a random sample of the
    possible orders) and the clusters of questions, both models alike."""
    k, m = totals_a.shape[1], counts.size
    out = {"order_sd_a": _order_sd(_excess_variance(totals_a, counts)),
           "order_sd_b": _order_sd(_excess_variance(totals_b, counts))}
    out["var_diff"] = float(_excess_variance(totals_a, counts) - _excess_variance(totals_b, counts))
    if m < 2 or k < 2:
        return {**out, "low": math.nan, "high": math.nan, "p_value": math.nan}
    rng = np.random.default_rng(seed)
    draws = []
    for start in range(0, resamples, BATCH):
        size = min(BATCH, resamples - start)
        rows, columns = rng.integers(0, m, size=(size, m, 1)), rng.integers(0, k, size=(size, 1, k))
        draws.append(_excess_variance(totals_a[rows, columns], counts[rows[..., 0]])
                     - _excess_variance(totals_b[rows, columns], counts[rows[..., 0]]))
    values = np.concatenate(draws)
    low, high = np.percentile(values, [2.5, 97.5])
    tail = min(int(np.sum(values <= 0)), int(np.sum(values >= 0)))  # counted as in spread_difference
    return {**out, "low": float(low), "high": float(high), "p_value": min(1.0, 2 * (1 + tail) / (1 + values.size))}


def _excess_variance(totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The variance (ddof 1) of accuracy over the permutations less its expectation when the order
    does not matter, v / n^2 x k / (k - 1) with v as in `noise_floor`; on leading batch axes."""
    k = totals.shape[-1]
    n = np.sum(counts, axis=-1)
    accuracy = np.sum(totals, axis=-2) / n[..., None]
    noise = np.sum(np.var(totals, axis=-1), axis=-1) / n**2 * k / (k - 1)
    excess: np.ndarray = np.var(accuracy, axis=-1, ddof=1) - noise
    return excess


def _order_sd(excess_variance: np.ndarray) -> float:
    """The order effect's standard deviation in accuracy beyond noise (0 when noise explains it all)."""
    return float(np.sqrt(max(0.0, float(excess_variance))))


def _excess_difference(totals_a: np.ndarray, totals_b: np.ndarray, counts: np.ndarray,
                       index: np.ndarray) -> np.ndarray:
    """(spread - floor of A) - (spread - floor of B) over the clusters `index` (..., clusters) draws."""
    index = np.asarray(index, dtype=int)
    excess = [spread(t[index], counts[index]) - noise_floor(t[index], counts[index]) for t in (totals_a, totals_b)]
    difference: np.ndarray = excess[0] - excess[1]
    return difference


# ---- per (order, shot count) -----------------------------------------------------------------

def cluster_column(frame: pd.DataFrame, cluster: str | None = None) -> str:
    """The column questions are clustered by: `cluster`, else the data's declared clusters, else the
    label, else each question alone."""
    for name in (cluster, DECLARED_CLUSTER, CLUSTER, FALLBACK_CLUSTER):
        if name and name in frame.columns:
            return name
    raise KeyError(f"the icl frame has no column to cluster questions by ({cluster or CLUSTER})")


def outcome_matrix(part: pd.DataFrame, cluster: str) -> tuple[pd.DataFrame, list[Any]]:
    """(questions x permutations outcomes, each question's cluster) of one (order, shot count)."""
    outcomes = part.pivot_table(index="test_index", columns="permutation", values="correct",
                                aggfunc="first").astype(float)
    by_question = part.groupby("test_index")[cluster].first()
    return outcomes, by_question.loc[outcomes.index].tolist()


def order_rows(frame: pd.DataFrame, cluster: str | None = None, resamples: int = RESAMPLES) -> list[dict[str, Any]]:
    """Per (order, shot count): accuracy under each permutation of the demonstrations, their
    mean with its interval over questions, the spread and its noise floor, and whether the
    order matters (Cochran's Q as if questions were independent; the cluster permutation test,
    and its Holm adjustment over every row tested)."""
    column = cluster_column(frame, cluster)
    rows = []
    for (order, n), part in frame.groupby(["order", "n_shots"], sort=True):
        outcomes, clusters = outcome_matrix(part, column)
        accuracy = outcomes.mean(axis=0)
        _, low, high = mean_interval(outcomes.mean(axis=1).tolist())
        k = int(outcomes.shape[1])
        # one demonstration has one order: nothing to test, and not a member of the family
        testable = k > 1 and int(n) > 1
        totals, counts = cluster_totals(outcomes.to_numpy(), clusters)
        rows.append({
            "order": str(order), "n_shots": int(n), "permutations": k, "n_test": int(outcomes.shape[0]),
            "accuracy": [float(a) for a in accuracy], "mean": float(accuracy.mean()),
            "mean_low": low, "mean_high": high, "spread": float(accuracy.max() - accuracy.min()),
            "spread_noise_floor": float(noise_floor(totals, counts)) if k > 1 and counts.size else None,
            "std": float(accuracy.std(ddof=1)) if k > 1 else None,
            "best_permutation": int(accuracy.idxmax()), "worst_permutation": int(accuracy.idxmin()),
            # a test of best vs worst would pick both after seeing them and not hold its level
            "order_p_value": cochran_q(outcomes.to_numpy())["p_value"] if k > 1 else None,
            "order_cluster": column, "order_clusters": int(counts.size),
            "order_cluster_p_value": _number(order_test(outcomes.to_numpy(), clusters, resamples)["p_value"]) if testable
            else None,
            "mean_prompt_tokens": float(part["prompt_tokens"].mean()) if "prompt_tokens" in part else None,
        })
    _holm_into(rows, "order_cluster_p_value", "order_p_holm")
    return rows


def robustness_rows(frame_a: pd.DataFrame, frame_b: pd.DataFrame, alpha: float = 0.05,
                    cluster: str | None = None) -> list[dict[str, Any]]:
    """Per (order, shot count) of two paired runs: `spread_difference` of A against B, Holm over
    the rows tested, and which model is the more robust to the order (at `alpha`, adjusted)."""
    column = cluster_column(frame_a, cluster)
    b_by_id = frame_b.set_index("id")
    rows = []
    for (order, n), part_a in frame_a.groupby(["order", "n_shots"], sort=True):
        part_b = b_by_id.loc[part_a["id"]].reset_index().assign(**{column: part_a[column].to_numpy()})
        outcomes_a, clusters = outcome_matrix(part_a, column)
        outcomes_b, _ = outcome_matrix(part_b, column)
        outcomes_b = outcomes_b.reindex(index=outcomes_a.index, columns=outcomes_a.columns)
        row = {"order": str(order), "n_shots": int(n), "permutations": int(outcomes_a.shape[1]), "cluster": column,
               **spread_difference(outcomes_a.to_numpy(), outcomes_b.to_numpy(), clusters)}
        if int(n) < 2:  # one demonstration has one order
            row.update(low=math.nan, high=math.nan, p_value=math.nan)
        rows.append({k: _number(v) if isinstance(v, float) else v for k, v in row.items()})
    _holm_into(rows, "p_value", "p_holm")
    for row in rows:
        p = row["p_holm"]
        row["more_robust"] = None if p is None or p >= alpha else ("a" if row["var_diff"] < 0 else "b")
    return rows


def _number(value: float) -> float | None:
    """NaN as None, so summary.json holds null rather than a non-standard NaN."""
    return None if value is None or math.isnan(value) else float(value)


def _holm_into(rows: list[dict[str, Any]], key: str, adjusted_key: str) -> None:
    adjusted = holm([math.nan if row[key] is None else row[key] for row in rows])
    for row, value in zip(rows, adjusted):
        row[adjusted_key] = _number(value)
