"""`evalsuite check`: the regression gate, per cell, with Holm-level bounds, tolerances per metric, and
refusals of a check that would pass on nothing."""

from __future__ import annotations

import json
import math
import shutil
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import invoke
from scipy import stats as sps

from evalsuite.analysis.check import check
from evalsuite.analysis.exact import p_exceeds
from evalsuite.analysis.gate import Measured, check_pair, decide
from evalsuite.analysis.outcomes import Outcomes, export_baseline, load_outcomes
from evalsuite.analysis.power import PERSIST, TURN, rates
from evalsuite.analysis.stats import holm
from evalsuite.analysis.tolerances import parse_max_drop
from evalsuite.errors import UserError
from evalsuite.runs.records import open_run
from evalsuite.tasks.needle.task import Needle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from test_compare import needle_run, pass_fail_pair, synthetic_run

SMALL_NEEDLE = {"lengths": "1024", "depths": "0,1", "samples": "6", "tokens_per_query": "8"}
NEEDLE_CELLS = ["all", "context_length=1024, depth=0.0", "context_length=1024, depth=1.0"]


def rows(result) -> list[tuple[str, str, str]]:
    return [(c.metric, c.cell, c.verdict) for c in result.checks]


def test_a_run_passes_against_itself_gating_the_primary_metric_per_cell(tmp_path, capsys):
    run = needle_run(tmp_path, "fake:oracle", SMALL_NEEDLE)
    code, out, err = invoke(capsys, "check", str(run), "--baseline", str(run))
    assert code == 0, out + err
    assert "## evalsuite check: PASS" in out
    result = check(run, run)
    assert rows(result) == [("correct_all", cell, "ok") for cell in NEEDLE_CELLS]
    assert [c.metric for c in result.reported] == list(Needle.metrics[1:])  # reported, not gated
    assert out.count("| ok |") == 3 and "Reported, not gated" in out


def test_a_random_checkpoint_fails_against_the_baseline(capsys, tmp_path, tiny_models, monkeypatch):
    baseline = needle_run(tmp_path, "fake:oracle", SMALL_NEEDLE)
    candidate = needle_run(tmp_path, str(tiny_models["base"]), SMALL_NEEDLE)  # randomly initialised
    summary_file = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    junit = tmp_path / "check.xml"
    result = invoke(capsys, "check", str(candidate), "--baseline", str(baseline), "--junit", str(junit))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL (3 regressions)" in result.stdout
    assert "| needle-tiny-base" in result.stdout and "**REGRESSION**" in result.stdout
    assert summary_file.read_text().strip() == result.stdout.strip()
    root = ET.parse(junit).getroot()
    assert root.get("tests") == "3" and root.get("failures") == "3"
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["correct_all", *(f"correct_all [{c}]" for c in NEEDLE_CELLS[1:])]
    assert all(c.find("failure") is not None for c in cases)


def cluster_robust_p(drop: np.ndarray, max_drop: float) -> float:
    """The gate's p-value computed by hand: independent samples, t on n - 1 degrees of freedom."""
    n = drop.size
    se = np.sqrt(np.sum((drop - drop.mean()) ** 2) * n / (n - 1)) / n
    return float(sps.t.sf((drop.mean() - max_drop) / se, n - 1))


def test_a_drop_within_noise_passes(tmp_path):
    # 200 paired samples: the candidate lost 8 and gained 2, a drop of 0.03 > max-drop 0.02,
    # which these samples cannot tell from a drop of 0.02
    base, cand = pass_fail_pair(only_a=8, only_b=2, both=150, neither=40)
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    result = check(run_c, run_b, max_drop=0.02, alpha=0.05)
    (row,) = result.checks
    assert row.exact and row.drop == pytest.approx(0.03) and row.p_value == pytest.approx(p_exceeds(8, 2, 200, 0.02))
    assert row.p_value > 0.2 and row.low < 0.02 < row.drop
    assert row.verdict == "drop within noise" and not result.failed
    assert row.detectable > 0.05  # 200 samples cannot see a drop just past the tolerance


def test_a_significant_drop_beyond_tolerance_fails(tmp_path):
    base, cand = pass_fail_pair(only_a=15, only_b=1, both=150, neither=34)
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    (row,) = check(run_c, run_b).checks
    assert row.drop == pytest.approx(0.07)
    assert row.p_value == pytest.approx(p_exceeds(15, 1, 200, 0.02)) and row.p_value < 0.01
    assert row.failed and row.verdict == "REGRESSION" and row.low > 0.02
    # the same drop is tolerated with a wider margin
    assert not check(run_c, run_b, max_drop=0.1).failed


def test_a_significant_drop_within_tolerance_passes(tmp_path):
    base, cand = pass_fail_pair(only_a=60, only_b=0, both=3000, neither=940)
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    (row,) = check(run_c, run_b, max_drop=0.02).checks
    assert row.drop == pytest.approx(0.015) and row.p_value > 0.5
    assert row.verdict == "ok" and not row.failed
    # and a release gate accepts it: the upper bound shows the drop is within 0.02
    (release,) = check(run_c, run_b, max_drop=0.02, require_non_inferiority=True).checks
    assert release.high < 0.02 and not release.failed and release.verdict == "within tolerance"


def test_non_inferiority_needs_evidence_not_just_a_small_drop(tmp_path):
    base, cand = pass_fail_pair(only_a=1, only_b=0, both=20, neither=19)  # n=40, drop 0.025
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    assert not check(run_c, run_b, max_drop=0.05).failed  # no evidence of a regression...
    (row,) = check(run_c, run_b, max_drop=0.05, require_non_inferiority=True).checks
    assert row.failed and row.verdict == "NOT SHOWN WITHIN TOLERANCE"  # ...nor of non-inferiority


def test_continuous_metrics_fail_on_a_real_drop_only(tmp_path):
    rng = np.random.default_rng(7)
    base = rng.uniform(0.3, 0.7, size=80)
    worse = base - 0.05 + rng.normal(0, 0.01, size=80)
    noisy = base + rng.normal(0, 0.01, size=80)
    run_b = synthetic_run(tmp_path / "base", "B", {"rouge": base.tolist()})
    failing = check(synthetic_run(tmp_path / "worse", "W", {"rouge": worse.tolist()}), run_b)
    assert failing.checks[0].failed and failing.checks[0].p_value < 0.001
    passing = check(synthetic_run(tmp_path / "noisy", "N", {"rouge": noisy.tolist()}), run_b)
    assert not passing.failed and abs(passing.checks[0].drop) < 0.01


def test_clusters_are_resampled_whole(tmp_path):
    """Forty copies of ten questions: as independent samples the drop looks certain; as ten
    clusters it is the noise it is."""
    base, cand = pass_fail_pair(only_a=3, only_b=1, both=4, neither=2)
    ids = tuple(f"q{q}-c{c}" for c in range(40) for q in range(10))
    config = {"task": "t", "params": {}}

    def outcomes(values: list[bool], clusters: tuple | None) -> Outcomes:
        return Outcomes(name="r", run="r", config=config, ids=ids, scores={"ok": tuple(int(v) for v in values * 40)},
                        clusters=clusters)

    questions = tuple(f"q{q}" for c in range(40) for q in range(10))
    (independent,) = check_pair(outcomes(cand, None), outcomes(base, None), max_drop=0.0, alpha=0.05)
    (clustered,) = check_pair(outcomes(cand, questions), outcomes(base, questions), max_drop=0.0, alpha=0.05)
    assert independent.drop == clustered.drop == pytest.approx(0.2)
    assert independent.failed and not clustered.failed
    assert clustered.clusters == 10 and clustered.low < independent.low


def test_holm_adjusts_over_the_metrics_of_one_check(tmp_path):
    rng = np.random.default_rng(3)
    values = {m: rng.random(300).tolist() for m in ("a", "b", "c")}
    worse = {m: (np.array(v) - (0.045 if m == "a" else 0.0)).tolist() for m, v in values.items()}
    run_b = synthetic_run(tmp_path / "base", "B", values)
    result = check(synthetic_run(tmp_path / "cand", "C", worse), run_b, max_drop=0.0)
    raw = cluster_robust_p(np.array(values["a"]) - np.array(worse["a"]), 0.0)
    assert result.checks[0].p_value == pytest.approx(min(1.0, 3 * raw))


# ---- cells ----------------------------------------------------------------------------------

BITS = (16, 8, 6, 4)


def sweep_outcomes(drop_in_4bit: int, seed: int = 0, documents: int = 250) -> tuple[Outcomes, Outcomes]:
    """A bit sweep: each document in every cell; the candidate loses `drop_in_4bit` of the 4-bit
    cell's passes (and 4 in each cell, gaining 4, everywhere: noise)."""
    rng = np.random.default_rng(seed)
    base = rng.random((documents, len(BITS))) < 0.7
    cand = base.copy()
    for c in range(len(BITS)):
        flip = rng.permutation(documents)
        passed, failed = [d for d in flip if base[d, c]], [d for d in flip if not base[d, c]]
        lose = 4 + (drop_in_4bit if BITS[c] == 4 else 0)
        cand[passed[:lose], c] = False
        cand[failed[:4], c] = True
    ids = tuple(f"d{d}-b{b}" for d in range(documents) for b in BITS)
    common = dict(config={"task": "sweep", "params": {}}, ids=ids, clusters=tuple(f"d{d}" for d in range(documents)
                  for _ in BITS), cells=tuple(f"bits={b}" for _ in range(documents) for b in BITS), gated=("acc",))
    return (Outcomes(name="sweep", run="c", scores={"acc": tuple(cand.ravel().astype(int))}, **common),
            Outcomes(name="sweep", run="b", scores={"acc": tuple(base.ravel().astype(int))}, **common))


def test_a_drop_confined_to_one_cell_fails_the_gate_that_the_pooled_mean_passes():
    cand, base = sweep_outcomes(drop_in_4bit=30)  # 12 points in the 4-bit cell, 3 points pooled
    checks = {c.cell: c for c in check_pair(cand, base, max_drop=0.02)}
    assert list(checks) == ["all", "bits=16", "bits=8", "bits=6", "bits=4"]
    assert checks["all"].drop == pytest.approx(30 / 1000) and not checks["all"].failed
    assert checks["bits=4"].drop == pytest.approx(30 / 250) and checks["bits=4"].failed
    assert [c.failed for c in checks.values()] == [False, False, False, False, True]
    assert checks["all"].clusters == 250 and checks["bits=4"].clusters == 250


@pytest.mark.parametrize("seed", range(6))
def test_bounds_and_detects_are_at_the_holm_level_each_row_was_tested_at(seed):
    """Table-driven over seeded sweeps: a row fails exactly when its one-sided bound at its own level
    lies past the tolerance, so no bound past the tolerance stands beside 'within noise'."""
    cand, base = sweep_outcomes(drop_in_4bit=10 * seed, seed=seed)
    checks = check_pair(cand, base, max_drop=0.02)
    levels = sorted(c.level for c in checks)
    failed = sum(c.failed for c in checks)
    m = len(checks)
    assert levels[0] == pytest.approx(0.05 / m)  # the first step is Bonferroni's
    steps = [0.05 / (m - r) for r in range(failed + 1)]  # Holm's steps up to where it stopped
    assert all(any(c.level == pytest.approx(step) for step in steps) for c in checks)
    for c in checks:
        assert c.failed == (c.low > c.max_drop), c
        if c.clusters < c.n:  # clustered rows keep the closed form; single cells are simulated (below)
            se = (c.high - c.low) / 2 / sps.t.ppf(1 - c.level, c.clusters - 1)
            assert c.detectable == pytest.approx(0.02 + (sps.t.ppf(1 - c.level, c.clusters - 1)
                                                        + sps.t.ppf(0.8, c.clusters - 1)) * se)


def measured_power(n: int, level: float, p_lost: float, p_gained: float, runs: int = 4000, seed: int = 11) -> float:
    """Fresh rows of n independent pairs, lost and gained with these probabilities, each decided by the
    gate's own p-value: the share it fails at `level`."""
    u = np.random.default_rng(seed).random((runs, n))
    lost, gained = (u < p_lost).sum(axis=1), ((u >= p_lost) & (u < p_lost + p_gained)).sum(axis=1)
    p = {pair: p_exceeds(*pair, n, 0.02) for pair in set(zip(lost.tolist(), gained.tolist()))}
    return float(np.mean([p[pair] < level for pair in zip(lost.tolist(), gained.tolist())]))


@pytest.mark.parametrize("alpha", [0.05, 0.0125])
def test_detects_is_the_drop_caught_with_80_percent_power_under_the_alternative_it_names(alpha):
    """50 pairs, 10% discordant. Each alternative's `detects` is caught 80% of the time when the drop
    arrives that way, and is the smallest such drop; the one that assumes every disagreement turns
    against the candidate is caught far less often when ordinary disagreements persist, which is why
    the table shows the other."""
    drop = np.zeros(50)
    drop[:4], drop[4] = 1.0, -1.0
    (row,) = decide([Measured("s", "ok", 50, 0.70, 0.64, drop, None, "all", 0.02)], alpha=alpha)
    assert not row.failed and row.alternative == PERSIST and row.detectable == row.detects_persist
    for alternative, shown in ((PERSIST, row.detects_persist), (TURN, row.detects_turn)):
        assert measured_power(50, row.level, *rates(alternative, 0.1, shown)) >= 0.78
        assert measured_power(50, row.level, *rates(alternative, 0.1, shown - 0.02)) < 0.8
    assert row.detects_turn < row.detects_persist
    assert measured_power(50, row.level, *rates(PERSIST, 0.1, row.detects_turn)) < 0.6


def test_detects_names_its_alternative_in_the_table(tmp_path):
    base, cand = pass_fail_pair(only_a=4, only_b=1, both=30, neither=15)
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    shown = check(run_c, run_b)
    (row,) = shown.checks
    assert "| detects (ordinary disagreements persist) |" in shown.markdown()
    assert f"| {row.detects_persist:.3f} |" in shown.markdown()
    turned = check(run_c, run_b, alternative=TURN)
    assert "| detects (disagreements turn against the candidate) |" in turned.markdown()
    assert f"| {row.detects_turn:.3f} |" in turned.markdown() and turned.checks[0].detectable == row.detects_turn
    assert f"detects {row.detects_persist:.3f} if ordinary disagreements persist, {row.detects_turn:.3f} if " \
        "disagreements turn" in ET.tostring(shown.junit().getroot(), encoding="unicode")
    with pytest.raises(UserError, match="unknown alternative 'worst'"):
        check(run_c, run_b, alternative="worst")


def test_the_command_line_chooses_the_alternative_detects_shows(tmp_path, capsys):
    base, cand = pass_fail_pair(only_a=4, only_b=1, both=30, neither=15)
    run_b = synthetic_run(tmp_path / "base", "B", {"ok": base})
    run_c = synthetic_run(tmp_path / "cand", "C", {"ok": cand})
    code, out, _ = invoke(capsys, "check", str(run_c), "--baseline", str(run_b), "--detects", "turn")
    assert code == 0 and "| detects (disagreements turn against the candidate) |" in out
    code, out, _ = invoke(capsys, "check", str(run_c), "--baseline", str(run_b))
    assert code == 0 and "| detects (ordinary disagreements persist) |" in out


def test_a_row_that_cannot_catch_any_drop_says_so():
    drop = np.zeros(6)
    result_rows = decide([Measured("s", "ok", 6, 0.5, 0.5, drop, None, "all", 1.0)], alpha=0.05)
    assert result_rows[0].detectable == math.inf
    from evalsuite.analysis.check import _num

    assert _num(result_rows[0].detectable) == "none (cannot)"


def test_the_gate_holds_its_level_per_cell_and_at_every_n():
    """Seeded, smaller versions of benchmarks/simulate_gate.py's tables (2,000 runs there, 150 to 400 here)."""
    from simulate_gate import SIZES, exact_false_alarms, exact_size, small_grid, sweep

    for cells, per_cell in ((6, 2), (20, 10)):  # the true drop at the tolerance in every cell
        assert small_grid(400, cells, per_cell, 0.30, seed=3) <= 0.05 + 0.03
    one_cell = sweep(150, [0.0, 0.0, 0.0, 0.10], 0.10, 0.02, seed=4, decided=1)
    assert one_cell["per_cell"] > 0.75 and one_cell["pooled"] < 0.2  # the pooled row alone missed it
    for n in [n for n in SIZES if n <= 200]:  # the exact false-alarm rates at the tolerance, summed
        assert exact_false_alarms(n, 0.10) <= 0.05 and exact_false_alarms(n, 0.30) <= 0.05, n
    assert all(exact_size(n) <= 0.05 for n in (5, 8, 20))  # over every discordance


def test_decide_in_the_simulation_and_in_the_gate_agree():
    from simulate_gate import sweep_rows, sweep_runs

    drops = sweep_runs(np.random.default_rng(2), 3, np.array([0.0, 0.0, 0.0, 0.15]), 0.10)
    tests = sweep_rows(drops, 0.02)
    documents = np.repeat(np.arange(drops.shape[1]), 4).tolist()
    measured = [Measured("s", "ok", drops[0].size, 0.0, 0.0, drops[0].ravel(), documents, "all", 0.02)]
    measured += [Measured("s", "ok", 250, 0.0, 0.0, drops[0, :, c], None, f"bits={b}", 0.02) for c, b in enumerate(BITS)]
    assert [c.p_value for c in decide(measured, 0.05)] == pytest.approx(holm([t["p_exceeds"][0] for t in tests]))


# ---- small cells: an exact test, never certainty from no spread --------------------------------------

GRID_OF_TWELVE = {"lengths": "1024,2048", "depths": "0,0.5,1", "samples": "2", "tokens_per_query": "8"}


def with_cell_wrong(good: Path, wrong: Path, folder: Path, cell: dict[str, float] | None) -> Path:
    """A copy of run `good` whose samples in `cell` (every sample, for None) carry the answers and scores
    of run `wrong` (the same plan, another model): a candidate right everywhere but there."""
    shutil.copytree(good, folder)
    copy, answers = open_run(folder), {r.id: r for r in open_run(wrong).read_records()}

    def inside(record) -> bool:
        return cell is None or all(record.axes[axis] == value for axis, value in cell.items())

    copy.replace_records([replace(r, outputs=answers[r.id].outputs, scores=answers[r.id].scores) if inside(r) else r
                          for r in copy.read_records()])
    return folder


def test_two_samples_of_one_cell_flipped_do_not_fail_and_all_twelve_do(tmp_path, capsys):
    """12 samples in 6 cells of 2. Both samples of one cell going from right to wrong showed p = 0 and
    bounds [+1.000, +1.000] under the t test (no spread) and failed; the exact test gives that cell
    p >= 0.26 at best, so it is not testable, and the pooled drop of 0.167 is within noise."""
    good = needle_run(tmp_path / "good", "fake:oracle", GRID_OF_TWELVE)
    wrong = needle_run(tmp_path / "wrong", "fake:wrong", GRID_OF_TWELVE)
    one_cell = with_cell_wrong(good, wrong, tmp_path / "one-cell", {"context_length": 1024, "depth": 0.5})
    code, out, err = invoke(capsys, "check", str(one_cell), "--baseline", str(good))
    assert code == 0 and "## evalsuite check: PASS" in out, out + err
    result = check(one_cell, good)
    rows_by_cell = {c.cell: c for c in result.checks}
    assert len(rows_by_cell) == 7 and rows_by_cell["all"].drop == pytest.approx(2 / 12)
    assert rows_by_cell["all"].verdict == "drop within noise" and rows_by_cell["all"].p_value > 0.05
    flipped = rows_by_cell["context_length=1024, depth=0.5"]
    assert flipped.drop == 1.0 and flipped.verdict == "not testable (n = 2: p >= 0.26 at best)"
    assert math.isnan(flipped.p_value) and flipped.detectable == math.inf and not flipped.failed
    line = next(line for line in out.splitlines() if "| context_length=1024, depth=0.5 |" in line)
    assert "| +1.000 [n/a, n/a] |" in line and "| none (cannot) |" in line and "0.795" not in line
    assert "Holm's step-down over the 1 testable gated rows" in out
    release = check(good, good, require_non_inferiority=True)  # nor can 12 samples show a drop within 0.02
    assert all(c.failed for c in release.checks) and release.checks[0].verdict == "NOT SHOWN WITHIN TOLERANCE"
    assert {c.verdict for c in release.checks[1:]} == {"not testable (n = 2: p >= 0.24 at best)"}
    everything = with_cell_wrong(good, wrong, tmp_path / "all-wrong", None)
    code, out, err = invoke(capsys, "check", str(everything), "--baseline", str(good))
    assert code == 1 and "## evalsuite check: FAIL (1 regression)" in out, out + err
    (failed,) = check(everything, good).failed
    assert failed.cell == "all" and failed.drop == 1.0 and failed.p_value == pytest.approx(0.51 ** 12)


# ---- tolerances and gated metrics ---------------------------------------------------------------

@pytest.mark.parametrize("values, default, by_metric", [
    ((), 0.02, {}),
    (("0.05",), 0.05, {}),
    (("nll=0.1",), 0.02, {"nll": 0.1}),
    (("nll=0.1", "0.01", "acc=0"), 0.01, {"nll": 0.1, "acc": 0.0}),
])
def test_max_drop_parses_a_default_and_per_metric_values(values, default, by_metric):
    parsed = parse_max_drop(values)
    assert parsed.default == default and dict(parsed.by_metric) == by_metric


def test_each_metric_has_its_own_tolerance(tmp_path, capsys):
    rng = np.random.default_rng(5)
    base = {"acc": rng.random(400).tolist(), "nats": (2 + rng.random(400)).tolist()}
    cand = {"acc": base["acc"], "nats": (np.array(base["nats"]) - 0.3).tolist()}  # a 0.3-nat drop, no noise
    run_b = synthetic_run(tmp_path / "b", "B", base)
    run_c = synthetic_run(tmp_path / "c", "C", cand)
    code, out, _ = invoke(capsys, "check", str(run_c), "--baseline", str(run_b))
    assert code == 1 and "| nats | all |" in out
    code, out, err = invoke(capsys, "check", str(run_c), "--baseline", str(run_b), "--max-drop", "nats=0.5")
    assert code == 0, out + err
    assert "| nats | all | 400 | " in out and "| 0.5 |" in out and "tolerance 0.02; nats 0.5" in out


def test_metric_gates_a_reported_metric_per_cell(tmp_path, capsys):
    run = needle_run(tmp_path, "fake:oracle", SMALL_NEEDLE)
    second = Needle.metrics[1]
    result = check(run, run, metrics=[second])
    assert [(c.metric, c.cell) for c in result.checks] == [(m, cell) for m in ("correct_all", second)
                                                            for cell in NEEDLE_CELLS]
    assert second not in [c.metric for c in result.reported]
    code, out, _ = invoke(capsys, "check", str(run), "--baseline", str(run), "--metric", second)
    assert code == 0 and f"| {second} | context_length=1024, depth=1.0 |" in out


# ---- refusals: never a pass on nothing -----------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ([None, None, None], "ok has no paired numeric values"),
    (["yes", "no", "maybe"], "ok has no paired numeric values"),
    ([float("inf"), float("-inf"), float("inf")], "ok has no paired numeric values"),
    ([1.0, None, None], "ok is not testable (n = 1)"),
])
def test_a_gated_metric_with_nothing_to_test_exits_2(tmp_path, capsys, values, message):
    run_b = synthetic_run(tmp_path / "b", "B", {"ok": [1.0, 0.5, 0.2], "other": [1.0, 0.5, 0.2]})
    run_c = synthetic_run(tmp_path / "c", "C", {"ok": values, "other": [1.0, 0.5, 0.2]})
    code, out, err = invoke(capsys, "check", str(run_c), "--baseline", str(run_b))
    assert code == 2 and "PASS" not in out
    assert message in err and len(err.strip().splitlines()) == 1


def judged_file(path: Path, values: list[float | None], errors: dict[str, str] | None = None) -> Path:
    ids = tuple(f"s{i}" for i in range(len(values)))
    outcome = Outcomes(name="halluc", run="r", config={"task": "t", "params": {}}, ids=ids,
                       scores={"empty_output": (0,) * len(values), "judged_lexical": tuple(values)},
                       errors=errors or {}, lower_is_better=("empty_output",), gated=("empty_output", "judged_lexical"),
                       side=("judged_lexical",))
    export_baseline([outcome], path, "test")
    return path


def test_unjudged_samples_are_refused_unless_allowed(tmp_path, capsys):
    base = judged_file(tmp_path / "base.json", [1, 1, 0, 1, 0, 1] * 2)
    cand = judged_file(tmp_path / "cand.json", [1, None, 0, None, 0, 1] * 2)
    code, out, err = invoke(capsys, "check", str(cand), "--baseline", str(base))
    assert code == 2 and "halluc: 4 samples have no judged_lexical value" in err
    assert "--allow-unjudged" in err and len(err.strip().splitlines()) == 1
    code, out, err = invoke(capsys, "check", str(cand), "--baseline", str(base), "--allow-unjudged")
    assert code == 0, err
    assert "| judged_lexical | all | 8 |" in out and "4 unjudged samples left out of judged_lexical" in out
    # a sample whose generation failed is a fail, not an unjudged sample
    failed = judged_file(tmp_path / "failed.json", [1, None, 0, 1, 0, 1] * 2, errors={"s1": "timeout", "s7": "timeout"})
    assert check(failed, base).checks[1].n == 12


@pytest.mark.parametrize("args, message", [
    (["--baseline", "{missing}"], "no such run folder, suite result or baseline file"),
    (["--baseline", "{run}", "--alpha", "1.5"], "--alpha must be between 0 and 1"),
    (["--baseline", "{run}", "--max-drop", "-0.1"], "--max-drop must be zero or more"),
    (["--baseline", "{run}", "--max-drop", "ok=-1"], "--max-drop must be zero or more, got ok=-1"),
    (["--baseline", "{run}", "--max-drop", "ok="], "--max-drop takes a number or metric=number"),
    (["--baseline", "{run}", "--max-drop", "okk=0.1"], "no run of this check has the metric 'okk'"),
    (["--baseline", "{run}", "--metric", "nope"], "no run of this check has the metric 'nope'"),
    ([], "check needs --baseline"),
    (["--baseline", "{junk}"], "neither a run folder nor a readable JSON file"),
])
def test_bad_input_exits_2(tmp_path, capsys, args, message):
    run = synthetic_run(tmp_path / "run", "A", {"ok": [True, False]})
    (tmp_path / "junk.json").write_text("not json")
    filled = [a.format(missing=tmp_path / "nope", run=run, junk=tmp_path / "junk.json") for a in args]
    code, _, err = invoke(capsys, "check", str(run), *filled)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


# ---- baselines and suites -------------------------------------------------------------------------

def test_lower_is_better_metrics_fail_on_a_rise(tmp_path):
    base_values, cand_values = pass_fail_pair(only_a=0, only_b=20, both=10, neither=70)

    def outcomes(values: list[bool]) -> Outcomes:
        return Outcomes(name="halluc", run="r", config={"task": "t", "params": {}}, ids=tuple(f"s{i}" for i in
                        range(len(values))), scores={"hallucinated": tuple(int(v) for v in values)},
                        lower_is_better=("hallucinated",))

    (row,) = check_pair(outcomes(cand_values), outcomes(base_values), max_drop=0.02, alpha=0.05)
    assert row.drop == pytest.approx(0.2) and row.failed
    (row,) = check_pair(outcomes(base_values), outcomes(cand_values), max_drop=0.02, alpha=0.05)
    assert row.drop == pytest.approx(-0.2) and not row.failed


def test_an_exported_baseline_gives_the_same_verdicts(tmp_path, capsys):
    baseline_run = needle_run(tmp_path, "fake:oracle", SMALL_NEEDLE)
    candidate = needle_run(tmp_path, "fake:wrong", SMALL_NEEDLE)
    exported = tmp_path / "baseline.json"
    code, _, err = invoke(capsys, "check", str(baseline_run), "--export-baseline", str(exported))
    assert code == 0 and exported.is_file(), err
    data = json.loads(exported.read_text())
    assert data["format"] == "evalsuite-baseline" and len(data["runs"][0]["ids"]) == 12
    assert set(data["runs"][0]["scores"]["correct_all"]) == {1}
    assert data["runs"][0]["gated"] == ["correct_all"] and set(data["runs"][0]["cells"]) == set(NEEDLE_CELLS[1:])
    assert exported.stat().st_size < 20_000
    from_folder, from_file = check(candidate, baseline_run), check(candidate, exported)
    assert [(c.metric, c.cell, c.drop, c.p_value) for c in from_folder.checks] == \
        [(c.metric, c.cell, c.drop, c.p_value) for c in from_file.checks]
    assert from_file.failed
    # a baseline exported before cells were kept is checked with the candidate's cells
    for entry in data["runs"]:
        del entry["cells"], entry["gated"], entry["side"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert rows(check(candidate, old)) == rows(from_folder)


def test_a_suite_result_is_checked_run_by_run(tmp_path, capsys):
    suite = tmp_path / "two.toml"
    suite.write_text('[[run]]\ntask = "needle"\nname = "short"\n[run.params]\nlengths = [1024]\ndepths = [0, 1]\n'
                     'samples = 8\n\n[[run]]\ntask = "needle"\nname = "long"\n[run.params]\nlengths = [1024]\n'
                     'depths = [0, 1]\nsamples = 8\n')
    for model in ("fake:oracle", "fake:wrong"):
        code, _, err = invoke(capsys, "run", "--suite", str(suite), "--model", model, "--out", str(tmp_path / "res"),
                              "--no-progress")
        assert code == 0, err
    good, bad = tmp_path / "res/suite-two-fake-oracle.json", tmp_path / "res/suite-two-fake-wrong.json"
    assert [o.name for o in load_outcomes(good)] == ["short", "long"]
    assert invoke(capsys, "check", str(good), "--baseline", str(good))[0] == 0
    result = check(bad, good)
    cells = ["all", "context_length=1024, depth=0.0", "context_length=1024, depth=1.0"]
    assert [(c.name, c.cell) for c in result.failed] == [(n, cell) for n in ("short", "long") for cell in cells]
    assert {c.metric for c in result.failed} == {"correct_all"}
    assert all(c.level == pytest.approx(0.05 / (6 - i)) for i, c in enumerate(sorted(result.checks,
                                                                                      key=lambda c: c.level)))


def test_a_baseline_run_missing_from_the_candidate_is_bad_input(tmp_path, capsys):
    run_a = needle_run(tmp_path, "fake:oracle", {"lengths": "1024", "depths": "0", "samples": "2"})
    run_b = needle_run(tmp_path, "fake:oracle", {"lengths": "2048", "depths": "0", "samples": "2"})
    with pytest.raises(UserError, match=r"no candidate run with the same task configuration.*lengths"):
        check(run_a, run_b)
    code, _, err = invoke(capsys, "check", str(run_a), "--baseline", str(run_b))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_export_baseline_accepts_only_finished_runs(tmp_path):
    run = synthetic_run(tmp_path / "run", "A", {"ok": [True]})
    (run / "summary.json").unlink()
    with pytest.raises(UserError, match="not complete"):
        export_baseline(load_outcomes(run), tmp_path / "b.json", str(run))


def test_not_testable_cells_are_shown_and_left_out_of_holm():
    ids = tuple(f"s{i}" for i in range(21))
    cells = tuple(["a"] * 20 + ["b"])  # cell b holds one sample
    common = dict(config={"task": "t", "params": {}}, ids=ids, cells=cells, gated=("ok",))
    cand = Outcomes(name="r", run="c", scores={"ok": (1,) * 10 + (0,) * 11}, **common)
    base = Outcomes(name="r", run="b", scores={"ok": (1,) * 21}, **common)
    checks = {c.cell: c for c in check_pair(cand, base)}
    assert checks["b"].verdict == "not testable (n = 1)" and math.isnan(checks["b"].p_value)
    assert not checks["b"].failed and sorted([checks["all"].level, checks["a"].level]) == pytest.approx([0.025, 0.05])


# ---- what each task gates -------------------------------------------------------------------------

@pytest.mark.parametrize("task, axes, primary", [
    ("needle", ("context_length", "depth"), "correct_all"),
    ("icl", ("n_shots",), "correct"),
    ("zeroshot", ("bits",), "acc"),
    ("nll", ("context_length",), "nll"),
    ("attention", ("n_needles", "n_queries", "context_length", "depth"), "answer_share"),
    ("hallucination", ("dataset",), "empty_output"),
    ("outliers", (), "attn_top1"),
])
def test_each_task_declares_what_the_gate_tests(task, axes, primary):
    from evalsuite.analysis.task_of import task_spec

    spec = task_spec(task)
    assert (spec.gating_axes, spec.primary_metric) == (axes, primary)


@pytest.mark.parametrize("members, says", [
    ({"primary_metric": "nope"}, "'primary_metric' 'nope' is not one of its metrics"),
    ({"gating_axes": "depth"}, "'gating_axes' must be a tuple of strings or None"),
    ({"gating_axis": ("depth",)}, "did you mean 'gating_axes'"),
])
def test_gate_declarations_are_checked_at_registration(members, says):
    from dataclasses import dataclass

    from evalsuite.contracts import ContractError, TaskBase, validate_task

    class Declared(TaskBase):
        name = "declared"
        metrics = ("correct",)
        group_by = ("depth",)

        def plan(self, state): return []

        def requests(self, sample, model, state): return [], {}

        def score(self, sample, outputs): return {}

    for key, value in members.items():
        setattr(Declared, key, value)
    with pytest.raises(ContractError, match=says.replace("(", r"\(").replace(")", r"\)")):
        validate_task(dataclass(frozen=True)(Declared))


def test_a_run_pair_without_any_metric_is_not_a_pass(tmp_path, capsys):
    run_b = synthetic_run(tmp_path / "b", "B", {"note": ["a", "b"]})  # text only: no metric is inferred
    run_c = synthetic_run(tmp_path / "c", "C", {"note": ["a", "c"]})
    code, out, err = invoke(capsys, "check", str(run_c), "--baseline", str(run_b))
    assert code == 2 and "nothing to gate: no metric has values in both runs" in err and "PASS" not in out
