"""Calibration and power of the regression gate (and of the ICL order test), by simulation and exact sums.

    python benchmarks/simulate_gate.py              # the tables in docs/statistics.md (about 8 minutes on 2 cores)
    python benchmarks/simulate_gate.py --runs 500   # quicker, noisier

A row of independent pass/fail pairs is tested exactly (`evalsuite.analysis.exact`); its
false-alarm rate and power are sums over the trinomial outcomes of the row, so they are
computed, not estimated, and a seeded simulation through the gate's own p-values checks
them. Clustered rows (the pooled row of a bit sweep, clustered by document) keep the
cluster-robust t test (`stats.bound_test`). Every simulated setting draws `--runs` seeded
runs at once (numpy arrays of runs x samples) and decides them with the gate's statistics:
`exact.p_exceeds` (once per distinct outcome), `stats.bound_test`, `stats.holm_steps`; the
first runs of every per-cell setting also go through `gate.decide` and must agree.
Outcomes are paired pass/fail samples drawn with a known truth:

- a drop in {-1, 0, 1} per sample (baseline minus candidate), with a share of discordant
  pairs (10%: a strong model; 30%: common for weak ones) split so that the expected drop is
  the true drop;
- one row of n pairs, n from 2 to 200, with the true drop at the tolerance: the false alarms
  of the exact test and of the t test it replaced (which read no spread as certainty);
- `detects` under both alternatives (`power.ALTERNATIVES`), and the power measured at each
  under each way a drop can arrive;
- per-cell gating: a 16/8/6/4-bit sweep of 250 documents, each document in every cell with
  its own tendency to favour one model (symmetric: no effect on the true drop), so the pooled
  row is clustered by document; a drop confined to one cell.
"""

from __future__ import annotations

import argparse
from functools import cache

import numpy as np
from scipy import stats as sps

from evalsuite.analysis.exact import p_exceeds, power, smallest_p
from evalsuite.analysis.gate import Measured, decide
from evalsuite.analysis.power import PERSIST, TURN, exact_detects, rates
from evalsuite.analysis.stats import bound_test, cochran_q, holm_steps, mcnemar_exact

ALPHA = 0.05
TOLERANCE = 0.02
SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30, 50, 100, 150, 200, 250, 500, 1000)
BITS = (16, 8, 6, 4)
DOCUMENTS = 250
TENDENCY = 0.05  # sd of a document's tendency to favour one model, across its cells


def draw_drops(rng: np.random.Generator, shape: tuple[int, ...], true_drop: np.ndarray | float, discordant: float,
               tendency: np.ndarray | float = 0.0) -> np.ndarray:
    """Per-sample drops in {-1, 0, 1} with mean `true_drop` (broadcast over `shape`) and `discordant`
    pairs, plus a symmetric per-sample tendency (zero mean, so the true drop stays)."""
    drop = np.broadcast_to(np.asarray(true_drop, dtype=float), shape)
    gained = np.maximum(0.0, (discordant - drop) / 2) + np.maximum(-tendency, 0.0)
    lost = np.maximum(0.0, (discordant - drop) / 2) + drop + np.maximum(tendency, 0.0)
    u = rng.random(shape)
    return np.where(u < lost, 1.0, np.where(u < lost + gained, -1.0, 0.0))


def draw_rates(rng: np.random.Generator, shape: tuple[int, ...], p_lost: float, p_gained: float) -> np.ndarray:
    """Per-sample drops in {-1, 0, 1}: lost with probability p_lost, gained with p_gained."""
    u = rng.random(shape)
    return np.where(u < p_lost, 1.0, np.where(u < p_lost + p_gained, -1.0, 0.0))


# ---- the exact test on many simulated rows --------------------------------------------------------

@cache
def _p(lost: int, gained: int, n: int, tolerance: float) -> float:
    return p_exceeds(lost, gained, n, tolerance)


def exact_test(drops: np.ndarray, max_drop: float) -> dict[str, np.ndarray]:
    """The gate's exact test of rows of independent pairs (..., n): p_exceeds per row (computed once per
    distinct outcome), NaN where n cannot reach alpha (not testable, left out of Holm, as in `gate`)."""
    n = drops.shape[-1]
    lost, gained = (drops == 1.0).sum(axis=-1), (drops == -1.0).sum(axis=-1)
    pairs, index = np.unique(np.stack([lost.ravel(), gained.ravel()], axis=1), axis=0, return_inverse=True)
    values = np.array([_p(int(lo), int(ga), n, max_drop) for lo, ga in pairs])
    p = values[index.ravel()].reshape(lost.shape)
    return {"p_exceeds": np.where(smallest_p(n, max_drop) < ALPHA, p, np.nan), "drop": drops.mean(axis=-1)}


def t_test_before(lost: np.ndarray, gained: np.ndarray, n: int, max_drop: float) -> np.ndarray:
    """p of the t test the gate used on rows of n independent pairs before (from their counts):
    Student's t, and no spread read as certainty."""
    mean = (lost - gained) / n
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(np.maximum(lost + gained - n * mean**2, 0.0) / (n - 1) / n)
        p = np.where(se == 0.0, 1.0 - (mean > max_drop), sps.t.sf((mean - max_drop) / se, n - 1))
    return np.asarray(p)


def gate(tests: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(failed, level) per run and row for rows tested together: Holm over them, as `check` does."""
    p = np.stack([t["p_exceeds"] for t in tests], axis=-1)
    adjusted, level = holm_steps(p, ALPHA)
    return adjusted < ALPHA, level


# ---- one row of n pairs, n from 2 to 200 -------------------------------------------------------------

def outcomes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (lost, gained) a row of n pairs can show."""
    lost, gained = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = lost + gained <= n
    return lost[keep], gained[keep]


def trinomial(n: int, lost: np.ndarray, gained: np.ndarray, p_lost: float, p_gained: float) -> np.ndarray:
    """P(lost, gained) of n independent pairs."""
    discordant = lost + gained
    return np.asarray(sps.binom.pmf(discordant, n, p_lost + p_gained)
                      * sps.binom.pmf(lost, discordant, p_lost / (p_lost + p_gained)))


def t_false_alarms(n: int, discordant: float) -> float:
    """The exact false-alarm rate of the t test before at the tolerance: its rejections, summed."""
    lost, gained = outcomes(n)
    rejected = t_test_before(lost, gained, n, TOLERANCE) < ALPHA
    p_lost, p_gained = (discordant + TOLERANCE) / 2, (discordant - TOLERANCE) / 2
    return float(np.sum(trinomial(n, lost, gained, p_lost, p_gained) * rejected))


def exact_false_alarms(n: int, discordant: float) -> float:
    """The exact test's false-alarm rate at the tolerance, at this discordance: its region's probability."""
    if smallest_p(n, TOLERANCE) >= ALPHA:
        return 0.0
    return power(n, TOLERANCE, ALPHA, (discordant + TOLERANCE) / 2, (discordant - TOLERANCE) / 2)


def exact_size(n: int) -> float:
    """The largest false-alarm rate over every discordance (true drop at the tolerance)."""
    if smallest_p(n, TOLERANCE) >= ALPHA:
        return 0.0
    grid = np.linspace(TOLERANCE, 1.0, 981)
    return max(power(n, TOLERANCE, ALPHA, (q + TOLERANCE) / 2, (q - TOLERANCE) / 2) for q in grid)


def simulated_false_alarms(n: int, runs: int, discordant: float, seed: int) -> float:
    """Share of seeded rows at the tolerance that the gate's own p-values fail."""
    drops = draw_drops(np.random.default_rng(seed), (runs, n), TOLERANCE, discordant)
    p = exact_test(drops, TOLERANCE)["p_exceeds"]
    return float(np.mean(np.nan_to_num(p, nan=1.0) < ALPHA))


def print_sizes(runs: int) -> None:
    print(f"## One row of n independent pairs, true drop at the tolerance ({TOLERANCE}): false alarms "
          f"(alpha = {ALPHA})\n")
    print("| n | smallest p | exact test, largest over every discordance | exact, 10% discordant | exact, 30% | "
          f"simulated, 10% ({runs} runs) | t test before, 10% | t test before, 30% |")
    print("|---|---|---|---|---|---|---|---|")
    for n in SIZES:
        cells = [f"{smallest_p(n, TOLERANCE):.3g}", f"{exact_size(n):.4f}", f"{exact_false_alarms(n, 0.10):.4f}",
                 f"{exact_false_alarms(n, 0.30):.4f}", f"{simulated_false_alarms(n, runs, 0.10, seed=n):.4f}",
                 f"{t_false_alarms(n, 0.10):.4f}", f"{t_false_alarms(n, 0.30):.4f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")


# ---- detects under both alternatives -----------------------------------------------------------------

def measured_power(n: int, level: float, p_lost: float, p_gained: float, runs: int, seed: int) -> float:
    """Share of seeded rows the gate's own p-values reject at `level`."""
    drops = draw_rates(np.random.default_rng(seed), (runs, n), p_lost, p_gained)
    p = exact_test(drops, TOLERANCE)["p_exceeds"]
    return float(np.mean(np.nan_to_num(p, nan=1.0) < level))


def detects_row(n: int, discordant: float, level: float, runs: int, seed: int) -> list[str]:
    """Both alternatives' `detects` for a row with this discordance, and the power at each when the drop
    arrives in either way: measured on seeded rows (and, in brackets, the exact sum it estimates)."""
    count = round(discordant * n)
    cells = []
    for alternative in (PERSIST, TURN):
        shown = exact_detects(n, count, TOLERANCE, level, alternative)
        if not np.isfinite(shown):
            cells += ["cannot", "", ""]
            continue
        cells.append(f"{shown:.3f}")
        for arrives in (PERSIST, TURN):
            p_lost, p_gained = rates(arrives, count / n, shown)
            cells.append(f"{measured_power(n, level, p_lost, p_gained, runs, seed):.3f} "
                         f"({power(n, TOLERANCE, level, p_lost, p_gained):.3f})")
    return cells


def print_detects(runs: int) -> None:
    print(f"\n## 'detects' under both alternatives, and the power at each ({runs} runs each; the exact power in "
          "brackets)\n")
    print("Power measured when the drop arrives as the column says: `persist` (the row's ordinary "
          "disagreements stay and the drop comes on top), `turn` (disagreements turn against the candidate).\n")
    print("| n | discordant | level | detects (persist) | power if persist | power if turn | detects (turn) | "
          "power if persist | power if turn |\n|---|---|---|---|---|---|---|---|---|")
    for n in (10, 20, 50, 100, 200):
        for discordant in (0.10, 0.30):
            for level in (ALPHA, ALPHA / 5):
                cells = detects_row(n, discordant, level, runs, seed=n + int(discordant * 100))
                print(f"| {n} | {discordant:.0%} | {level:g} | " + " | ".join(cells) + " |")


# ---- per-cell gating: a bit sweep of documents ------------------------------------------------------

def sweep_runs(rng: np.random.Generator, runs: int, cell_drops: np.ndarray, discordant: float) -> np.ndarray:
    """(runs, documents, cells) drops: each document in every bit cell, with its own tendency."""
    tendency = rng.normal(0.0, TENDENCY, size=(runs, DOCUMENTS, 1))
    return draw_drops(rng, (runs, DOCUMENTS, len(cell_drops)), cell_drops, discordant, tendency)


def sweep_rows(drops: np.ndarray, max_drop: float) -> list[dict[str, np.ndarray]]:
    """The gate's rows of one sweep: all samples (clustered by document: the t test), then each cell
    (independent pairs: the exact test)."""
    pooled = bound_test(drops.sum(axis=-1), np.full(drops.shape[:-1], float(drops.shape[-1])), max_drop)
    return [pooled] + [exact_test(drops[..., c], max_drop) for c in range(drops.shape[-1])]


def check_against_decide(drops: np.ndarray, max_drop: float, failed: np.ndarray, runs: int = 3) -> None:
    """The first runs, through the gate's own decision function: the same verdicts."""
    documents = np.repeat(np.arange(drops.shape[1]), drops.shape[2]).tolist()
    for r in range(min(runs, drops.shape[0])):
        rows = [Measured("sim", "ok", drops[r].size, 0.0, 0.0, drops[r].ravel(), documents, "all", max_drop)]
        rows += [Measured("sim", "ok", drops.shape[1], 0.0, 0.0, drops[r, :, c], None, f"bits={b}", max_drop)
                 for c, b in enumerate(BITS)]
        got = [c.failed for c in decide(rows, ALPHA)]
        assert got == failed[r].tolist(), (r, got, failed[r])


def sweep(runs: int, cell_drops: list[float], discordant: float, max_drop: float, seed: int, decided: int = 3
          ) -> dict[str, float]:
    """Shares of runs failed: by the per-cell gate, by the pooled row alone (the gate before cells), by
    the last cell gated alone, and by the last cell's row within the per-cell gate (the first `decided`
    runs also through `gate.decide`)."""
    rng = np.random.default_rng(seed)
    drops = sweep_runs(rng, runs, np.asarray(cell_drops), discordant)
    rows = sweep_rows(drops, max_drop)
    failed, _ = gate(rows)
    check_against_decide(drops, max_drop, failed, decided)
    return {"per_cell": float(failed.any(axis=-1).mean()), "pooled": float((rows[0]["p_exceeds"] < ALPHA).mean()),
            "alone": float((rows[-1]["p_exceeds"] < ALPHA).mean()), "cell_row": float(failed[:, -1].mean())}


# ---- clustered rows, and the family of a small needle grid ---------------------------------------

def clustered_null(questions: int, cells: int, runs: int, max_drop: float, seed: int, use_clusters: bool = True,
                   chunk: int = 250) -> float:
    """Share of runs failed when no model is better but samples of one question (in many cells) are
    dependent: the pooled row, clustered by question or not (the t test either way)."""
    rng = np.random.default_rng(seed)
    fails = 0
    for start in range(0, runs, chunk):
        size = min(chunk, runs - start)
        tendency = rng.normal(0.0, 0.15, size=(size, questions, 1))
        drops = draw_drops(rng, (size, questions, cells), 0.0, 0.06, tendency)
        if use_clusters:
            test = bound_test(drops.sum(axis=-1), np.full((size, questions), float(cells)), max_drop)
        else:
            test = bound_test(drops.reshape(size, -1), np.ones((size, questions * cells)), max_drop)
        fails += int((test["p_exceeds"] < ALPHA).sum())
    return fails / runs


def small_grid(runs: int, cells: int, per_cell: int, discordant: float, seed: int) -> float:
    """Share of runs failed by a needle-like gate of `cells` cells of `per_cell` independent pairs and
    their pooled row, the true drop at the tolerance in every cell."""
    drops = draw_drops(np.random.default_rng(seed), (runs, cells, per_cell), TOLERANCE, discordant)
    rows = [exact_test(drops.reshape(runs, -1), TOLERANCE)] + [exact_test(drops[:, c], TOLERANCE)
                                                                for c in range(cells)]
    failed, _ = gate(rows)
    return float(failed.any(axis=-1).mean())


def print_false_alarms(runs: int) -> None:
    print(f"\n## Families and clusters: false alarms (alpha = {ALPHA}, {runs} runs each)\n")
    print("| situation | discordant | max-drop | gate fails |\n|---|---|---|---|")
    for discordant in (0.10, 0.30):
        rate = sweep(runs, [0.02] * 4, discordant, 0.02, seed=int(discordant * 100))["per_cell"]
        print(f"| per-cell gate, 4 bit cells x {DOCUMENTS} documents, true drop 0.02 in every cell | "
              f"{discordant:.0%} | 0.02 | {rate:.3f} |")
        rate = sweep(runs, [0.0] * 4, discordant, 0.0, seed=int(discordant * 100) + 1)["per_cell"]
        print(f"| per-cell gate, no difference in any cell | {discordant:.0%} | 0.0 | {rate:.3f} |")
        rate = sweep(runs, [0.02, 0.0, 0.0, 0.0], discordant, 0.02, seed=int(discordant * 100) + 2)["per_cell"]
        print(f"| per-cell gate, drop 0.02 in one cell, none elsewhere | {discordant:.0%} | 0.02 | {rate:.3f} |")
    for cells, per_cell in ((6, 2), (20, 10), (20, 50)):
        for discordant in (0.10, 0.30):
            rate = small_grid(runs, cells, per_cell, discordant, seed=cells * per_cell + int(discordant * 100))
            print(f"| {cells} cells x {per_cell} pairs and all {cells * per_cell}, true drop 0.02 in every cell | "
                  f"{discordant:.0%} | 0.02 | {rate:.3f} |")
    for max_drop in (0.02, 0.0):
        rate = clustered_null(250, 40, runs, max_drop, seed=7)
        print(f"| one row, no difference, 250 questions x 40 cells, clustered by question | 6% | {max_drop} | "
              f"{rate:.3f} |")
    naive = clustered_null(250, 40, runs, 0.0, seed=8, use_clusters=False)
    print(f"| the same, clusters ignored | 6% | 0.0 | {naive:.3f} |")


def print_one_cell(runs: int) -> None:
    print(f"\n## A 10-point drop in the 4-bit cell only ({DOCUMENTS} documents x 4 cells, max-drop 0.02, "
          f"{runs} runs)\n")
    print("| discordant | per-cell gate fails | its 4-bit row fails | pooled row alone (the gate before cells) | "
          "4-bit cell gated alone |\n|---|---|---|---|---|")
    for discordant in (0.10, 0.30):
        r = sweep(runs, [0.0, 0.0, 0.0, 0.10], discordant, 0.02, seed=40 + int(discordant * 100))
        print(f"| {discordant:.0%} | {r['per_cell']:.3f} | {r['cell_row']:.3f} | {r['pooled']:.3f} | "
              f"{r['alone']:.3f} |")


def print_power() -> None:
    print("\n## Power: the probability that one gated row of n independent pairs fails (exact, at alpha)\n")
    print("| discordant | n | max-drop | true drop 0.02 | 0.05 | 0.10 |\n|---|---|---|---|---|---|")
    for discordant in (0.10, 0.30):
        for max_drop in (0.02, 0.0):
            for n in (40, 250, 1000):
                values = [power(n, max_drop, ALPHA, (discordant + drop) / 2, (discordant - drop) / 2)
                          for drop in (0.02, 0.05, 0.10)]
                print(f"| {discordant:.0%} | {n} | {max_drop} | " + " | ".join(f"{v:.2f}" for v in values) + " |")


# ---- the ICL order test ------------------------------------------------------------------------------

def simulate_order_test(questions: int, permutations: int, runs: int, seed: int) -> tuple[float, float]:
    """(Cochran's Q, McNemar on the best vs the worst permutation): share of runs with p < alpha
    when the order does not matter."""
    rng = np.random.default_rng(seed)
    q_hits, mcnemar_hits = 0, 0
    for _ in range(runs):
        difficulty = rng.uniform(0.2, 0.9, size=(questions, 1))
        outcomes = (rng.random((questions, permutations)) < difficulty).astype(float)
        q_hits += cochran_q(outcomes)["p_value"] < ALPHA
        accuracy = outcomes.mean(axis=0)
        best, worst = int(accuracy.argmax()), int(accuracy.argmin())
        mcnemar_hits += mcnemar_exact(outcomes[:, best] > 0, outcomes[:, worst] > 0)["p_value"] < ALPHA
    return q_hits / runs, mcnemar_hits / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="simulated runs per setting")
    args = parser.parse_args()
    print_sizes(args.runs)
    print_detects(args.runs)
    print_false_alarms(args.runs)
    print_one_cell(args.runs)
    print_power()
    q_rate, mcnemar_rate = simulate_order_test(250, 10, args.runs, seed=9)
    print(f"\n## ICL order test: no order effect, 250 questions x 10 permutations ({args.runs} runs)\n")
    print("| test | P(p < 0.05) |\n|---|---|")
    print(f"| Cochran's Q across permutations | {q_rate:.3f} |")
    print(f"| McNemar, best vs worst permutation chosen after the fact | {mcnemar_rate:.3f} |")


if __name__ == "__main__":
    main()
