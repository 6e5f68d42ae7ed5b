"""Calibration and power of the ICL order statistics, by simulation.

    python benchmarks/simulate_order.py              # the tables in docs/statistics.md (about 15 minutes)
    python benchmarks/simulate_order.py --runs 300   # quicker, noisier

Every simulated run goes through the icl task's own functions (evalsuite/tasks/icl/order.py):
`order_test` (the summary's `order_cluster_p_value`), `order_rows` (its Holm adjustment over
shot counts, `order_p_holm`) and `spread_difference` (the comparison's order-robustness
table), next to Cochran's Q (`order_p_value`), which takes questions as independent.

Outcomes are drawn with a known truth, seeded, all runs of a setting at once:
250 questions x 10 permutations; question i has a difficulty a_i ~ N(mean, 1) (logit) and
belongs to topic i mod T; under permutation p it is right with probability
sigmoid(a_i + u[topic, p] + b_p), where

- u ~ N(0, sd) independently per topic and permutation: the questions of a topic share each
  permutation's effect, and the effects average out over topics (the population of topics
  has no order effect: the null, for sd > 0 as for sd = 0);
- b_p ~ N(0, effect): a real order effect, the same for every question (power).

The tests are given the topics as their clusters (in a run: the label classes). The
resampling tests use 999 resamples here (9,999 in a run); a Monte Carlo permutation p-value
holds its level for any number of resamples.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from evalsuite.analysis.stats import cochran_q
from evalsuite.tasks.icl.order import cluster_totals, noise_floor, order_rows, order_test, spread, spread_difference

ALPHA = 0.05
QUESTIONS, PERMUTATIONS = 250, 10


def draw(rng: np.random.Generator, runs: int, topics: int, sd: float, effect: float = 0.0, mean: float = 0.5
         ) -> tuple[np.ndarray, np.ndarray]:
    """(runs x questions x permutations 0/1 outcomes, each question's topic)."""
    topic = np.arange(QUESTIONS) % topics
    difficulty = rng.normal(mean, 1.0, size=(runs, QUESTIONS, 1))
    shared = rng.normal(0.0, sd, size=(runs, topics, PERMUTATIONS))[:, topic, :]
    order = rng.normal(0.0, effect, size=(runs, 1, PERMUTATIONS))
    chance = sps.logistic.cdf(difficulty + shared + order)
    return (rng.random(chance.shape) < chance).astype(float), topic


def order_test_rates(runs: int, topics: int, sd: float, effect: float, resamples: int, seed: int
                     ) -> dict[str, float]:
    """Shares of runs with p < alpha: Cochran's Q, and the cluster permutation test."""
    outcomes, topic = draw(np.random.default_rng(seed), runs, topics, sd, effect)
    q = np.array([cochran_q(x)["p_value"] for x in outcomes])
    cluster = np.array([order_test(x, topic, resamples, seed + r)["p_value"] for r, x in enumerate(outcomes)])
    return {"q": float(np.mean(q < ALPHA)), "cluster": float(np.mean(cluster < ALPHA)),
            "spread": float(np.mean([np.ptp(x.mean(axis=0)) for x in outcomes]))}


def family_rates(runs: int, topics: int, sd: float, shots: int, resamples: int, seed: int) -> dict[str, float]:
    """One run = `shots` shot counts on the same questions, each with its own topic x permutation
    effects and no order effect: shares of runs with any shot count at p < alpha, unadjusted and
    Holm-adjusted, through the summary's own `order_rows`."""
    rng = np.random.default_rng(seed)
    topic = np.arange(QUESTIONS) % topics
    difficulty = rng.normal(0.5, 1.0, size=(runs, 1, QUESTIONS, 1))
    shared = rng.normal(0.0, sd, size=(runs, shots, topics, PERMUTATIONS))[:, :, topic, :]
    outcomes = rng.random(shared.shape) < sps.logistic.cdf(difficulty + shared)
    base = pd.DataFrame({"n_shots": np.repeat(2 ** (np.arange(shots) + 1), QUESTIONS * PERMUTATIONS),
                         "test_index": np.tile(np.repeat(np.arange(QUESTIONS), PERMUTATIONS), shots),
                         "permutation": np.tile(np.arange(PERMUTATIONS), shots * QUESTIONS), "order": "random"})
    base["label"] = topic[base["test_index"].to_numpy()]
    unadjusted, adjusted = [], []
    for run in outcomes:
        rows = order_rows(base.assign(correct=run.reshape(-1)), resamples=resamples)
        unadjusted.append(min(r["order_cluster_p_value"] for r in rows) < ALPHA)
        adjusted.append(min(r["order_p_holm"] for r in rows) < ALPHA)
    return {"unadjusted": float(np.mean(unadjusted)), "holm": float(np.mean(adjusted))}


def raw_spread_p(a: np.ndarray, b: np.ndarray, topic: np.ndarray, resamples: int, seed: int,
                 floors: bool = False) -> float:
    """A bootstrap over clusters alone, the permutations held fixed (the rejected designs): of
    spread(A) - spread(B), or with `floors` of the excess spreads (spread - noise floor)."""
    totals_a, counts = cluster_totals(a, topic)
    totals_b, _ = cluster_totals(b, topic)

    def difference(index: np.ndarray, axis: int = -1) -> np.ndarray:
        index = np.asarray(index, dtype=int)
        result: np.ndarray = spread(totals_a[index], counts[index]) - spread(totals_b[index], counts[index])
        if floors:
            result = result - noise_floor(totals_a[index], counts[index]) + noise_floor(totals_b[index], counts[index])
        return result

    draws = sps.bootstrap((np.arange(counts.size),), difference, vectorized=True, n_resamples=resamples,
                          method="percentile", random_state=np.random.default_rng(seed)).bootstrap_distribution
    tail = min(int(np.sum(draws <= 0)), int(np.sum(draws >= 0)))
    return min(1.0, 2 * (1 + tail) / (1 + draws.size))


def comparison_rates(runs: int, topics: int, sd: float, means: tuple[float, float], effects: tuple[float, float],
                     resamples: int, seed: int) -> dict[str, Any]:
    """Two models on the same questions (each its own topic effects and order effect): shares of runs
    in which the comparison calls one of them more robust, with and without the noise floors."""
    rng = np.random.default_rng(seed)
    a, topic = draw(rng, runs, topics, sd, effects[0], means[0])
    b, _ = draw(rng, runs, topics, sd, effects[1], means[1])
    shipped, floor, raw, excess = [], [], [], []
    for r in range(runs):
        result = spread_difference(a[r], b[r], topic, resamples, seed + r)
        shipped.append(result["p_value"] < ALPHA)
        excess.append(result["excess_diff"])
        raw.append(raw_spread_p(a[r], b[r], topic, resamples, seed + r) < ALPHA)
        floor.append(raw_spread_p(a[r], b[r], topic, resamples, seed + r, floors=True) < ALPHA)
    return {"shipped": float(np.mean(shipped)), "floor": float(np.mean(floor)), "raw": float(np.mean(raw)),
            "excess": float(np.mean(excess)), "accuracy": (float(a.mean()), float(b.mean()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=999)
    parser.add_argument("--comparison", action="store_true", help="only the 'more robust' table")
    args = parser.parse_args()
    start = time.time()
    if not args.comparison:
        order_tables(args.runs, args.resamples)
    comparison_table(args.runs, args.resamples)
    print(f"\n({time.time() - start:.0f} s)")


def order_tables(runs: int, resamples: int) -> None:
    print(f"## Does the order matter? ({runs} runs per row, {QUESTIONS} questions x {PERMUTATIONS} permutations)\n")
    print("| topics | topic x permutation sd | order effect sd | Cochran's Q | cluster test | mean spread |")
    print("|---|---|---|---|---|---|")
    settings = [(25, 0.0, 0.0), (25, 1.0, 0.0), (50, 0.5, 0.0), (6, 1.0, 0.0),
                (25, 0.0, 0.2), (25, 1.0, 0.2), (25, 1.0, 0.4), (50, 0.5, 0.2), (6, 1.0, 0.4)]
    for seed, (topics, sd, effect) in enumerate(settings):
        rate = order_test_rates(runs, topics, sd, effect, resamples, seed=100 * seed)
        print(f"| {topics} | {sd} | {effect} | {rate['q']:.3f} | {rate['cluster']:.3f} | {rate['spread']:.3f} |",
              flush=True)

    family = family_rates(runs, 25, 1.0, 3, resamples, seed=7)
    print(f"\n## Three shot counts, no order effect, 25 topics sd 1 ({runs} runs)\n")
    print("| any shot count at p < 0.05 | share of runs |\n|---|---|")
    print(f"| cluster test, unadjusted (`order_cluster_p_value`) | {family['unadjusted']:.3f} |")
    print(f"| cluster test, Holm over shot counts (`order_p_holm`) | {family['holm']:.3f} |", flush=True)


def comparison_table(runs: int, resamples: int) -> None:
    print(f"\n## Is one model more robust to the order? ({runs} runs per row, 25 topics)\n")
    print("| setting | accuracy A / B | mean excess A - B | raw spread, orders fixed | excess spread, orders fixed "
          "| shipped: orders and clusters resampled |")
    print("|---|---|---|---|---|---|")
    cases = [("no order effect, equal accuracy", 0.0, (0.5, 0.5), (0.0, 0.0)),
             ("no order effect, A far more accurate", 0.0, (3.5, 0.5), (0.0, 0.0)),
             ("topic x permutation sd 1 for both, no order effect", 1.0, (2.0, 0.5), (0.0, 0.0)),
             ("both order effect sd 0.3 (equally sensitive)", 0.0, (0.5, 0.5), (0.3, 0.3)),
             ("both order effect sd 0.5 (equally sensitive)", 0.0, (0.5, 0.5), (0.5, 0.5)),
             ("B order effect sd 0.3, A none", 0.0, (0.5, 0.5), (0.0, 0.3)),
             ("B order effect sd 0.5, A none", 0.0, (0.5, 0.5), (0.0, 0.5)),
             ("B order effect sd 0.5, A none, A more accurate", 0.0, (2.0, 0.5), (0.0, 0.5))]
    for seed, (label, sd, means, effects) in enumerate(cases):
        compared = comparison_rates(runs, 25, sd, means, effects, resamples, seed=1000 + 100 * seed)
        accuracy = "{:.2f} / {:.2f}".format(*compared["accuracy"])
        print(f"| {label} | {accuracy} | {compared['excess']:+.3f} | {compared['raw']:.3f} | "
              f"{compared['floor']:.3f} | {compared['shipped']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
