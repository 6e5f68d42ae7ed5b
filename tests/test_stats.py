"""Statistics against values computed by hand or by an independent formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from evalsuite.analysis.exact import bounds as exact_bounds
from evalsuite.analysis.exact import p_exceeds, p_within, power, smallest_p, statistic
from evalsuite.analysis.power import PERSIST, TURN, exact_detects, rates
from evalsuite.analysis.stats import (
    bound_test,
    cochran_q,
    detectable_drop,
    drop_bound_test,
    holm,
    holm_steps,
    mcnemar_exact,
    mean_interval,
    not_testable,
    one_sided_bounds,
    paired_difference,
    wilson_interval,
)


@pytest.mark.parametrize("k, n, low, high", [
    (0, 10, 0.0, 0.2775),   # Wilson interval never collapses to a point at 0 or 1
    (10, 10, 0.7225, 1.0),
    (5, 10, 0.2366, 0.7634),
    (81, 263, 0.2553, 0.3662),  # the classic textbook example
])
def test_wilson_interval_known_values(k, n, low, high):
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_wilson_empty_is_nan():
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_mean_interval_uses_student_t_for_continuous_values():
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    # t(0.975, 3) = 3.182446; sd = 1.290994; half width = 3.182446 * 1.290994 / 2
    assert mean == 2.5 and high - mean == pytest.approx(2.054, abs=1e-3) and mean - low == pytest.approx(2.054, abs=1e-3)


@pytest.mark.parametrize("only_a, only_b, p", [
    (0, 0, 1.0),
    (5, 0, 0.0625),  # 2 * 0.5**5
    (10, 2, 0.0385742),  # 2 * P(X <= 2), X ~ Bin(12, 1/2) = 2 * 79/4096
    (3, 3, 1.0),
])
def test_mcnemar_exact_p_values(only_a, only_b, p):
    both = 7
    a = [True] * only_a + [False] * only_b + [True] * both
    b = [False] * only_a + [True] * only_b + [True] * both
    result = mcnemar_exact(a, b)
    assert (result["only_a"], result["only_b"], result["n"]) == (only_a, only_b, only_a + only_b + both)
    assert result["p_value"] == pytest.approx(p, abs=1e-6)


def test_paired_difference_detects_a_shift_and_not_noise():
    a = [0.1 * (i % 10) for i in range(100)]
    shifted = paired_difference(np.array([x + 0.1 for x in a]), np.array(a), pass_fail=False)
    assert shifted["diff"] == pytest.approx(0.1) and shifted["p_value"] < 0.001
    assert shifted["low"] == pytest.approx(0.1) and shifted["high"] == pytest.approx(0.1)  # no spread at all
    noise = paired_difference(np.array([x + (0.01 if i % 2 else -0.01) for i, x in enumerate(a)]), np.array(a),
                              pass_fail=False)
    assert noise["p_value"] > 0.5 and noise["low"] < 0 < noise["high"]


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04)
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert holm([0.9, 0.3]) == pytest.approx([0.9, 0.6]) and holm([0.9, 0.8]) == [1.0, 1.0]


@pytest.mark.parametrize("p, adjusted, levels", [
    # sorted 0.01 (tested at 0.05/3: rejected), 0.03 (at 0.05/2: not rejected, Holm stops), 0.04 (held at 0.025)
    ([0.04, 0.01, 0.03], [0.06, 0.03, 0.06], [0.025, 0.05 / 3, 0.025]),
    ([0.02, 0.021], [0.04, 0.04], [0.025, 0.05]),  # both rejected: 0.05/2, then 0.05/1
    ([0.03, 0.031], [0.06, 0.06], [0.025, 0.025]),  # 0.031 < 0.05 but never reached: its level is the stop's
    ([0.5, float("nan")], [0.5, float("nan")], [0.05, float("nan")]),  # NaN is no test
])
def test_holm_steps_give_the_level_each_hypothesis_was_tested_at(p, adjusted, levels):
    got_p, got_level = holm_steps(p, 0.05)
    assert got_p == pytest.approx(adjusted, nan_ok=True) and got_level == pytest.approx(levels, nan_ok=True)
    # a p-value is rejected exactly when it is below its level
    assert [bool(x < 0.05) for x in got_p] == [bool(a < b) for a, b in zip(p, got_level)]


def test_holm_steps_run_over_many_families_at_once():
    rng = np.random.default_rng(0)
    p = rng.random((50, 6)) ** 3
    adjusted, levels = holm_steps(p, 0.05)
    for row, adj, lev in zip(p, adjusted, levels):
        one_p, one_level = holm_steps(row, 0.05)
        assert adj == pytest.approx(one_p) and lev == pytest.approx(one_level) and adj == pytest.approx(holm(row))


def test_the_bound_test_by_hand_and_over_many_runs():
    drop = np.array([1.0, 0.0, 1.0, 0.0, 1.0, -1.0, 0.0, 1.0])
    result = drop_bound_test(drop, None, 0.1)
    se = drop.std(ddof=1) / np.sqrt(drop.size)  # every sample its own cluster: the ordinary standard error
    assert result["se"] == pytest.approx(se) and result["df"] == 7
    assert result["p_exceeds"] == pytest.approx(sps.t.sf((drop.mean() - 0.1) / se, 7))
    low, high = one_sided_bounds(result, 0.01)
    assert low == pytest.approx(drop.mean() - sps.t.ppf(0.99, 7) * se) and high - drop.mean() == pytest.approx(
        drop.mean() - low)
    assert detectable_drop(result, 0.1, 0.01) == pytest.approx(0.1 + (sps.t.ppf(0.99, 7) + sps.t.ppf(0.8, 7)) * se)
    runs = np.random.default_rng(1).integers(-1, 2, size=(20, 30)).astype(float)
    many = bound_test(runs, np.ones_like(runs), 0.05)
    for r in range(20):
        one = drop_bound_test(runs[r], None, 0.05)
        assert many["p_exceeds"][r] == pytest.approx(one["p_exceeds"]) and many["se"][r] == pytest.approx(one["se"])


@pytest.mark.parametrize("drop, clusters, label", [
    ([], None, "not testable (n = 0)"),
    ([0.3], None, "not testable (n = 1)"),
    ([0.3, 0.1], ["a", "a"], "not testable (n = 2 in 1 cluster)"),
])
def test_fewer_than_two_clusters_are_not_testable(drop, clusters, label):
    result = drop_bound_test(np.array(drop), clusters, 0.02)
    assert np.isnan(result["p_exceeds"]) and np.isnan(result["p_within"])
    assert np.isnan(detectable_drop(result, 0.02, 0.05))
    assert not_testable(len(drop), result["clusters"]) == label


def test_no_spread_on_few_clusters_is_not_certainty():
    """Two clusters that both dropped by a whole point: the t test has no spread and read p = 0; the gate's
    t rows give no p below 2^-k (a sign-flip test's smallest), so the bounds are unbounded at 0.05."""
    result = drop_bound_test(np.array([1.0, 1.0, 1.0, 1.0]), ["a", "a", "b", "b"], 0.02)
    assert result["se"] == 0.0 and result["p_exceeds"] == 0.25 == result["smallest_p"]
    assert one_sided_bounds(result, 0.05) == (-math.inf, math.inf)
    assert detectable_drop(result, 0.02, 0.05) == math.inf
    assert not_testable(4, 2, 0.25) == "not testable (n = 4 in 2 clusters: p >= 0.25 at best)"
    many = drop_bound_test(np.full(12, 0.5), None, 0.02)
    assert many["p_exceeds"] == 0.5**12 and one_sided_bounds(many, 0.05) == (0.5, 0.5)


# ---- the exact test of independent pass/fail pairs ---------------------------------------------------

def enumerated_p(lost: int, gained: int, n: int, margin: float) -> float:
    """p of "true drop <= margin" by brute force: the score statistic from a numerical maximum-likelihood
    fit of the null, every outcome of n pairs enumerated, the largest tail over 4,001 discordances."""
    from scipy import optimize

    def statistic(lo: int, ga: int) -> float:
        ties = n - lo - ga
        low, high = max(0.0, -margin), (1 - margin) / 2  # x = P(gained), P(lost) = x + margin

        def minus_loglik(x: float) -> float:
            return -float(sps.multinomial.logpmf([lo, ga, ties], n, [x + margin, x, 1 - 2 * x - margin]))

        x = optimize.minimize_scalar(minus_loglik, bounds=(low + 1e-12, high - 1e-12), method="bounded",
                                     options={"xatol": 1e-12}).x
        variance = n * (2 * x + margin - margin**2)
        return (lo - ga - n * margin) / math.sqrt(variance) if variance > 1e-12 else 0.0

    table = [(lo, ga, statistic(lo, ga)) for lo in range(n + 1) for ga in range(n + 1 - lo)]
    observed = statistic(lost, gained)
    region = np.array([[lo, ga] for lo, ga, z in table if z >= observed - 1e-9])
    best = 0.0
    for q in np.linspace(abs(margin), 1.0, 4001):
        probabilities = [(q + margin) / 2, (q - margin) / 2, 1 - q]
        best = max(best, float(sps.multinomial.pmf(np.column_stack([region, n - region.sum(axis=1)]), n,
                                                   probabilities).sum()))
    return best


@pytest.mark.parametrize("lost, gained, n, margin", [
    (2, 0, 2, 0.0), (2, 0, 2, 0.02), (5, 0, 5, 0.02), (4, 1, 12, 0.0), (4, 1, 12, 0.02), (6, 2, 20, 0.1),
    (3, 3, 20, 0.02), (1, 4, 12, -0.05), (0, 0, 8, 0.02),
])
def test_the_exact_p_value_by_brute_force(lost, gained, n, margin):
    assert p_exceeds(lost, gained, n, margin) == pytest.approx(enumerated_p(lost, gained, n, margin), rel=1e-3)


def test_at_a_tolerance_of_0_the_statistic_is_mcnemars_and_two_pairs_give_its_exact_p():
    lost, gained = np.array([3, 7, 0, 12]), np.array([1, 2, 5, 12])
    assert statistic(lost, gained, 40, 0.0) == pytest.approx((lost - gained) / np.sqrt(lost + gained))
    exact_mcnemar = sps.binomtest(2, 2, 0.5, alternative="greater").pvalue  # both pairs lost
    assert p_exceeds(2, 0, 2, 0.0) == pytest.approx(exact_mcnemar) == 0.25
    assert [smallest_p(n, 0.02) for n in (2, 4, 5)] == pytest.approx([0.51**2, 0.51**4, 0.51**5])
    assert p_within(0, 3, 3, 0.02) == pytest.approx(0.49**3) == smallest_p(3, 0.02, within=True)


@pytest.mark.parametrize("n", [5, 8, 12, 20])
def test_the_exact_test_holds_its_level_at_every_discordance(n):
    """Its rejections at 0.05, summed over every outcome, at a true drop equal to the tolerance (the
    boundary) and inside the null (a smaller drop), for discordances from the smallest to all pairs."""
    lost, gained = np.array([(lo, ga) for lo in range(n + 1) for ga in range(n + 1 - lo)]).T
    rejected = np.array([p_exceeds(int(lo), int(ga), n, 0.02) < 0.05 for lo, ga in zip(lost, gained)])
    ties = n - lost - gained
    for q in np.linspace(0.02, 1.0, 50):
        for true_drop in (0.02, 0.0, -0.1):
            if q < abs(true_drop):
                continue
            probabilities = [(q + true_drop) / 2, (q - true_drop) / 2, 1 - q]
            size = sps.multinomial.pmf(np.column_stack([lost, gained, ties]), n, probabilities)[rejected].sum()
            assert size <= 0.05, (n, q, true_drop, size)


def test_the_bounds_invert_the_test():
    """A bound lies past the tolerance exactly when the test rejects there, and p at the bound is the level."""
    rng = np.random.default_rng(4)
    for _ in range(12):
        n = int(rng.choice([3, 8, 30, 120]))
        discordant = rng.binomial(n, rng.uniform(0.05, 0.6))
        lost = int(rng.binomial(discordant, rng.uniform(0.4, 0.9)))
        gained, level, margin = int(discordant - lost), float(rng.choice([0.05, 0.01])), float(rng.choice([0.0, 0.02]))
        low, high = exact_bounds(lost, gained, n, margin, level)
        assert (low > margin) == (p_exceeds(lost, gained, n, margin) < level)
        assert (high < margin) == (p_within(lost, gained, n, margin) < level)
        assert low <= (lost - gained) / n <= high
        if -1 < low and high < 1:
            assert p_exceeds(lost, gained, n, low) >= level > p_exceeds(lost, gained, n, low - 2e-4)
            assert p_within(lost, gained, n, high) >= level > p_within(lost, gained, n, high + 2e-4)


@pytest.mark.parametrize("alternative", [PERSIST, TURN])
def test_detects_is_the_smallest_drop_with_80_percent_power(alternative):
    n, discordant, level = 60, 9, 0.0125
    shown = exact_detects(n, discordant, 0.02, level, alternative)
    p_lost, p_gained = rates(alternative, discordant / n, shown)
    assert p_lost - p_gained == pytest.approx(shown)
    assert power(n, 0.02, level, p_lost, p_gained) >= 0.8
    assert power(n, 0.02, level, *rates(alternative, discordant / n, shown - 0.001)) < 0.8
    assert exact_detects(4, 2, 0.02, 0.05, alternative) == math.inf  # four pairs cannot reach 0.05


def test_cochran_q_by_hand():
    # 4 questions x 3 orders; column totals 3, 1, 0; row totals 2, 1, 1, 0; N = 4
    x = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]])
    q = (3 - 1) * (3 * (9 + 1 + 0) - 16) / (3 * 4 - (4 + 1 + 1 + 0))
    got = cochran_q(x)
    assert got["q"] == pytest.approx(q) and got["df"] == 2
    assert cochran_q(np.ones((5, 4)))["p_value"] == 1.0  # every question answered alike under every order


def test_cochran_q_holds_its_level_when_order_does_not_matter():
    """A seeded, smaller version of benchmarks/simulate_gate.py's order test."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from simulate_gate import simulate_order_test

    q_rate, mcnemar_rate = simulate_order_test(250, 10, runs=300, seed=4)
    assert q_rate <= 0.05 + 0.035  # nominal 0.05; 300 runs have a standard error of about 0.013
    assert mcnemar_rate > 0.3  # the test it replaces: best vs worst picked after the fact
