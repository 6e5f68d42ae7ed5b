"""Calibration and power of the regression gate (and of the ICL order test), by simulation.

    python benchmarks/simulate_gate.py              # the tables in docs/statistics.md (about 10 s on 2 cores)
    python benchmarks/simulate_gate.py --runs 500   # quicker, noisier

Every setting draws `--runs` seeded runs at once (numpy arrays of runs x samples)
and decides them with the gate's own statistics: `stats.bound_test` (the
cluster-robust one-sided t test of "true drop <= tolerance"), `stats.holm_steps`
(Holm over the gated rows, and the level each row was tested at) and
`stats.detectable_drop` ("detects"). The first runs of every per-cell setting are
also passed through `check.decide`, the gate's own decision function, and must
agree. Outcomes are paired pass/fail samples drawn with a known truth:

- a drop in {-1, 0, 1} per sample (baseline minus candidate), with a share of
  discordant pairs (10%: a strong model; 30%: common for weak ones) split so that
  the expected drop is the true drop;
- per-cell gating: a 16/8/6/4-bit sweep of 250 documents, each document in
  every cell with its own tendency to favour one model (symmetric: no effect on
  the true drop), so the pooled row is clustered by document;
- a drop confined to one cell, tested per cell and pooled (the gate before) and
  with that cell alone;
- "detects" against the power measured at the drop it shows, for one row and
  for families of 5 (per cell) and 12 rows.
"""

from __future__ import annotations

import argparse

import numpy as np

from evalsuite.analysis.gate import Measured, decide
from evalsuite.analysis.stats import bound_test, cochran_q, detectable_drop, holm_steps, mcnemar_exact

ALPHA = 0.05
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


def independent_test(drops: np.ndarray, max_drop: float) -> dict[str, np.ndarray]:
    """One row per run (runs x samples), every sample its own cluster."""
    return bound_test(drops, np.ones_like(drops), max_drop)


def gate(tests: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(failed, level) per run and row for rows tested together: Holm over them, as `check` does."""
    p = np.stack([t["p_exceeds"] for t in tests], axis=-1)
    adjusted, level = holm_steps(p, ALPHA)
    return adjusted < ALPHA, level


# ---- per-cell gating: a bit sweep of documents ------------------------------------------------

def sweep_runs(rng: np.random.Generator, runs: int, cell_drops: np.ndarray, discordant: float) -> np.ndarray:
    """(runs, documents, cells) drops: each document in every bit cell, with its own tendency."""
    tendency = rng.normal(0.0, TENDENCY, size=(runs, DOCUMENTS, 1))
    return draw_drops(rng, (runs, DOCUMENTS, len(cell_drops)), cell_drops, discordant, tendency)


def sweep_rows(drops: np.ndarray, max_drop: float) -> list[dict[str, np.ndarray]]:
    """The gate's rows of one sweep: all samples (clustered by document), then each cell."""
    pooled = bound_test(drops.sum(axis=-1), np.full(drops.shape[:-1], float(drops.shape[-1])), max_drop)
    return [pooled] + [independent_test(drops[..., c], max_drop) for c in range(drops.shape[-1])]


def check_against_decide(drops: np.ndarray, max_drop: float, failed: np.ndarray, runs: int = 20) -> None:
    """The first runs, through the gate's own decision function: the same verdicts and `detects`."""
    documents = np.repeat(np.arange(drops.shape[1]), drops.shape[2]).tolist()
    for r in range(min(runs, drops.shape[0])):
        rows = [Measured("sim", "ok", drops[r].size, 0.0, 0.0, drops[r].ravel(), documents, "all", max_drop)]
        rows += [Measured("sim", "ok", drops.shape[1], 0.0, 0.0, drops[r, :, c], None, f"bits={b}", max_drop)
                 for c, b in enumerate(BITS)]
        got = [c.failed for c in decide(rows, ALPHA)]
        assert got == failed[r].tolist(), (r, got, failed[r])


def sweep(runs: int, cell_drops: list[float], discordant: float, max_drop: float, seed: int) -> dict[str, float]:
    """Shares of runs failed: by the per-cell gate, by the pooled row alone (the gate before), by the
    last cell gated alone, and by the last cell's row within the per-cell gate."""
    rng = np.random.default_rng(seed)
    drops = sweep_runs(rng, runs, np.asarray(cell_drops), discordant)
    rows = sweep_rows(drops, max_drop)
    failed, _ = gate(rows)
    check_against_decide(drops, max_drop, failed)
    return {"per_cell": float(failed.any(axis=-1).mean()), "pooled": float((rows[0]["p_exceeds"] < ALPHA).mean()),
            "alone": float((rows[-1]["p_exceeds"] < ALPHA).mean()), "cell_row": float(failed[:, -1].mean())}


# ---- "detects" against measured power -----------------------------------------------------------

def family_rows(rng: np.random.Generator, runs: int, family: int, drop: float, discordant: float, max_drop: float,
                n: int) -> list[dict[str, np.ndarray]]:
    """`family` rows tested together: the first with a true drop `drop`, the others at no drop, or the
    bit sweep's rows (`family` 5) with the drop in its 4-bit cell."""
    if family == 5:
        return sweep_rows(sweep_runs(rng, runs, np.array([0.0, 0.0, 0.0, drop]), discordant), max_drop)[::-1]
    drops = draw_drops(rng, (family, runs, n), np.array([drop] + [0.0] * (family - 1))[:, None, None], discordant)
    return [independent_test(d, max_drop) for d in drops]


def shown_detects(runs: int, family: int, drop: float, discordant: float, max_drop: float, n: int, seed: int
                  ) -> tuple[float, float]:
    """(mean 'detects' shown on the dropped row, share of runs in which that row fails)."""
    rows = family_rows(np.random.default_rng(seed), runs, family, drop, discordant, max_drop, n)
    failed, level = gate(rows)
    detects = detectable_drop(rows[0], max_drop, level[:, 0])
    return float(np.nanmean(detects)), float(failed[:, 0].mean())


def detects_power(runs: int, family: int, discordant: float, max_drop: float = 0.02, n: int = DOCUMENTS,
                  seed: int = 0) -> tuple[float, float]:
    """The drop a row shows as 'detects' when that is its true drop (a fixed point, three steps from the
    tolerance), and the power measured there on fresh runs."""
    drop = max_drop
    for step in range(3):
        drop = shown_detects(runs, family, drop, discordant, max_drop, n, seed + step)[0]
    return drop, shown_detects(runs, family, drop, discordant, max_drop, n, seed + 10)[1]


# ---- single rows: the power table and independent / clustered false alarms ---------------------------

def pooled_rate(runs: int, n: int, true_drop: float, max_drop: float, discordant: float, seed: int) -> float:
    """Share of runs failed by one gated row of n independent pairs."""
    drops = draw_drops(np.random.default_rng(seed), (runs, n), true_drop, discordant)
    return float((independent_test(drops, max_drop)["p_exceeds"] < ALPHA).mean())


def simulate_false_alarms(n: int, runs: int, true_drop: float, max_drop: float, seed: int,
                          discordant: float = 0.10) -> float:
    """Share of runs the gate fails on independent pairs whose true drop is `true_drop` (one row)."""
    return pooled_rate(runs, n, true_drop, max_drop, discordant, seed)


def clustered_null(questions: int, cells: int, runs: int, max_drop: float, seed: int, use_clusters: bool = True,
                   chunk: int = 250) -> float:
    """Share of runs failed when no model is better but samples of one question (in many cells) are
    dependent: the pooled row, clustered by question or not."""
    rng = np.random.default_rng(seed)
    fails = 0
    for start in range(0, runs, chunk):
        size = min(chunk, runs - start)
        tendency = rng.normal(0.0, 0.15, size=(size, questions, 1))
        drops = draw_drops(rng, (size, questions, cells), 0.0, 0.06, tendency)
        if use_clusters:
            test = bound_test(drops.sum(axis=-1), np.full((size, questions), float(cells)), max_drop)
        else:
            test = independent_test(drops.reshape(size, -1), max_drop)
        fails += int((test["p_exceeds"] < ALPHA).sum())
    return fails / runs


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


# ---- the tables -------------------------------------------------------------------------------------

def print_false_alarms(runs: int) -> None:
    print(f"## False alarms (alpha = {ALPHA}, {runs} runs each; must stay at or below {ALPHA + 0.01:.2f})\n")
    print("| situation | discordant | max-drop | gate fails |\n|---|---|---|---|")
    for discordant in (0.10, 0.30):
        rate = sweep(runs, [0.02] * 4, discordant, 0.02, seed=int(discordant * 100))["per_cell"]
        print(f"| per-cell gate, 4 bit cells x {DOCUMENTS} documents, true drop 0.02 in every cell | "
              f"{discordant:.0%} | 0.02 | {rate:.3f} |")
        rate = sweep(runs, [0.0] * 4, discordant, 0.0, seed=int(discordant * 100) + 1)["per_cell"]
        print(f"| per-cell gate, no difference in any cell | {discordant:.0%} | 0.0 | {rate:.3f} |")
        rate = sweep(runs, [0.02, 0.0, 0.0, 0.0], discordant, 0.02, seed=int(discordant * 100) + 2)["per_cell"]
        print(f"| per-cell gate, drop 0.02 in one cell, none elsewhere | {discordant:.0%} | 0.02 | {rate:.3f} |")
    for n in (250, 1000):
        rate = simulate_false_alarms(n, runs, true_drop=0.02, max_drop=0.02, seed=n)
        print(f"| one row, {n} independent pairs, true drop exactly at the tolerance | 10% | 0.02 | {rate:.3f} |")
    for max_drop in (0.02, 0.0):
        rate = clustered_null(250, 40, runs, max_drop, seed=7)
        print(f"| one row, no difference, 250 questions x 40 cells, clustered by question | 6% | {max_drop} | "
              f"{rate:.3f} |")
    naive = clustered_null(250, 40, runs, 0.0, seed=8, use_clusters=False)
    print(f"| the same, clusters ignored | 6% | 0.0 | {naive:.3f} |")


def print_one_cell(runs: int) -> None:
    print(f"\n## A 10-point drop in the 4-bit cell only ({DOCUMENTS} documents x 4 cells, max-drop 0.02, "
          f"{runs} runs)\n")
    print("| discordant | per-cell gate fails | its 4-bit row fails | pooled row alone (the gate before) | "
          "4-bit cell gated alone |\n|---|---|---|---|---|")
    for discordant in (0.10, 0.30):
        r = sweep(runs, [0.0, 0.0, 0.0, 0.10], discordant, 0.02, seed=40 + int(discordant * 100))
        print(f"| {discordant:.0%} | {r['per_cell']:.3f} | {r['cell_row']:.3f} | {r['pooled']:.3f} | "
              f"{r['alone']:.3f} |")


def print_detects(runs: int) -> None:
    print(f"\n## 'detects' against measured power ({runs} runs each; the measured power must be 0.80 +- 0.05)\n")
    print("| rows gated together | discordant | detects (true drop) | measured power |\n|---|---|---|---|")
    labels = {1: "1 (one metric)", 5: "5 (all + 4 bit cells)", 12: "12 (independent rows)"}
    for family in (1, 5, 12):
        for discordant in (0.10, 0.30):
            drop, power = detects_power(runs, family, discordant, seed=100 * family + int(discordant * 100))
            print(f"| {labels[family]} | {discordant:.0%} | {drop:.3f} | {power:.3f} |")


def print_power(runs: int) -> None:
    print(f"\n## Power: share of runs failed, one gated row of n independent pairs ({runs} runs each)\n")
    print("| discordant | n | max-drop | true drop 0.02 | 0.05 | 0.10 |\n|---|---|---|---|---|---|")
    for discordant in (0.10, 0.30):
        for max_drop in (0.02, 0.0):
            for n in (40, 250, 1000):
                rates = [pooled_rate(runs, n, drop, max_drop, discordant, seed=1000 + n + int(drop * 100))
                         for drop in (0.02, 0.05, 0.10)]
                print(f"| {discordant:.0%} | {n} | {max_drop} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="simulated runs per setting")
    args = parser.parse_args()
    print_false_alarms(args.runs)
    print_one_cell(args.runs)
    print_detects(args.runs)
    print_power(args.runs)
    q_rate, mcnemar_rate = simulate_order_test(250, 10, args.runs, seed=9)
    print(f"\n## ICL order test: no order effect, 250 questions x 10 permutations ({args.runs} runs)\n")
    print("| test | P(p < 0.05) |\n|---|---|")
    print(f"| Cochran's Q across permutations | {q_rate:.3f} |")
    print(f"| McNemar, best vs worst permutation chosen after the fact | {mcnemar_rate:.3f} |")


if __name__ == "__main__":
    main()
