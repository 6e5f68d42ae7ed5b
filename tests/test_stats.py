"""Statistics against values computed by hand or by an independent formula."""

from __future__ import annotations

import math

import pytest

from evalsuite.stats import mcnemar_exact, mean_interval, paired_bootstrap, wilson_interval


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


def test_paired_bootstrap_detects_a_shift_and_not_noise():
    a = [0.5 + 0.01 * (i % 7) for i in range(200)]
    shifted = paired_bootstrap([x + 0.1 for x in a], a)
    assert shifted["diff"] == pytest.approx(0.1) and shifted["p_value"] < 0.01
    assert shifted["low"] == pytest.approx(0.1) and shifted["high"] == pytest.approx(0.1)
    noise = paired_bootstrap([x + (0.01 if i % 2 else -0.01) for i, x in enumerate(a)], a)
    assert abs(noise["diff"]) < 1e-9 and noise["p_value"] > 0.5
    assert paired_bootstrap(a, a, seed=3) == paired_bootstrap(a, a, seed=3)
