"""`detects`: the true drop a gated row catches with 80% power at its level, under a stated alternative.

How a drop arrives changes the power to see it, so `detects` names its alternative. Both are
computed for a row of independent pass/fail pairs, q0 being the row's observed discordance
(the share of pairs on which the two runs disagree) and d the true drop:

- `persist` (the default, and the conservative one): the ordinary disagreements persist. The
  pairs the runs disagree on without a regression (q0, split evenly between lost and gained)
  stay, and the drop comes on top: P(lost) = q0/2 + d, P(gained) = q0/2 (the gains shrink only
  where the two would exceed every pair);
- `turn`: the disagreements turn against the candidate. The discordance stays q0 as far as the
  drop allows (at least d), and the drop moves it towards losses: P(lost) = (q + d)/2,
  P(gained) = (q - d)/2 with q = max(q0, d), so every disagreement is a loss once d >= q0.

`turn` puts less noise beside the drop, so its `detects` is smaller: at 50 pairs and 10%
discordant, the gate catches the drop `turn` shows less than half the time if the ordinary
disagreements persist instead (`benchmarks/simulate_gate.py`).

The power is exact (`exact.power`: the probability of the test's rejection region at the row's
level), and `detects` is the smallest drop, to 0.001, whose power reaches 80%; `math.inf` where
no drop up to 1 does, which is where not even every pair lost reaches the row's level. Other
rows (clustered, fractional) keep the closed form tolerance + (t(1 - level) + t(0.8)) x SE
(`stats.detectable_drop`): the observed spread persisting, the `persist` analogue; `turn` is
defined for pass/fail pairs only (NaN elsewhere).
"""

from __future__ import annotations

import math
from functools import lru_cache

from .exact import power, smallest_p

PERSIST, TURN = "persist", "turn"
ALTERNATIVES = {PERSIST: "ordinary disagreements persist", TURN: "disagreements turn against the candidate"}
POWER = 0.8
PRECISION = 0.001  # `detects` is a multiple of it: shown to three decimals, its power is at least 80%


def rates(alternative: str, discordance: float, drop: float) -> tuple[float, float]:
    """(P(lost), P(gained)) of a pair under `alternative`, at the observed discordance and a true drop."""
    if alternative == PERSIST:
        gained = min(discordance / 2, (1 - drop) / 2)
        return gained + drop, gained
    if alternative == TURN:
        q = min(1.0, max(discordance, drop))
        return (q + drop) / 2, (q - drop) / 2
    raise ValueError(f"unknown alternative {alternative!r}: one of {', '.join(ALTERNATIVES)}")


@lru_cache(maxsize=8192)
def exact_detects(n: int, discordant: int, tolerance: float, level: float, alternative: str = PERSIST,
                  target: float = POWER) -> float:
    """The smallest true drop (to 0.001, rounded up) that the exact test of n independent pairs, of
    which `discordant` disagreed, rejects at `level` with probability `target` under `alternative`;
    `math.inf` where no drop up to 1 is (power grows with the drop, so it is bisected)."""
    if smallest_p(n, tolerance) >= level:
        return math.inf
    discordance = discordant / n

    def enough(step: int) -> bool:
        return power(n, tolerance, level, *rates(alternative, discordance, step * PRECISION)) >= target

    # on the grid of PRECISION: `low` is below the target (a drop at the tolerance is rejected at most
    # `level` of the time), `high` reaches it (every pair lost is rejected)
    low, high = math.floor(max(tolerance, 0.0) / PRECISION + 1e-9), round(1 / PRECISION)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return round(high * PRECISION, 3)
