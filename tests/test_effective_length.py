"""Effective length as NoLiMa defines it: NoLiMa's published table reproduced, the rule on hand-made
records whose answer is known (the base over the short lengths, "<1000", a run without the base lengths,
not measurable under the floor, errors as fails), its interval, the paired difference with the tests of
both bases and of each length, and what `report`, `compare` and the paper report print."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from evalsuite.analysis.effective_length import (
    NOLIMA_SHARE,
    Definition,
    definition,
    drawn_pairs,
    drawn_scores,
    effective_length,
    effective_lengths,
    length_swept,
    paired_effective_length,
    tokens_text,
)
from evalsuite.analysis.effective_text import paired_markdown, report_markdown
from evalsuite.errors import UserError

# ---- NoLiMa's own numbers --------------------------------------------------------------------------------

# NoLiMa's README (github.com/adobe-research/NoLiMa), "Results": model, published effective length, base
# score, its published 85% threshold, and the scores at 1K, 2K, 4K, 8K, 16K, 32K, 64K and 128K (None: "--",
# not run), as of its update of 2025-06-09 (22 models; the 18 of the 2025-05-05 version agree where they
# overlap). NoLiMa's lengths are 1000, 2000, 4000... tokens (its run configs: context_length: 1000).
NOLIMA_TABLE = [
    ("GPT-4.1", "16K", 97.0, 82.5, (95.6, 95.2, 91.7, 87.5, 84.9, 79.8, 69.7, 64.7)),
    ("GPT-4o", "8K", 99.3, 84.4, (98.1, 98.0, 95.7, 89.2, 81.6, 69.7, 62.4, 56.0)),
    ("Llama 3.3 70B", "2K", 97.3, 82.7, (94.2, 87.4, 81.5, 72.1, 59.5, 42.7, None, None)),
    ("Llama 3.1 405B", "2K", 94.7, 80.5, (89.0, 85.0, 74.5, 60.1, 48.4, 38.0, None, None)),
    ("Llama 3.1 70B", "2K", 94.5, 80.3, (91.0, 81.8, 71.2, 62.7, 51.8, 43.2, None, None)),
    ("Gemini 1.5 Pro", "2K", 92.6, 78.7, (86.4, 82.7, 75.4, 63.9, 55.5, 48.2, None, None)),
    ("Jamba 1.5 Mini", "<1K", 92.4, 78.6, (76.3, 74.1, 70.8, 62.2, 52.7, 43.6, None, None)),
    ("Command R+", "<1K", 90.9, 77.3, (77.0, 73.5, 66.3, 39.5, 21.3, 7.4, None, None)),
    ("Llama 4 Maverick", "2K", 90.1, 76.6, (81.6, 78.3, 68.8, 49.0, 34.3, 24.5, None, None)),
    ("Gemini 2.5 Flash (w/o T)", "2K", 94.4, 80.2, (90.1, 86.1, 79.4, 68.2, 57.9, 48.4, None, None)),
    ("Gemini 2.0 Flash", "4K", 89.4, 76.0, (87.7, 87.5, 77.9, 64.7, 48.2, 41.0, 33.0, 16.4)),
    ("Gemma 3 27B", "<1K", 88.6, 75.3, (73.3, 65.6, 48.1, 32.7, 20.2, 9.5, None, None)),
    ("Mistral Large 2", "2K", 87.9, 74.7, (86.1, 85.5, 73.3, 51.5, 32.6, 18.7, None, None)),
    ("Claude 3.5 Sonnet", "4K", 87.6, 74.4, (85.4, 84.0, 77.6, 61.7, 45.7, 29.8, None, None)),
    ("Gemma 3 12B", "1K", 87.4, 74.3, (74.7, 61.8, 39.9, 27.4, 16.8, 7.3, None, None)),
    ("Gemini 1.5 Flash", "<1K", 84.7, 72.0, (68.6, 61.6, 51.0, 44.4, 35.5, 28.6, None, None)),
    ("GPT-4o mini", "<1K", 84.9, 72.2, (67.7, 58.2, 44.1, 32.6, 20.6, 13.7, None, None)),
    ("Llama 4 Scout", "1K", 81.7, 69.4, (72.3, 61.8, 50.8, 35.5, 26.9, 21.6, None, None)),
    ("GPT-4.1 Mini", "<1K", 80.9, 68.8, (66.7, 62.8, 58.7, 51.9, 46.2, 38.8, None, None)),
    ("GPT-4.1 Nano", "<1K", 80.7, 68.6, (60.8, 48.2, 36.7, 28.8, 19.5, 9.4, None, None)),
    ("Llama 3.1 8B", "1K", 76.7, 65.2, (65.7, 54.4, 44.1, 31.9, 22.6, 14.2, None, None)),
    ("Gemma 3 4B", "<1K", 73.6, 62.6, (50.3, 35.3, 16.4, 7.5, 2.3, 0.9, None, None)),
]

LENGTHS = np.array([1, 2, 4, 8, 16, 32, 64, 128]) * 1000


def published_tokens(text: str) -> int:
    """"8K" -> 8000; "<1K" (below the first candidate) -> 0, as effective_lengths writes it."""
    return 0 if text.startswith("<") else int(text.removesuffix("K")) * 1000


def nolima_row(scores: tuple[float | None, ...]) -> tuple[np.ndarray, np.ndarray]:
    ran = [(length, score) for length, score in zip(LENGTHS, scores) if score is not None]
    return np.array([length for length, _ in ran]), np.array([[score for _, score in ran]])


@pytest.mark.parametrize("model, published, base, threshold, scores", NOLIMA_TABLE, ids=[r[0] for r in NOLIMA_TABLE])
def test_every_published_effective_length_of_nolima_is_reproduced(model, published, base, threshold, scores):
    # the table's threshold column is 85% of its base (both rounded to a tenth): the data are typed right
    assert abs(NOLIMA_SHARE * base - threshold) <= 0.1
    lengths, values = nolima_row(scores)
    found = effective_lengths(values, np.array([base]), lengths, first=1000, share=NOLIMA_SHARE)
    assert found[0] == published_tokens(published)
    assert tokens_text(int(found[0]), 1000) == published.replace("K", "000")


def test_the_table_tells_nolimas_base_from_the_shortest_lengths():
    """The test above can fail: the former rule, the score at the shortest length run (1K here) as the
    base, gives another effective length for 13 of the 22 models, always a longer one."""
    wrong = []
    for model, published, _, _, scores in NOLIMA_TABLE:
        lengths, values = nolima_row(scores)
        found = effective_lengths(values, values[:, 0], lengths, first=1000, share=NOLIMA_SHARE)[0]
        if found != published_tokens(published):
            wrong.append(model)
            assert found > published_tokens(published)
    assert len(wrong) == 13 and {"Jamba 1.5 Mini", "Command R+", "GPT-4.1 Mini"} <= set(wrong)


# ---- the rule on hand-made records -----------------------------------------------------------------------

def frame(passes: dict[int, int], n: int = 10, prefix: str = "s") -> pd.DataFrame:
    """n samples per length, the first `passes[length]` of them correct (ids shared across models)."""
    rows = [{"id": f"{prefix}-{length}-{i}", "context_length": length, "depth": i % 2 * 0.5,
             "correct": float(i < passed), "error": None}
            for length, passed in passes.items() for i in range(n)]
    return pd.DataFrame(rows)


# base (250, 500, 1000 pooled) 27 of 30 = 0.9, threshold 0.765; 2000 keeps (0.8), 4000 does not (0.7),
# 8000 does again (0.8): NoLiMa's effective length is the longest length that keeps, 8000
CURVE = {250: 10, 500: 9, 1000: 8, 2000: 8, 4000: 7, 8000: 8, 16000: 5}


def test_the_base_is_the_short_lengths_pooled_and_the_length_the_longest_that_keeps():
    found = effective_length(frame(CURVE), "correct")
    assert found is not None and found.declared
    assert found.base == pytest.approx(0.9) and found.base_n == 30 and found.base_lengths == (250, 500, 1000)
    assert found.candidates == (1000, 2000, 4000, 8000, 16000)
    assert found.value == 8000 and found.counts == (10,) * 7
    assert effective_length(frame(CURVE), "correct", Definition(share=0.95)).value == 0  # 0.8 < 0.855 at 1000
    assert effective_length(frame(CURVE), "correct", Definition(share=0.5)).value == 16000


def test_below_the_first_candidate_is_said_so():
    found = effective_length(frame({250: 10, 500: 10, 1000: 7, 2000: 6, 4000: 5}), "correct")
    assert found.value == 0 and found.text().startswith("<1000 tokens")
    assert found.line().endswith("; base score 0.900 (n = 30)")


def test_a_run_without_the_base_lengths_says_so_and_takes_its_shortest_length():
    found = effective_length(frame({256: 10, 512: 9, 1024: 8, 2048: 9}), "correct")
    assert not found.declared and found.base_lengths == (256,) and found.base == 1.0 and found.base_n == 10
    assert found.value == 2048  # 0.9 keeps 85% of 1.0, 0.8 at 1024 does not, 2048 does again
    assert "at 256 tokens, the shortest length run, for want of the base lengths 250, 500 and 1000" in found.line()
    assert ("base: the correct score at 256 tokens, the shortest length run: the run lacks NoLiMa's base lengths "
            "250, 500 and 1000, so this is not NoLiMa's base") in report_markdown("toy", found)


def test_another_base_is_named_as_the_users_own():
    found = effective_length(frame({256: 10, 512: 9, 1024: 8, 2048: 9}), "correct", Definition(base=(256, 512, 1024)))
    assert found.declared and found.base == pytest.approx(0.9) and found.value == 2048
    assert "(--effective-base;" in report_markdown("toy", found) and "NoLiMa's short lengths" not in \
        report_markdown("toy", found)


def test_a_flat_low_accuracy_run_is_not_measurable():
    """A model right 5% of the time at every length keeps 85% of its base everywhere; the floor says that
    this measures nothing about its context."""
    flat = frame({length: 1 for length in (250, 500, 1000, 2000, 4000, 8000)}, n=20)
    found = effective_length(flat, "correct")
    assert found.value is None and found.low is None
    assert found.text() == "not measurable: base score 0.050 (n = 60) is under the floor of 0.5"
    assert "### Effective length: toy: not measurable: base score 0.050" in report_markdown("toy", found)
    assert effective_length(flat, "correct", Definition(floor=0.0)).value == 8000
    zero = effective_length(frame({250: 0, 500: 0, 1000: 0, 2000: 3}), "correct", Definition(floor=0.0))
    assert zero.value is None and zero.text() == "not measurable: base score 0.000 (n = 30), nothing to keep"


def test_the_rule_row_by_row():
    scores = np.array([[0.5, 0.45, 0.43, 0.1], [0.5, 0.6, 0.1, 0.6], [0.0, 0.3, 0.3, 0.3], [0.4, 0.3, 0.3, 0.3]])
    base = scores[:, 0]
    found = effective_lengths(scores, base, np.array([1, 2, 4, 8]), first=1, share=0.85, floor=0.0)
    assert found[0] == 4 and found[1] == 8 and math.isnan(found[2]) and found[3] == 1  # 0.43 / 0.5 = 0.86 keeps
    assert effective_lengths(scores, base, np.array([1, 2, 4, 8]), first=2, share=0.85)[3] == 0
    assert math.isnan(effective_lengths(scores, base, np.array([1, 2, 4, 8]), first=1, share=0.85, floor=0.45)[3])


def test_one_length_has_no_effective_length():
    assert effective_length(frame({512: 5}), "correct") is None
    assert not length_swept(frame({512: 5})) and length_swept(frame(CURVE))


def test_an_errored_sample_counts_as_a_fail():
    rows = frame({250: 10, 500: 10, 1000: 10, 2000: 10})
    rows.loc[rows.index[-2:], "correct"] = np.nan  # two 2000-token samples crashed: 8 of 10
    rows.loc[rows.index[-2:], "error"] = "CUDA out of memory"
    found = effective_length(rows, "correct", Definition(share=0.9))
    assert found.scores[-1] == pytest.approx(0.8) and found.counts[-1] == 10 and found.value == 1000


def test_samples_without_a_length_or_a_value_are_left_out():
    rows = frame(CURVE)
    rows.loc[0, "context_length"] = np.nan  # a record of another shape
    rows.loc[11, "correct"] = np.nan  # no value, and no error: not a fail
    found = effective_length(rows, "correct")
    assert found.counts == (9, 9, 10, 10, 10, 10, 10) and found.base_n == 28 and found.value == 8000


# ---- the interval ---------------------------------------------------------------------------------------

NOISY = {250: 18, 500: 17, 1000: 17, 2000: 16, 4000: 15, 8000: 9}


def test_the_interval_is_seeded_brackets_the_value_and_has_width():
    noisy = frame(NOISY, n=20)
    first, again = effective_length(noisy, "correct"), effective_length(noisy, "correct")
    assert first == again  # the same records give the same interval
    assert first.value == 4000 and first.low <= first.value <= first.high and first.low < first.high
    assert {first.low, first.high} <= {0, 1000, 2000, 4000, 8000}
    assert effective_length(noisy, "correct", seed=1).value == 4000


def test_passes_at_every_sample_still_leave_the_interval_its_width():
    """Ten of ten at 1000 does not prove 85%: the rate's Jeffreys posterior keeps the doubt that a
    bootstrap of ten passes (which only ever redraws passes) would hide."""
    found = effective_length(frame({250: 10, 500: 10, 1000: 10, 2000: 9, 4000: 3}, n=10), "correct")
    assert found.value == 2000 and found.low < 2000


def test_a_clear_curve_has_a_narrow_interval():
    found = effective_length(frame({250: 1000, 500: 990, 1000: 990, 2000: 400}, n=1000), "correct")
    assert (found.value, found.low, found.high) == (1000, 1000, 1000)


def test_too_few_samples_give_no_interval_and_say_so():
    """One sample a length: a single failure decides the length, whatever the resamples."""
    found = effective_length(frame({250: 1, 500: 1, 1000: 1, 2000: 1, 4000: 0}, n=1), "correct")
    assert found.value == 2000 and found.low is None and found.high is None
    assert found.text() == "2000 tokens (no interval: 1 sample at a length, 7 needed)"
    assert Definition().min_samples == 7 and Definition(share=0.9).min_samples == 10
    assert Definition(share=1.0).min_samples is None


# ---- two models -----------------------------------------------------------------------------------------

WORSE = {250: 10, 500: 9, 1000: 8, 2000: 6, 4000: 5, 8000: 5, 16000: 2}  # keeps 1000 only


def test_the_paired_difference_its_interval_and_the_tests_beside_it():
    paired = paired_effective_length(frame(CURVE), frame(WORSE), "correct")
    assert (paired.a.value, paired.b.value, paired.diff) == (8000, 1000, 7000)
    assert paired.low <= 7000 <= paired.high and paired.n == 70
    assert paired.base_test["n"] == 30 and paired.base_test["diff"] == pytest.approx(0.0)
    assert paired.base_test["test"] == "McNemar" and paired.base_test["p_value"] == 1.0
    assert [row["length"] for row in paired.per_length] == list(CURVE)
    row = paired.per_length[4]  # 4000: 7 of 10 against 5 of 10, the same first five passing
    assert (row["mean_a"], row["mean_b"], row["n"]) == (0.7, 0.5, 10) and row["diff"] == pytest.approx(0.2)
    text = paired_markdown(("a", "b"), paired)
    assert f"| a minus b | +7000 tokens [{paired.low:+d}, {paired.high:+d}]" in text
    assert "| +0.000 [+0.000, +0.000], McNemar p = 1 |" in text
    assert "| a | 8000 tokens [" in text and "| b | 1000 tokens [" in text and "| 0.900 (n = 30) |" in text
    assert "| base (250, 500 and 1000) | 0.900 | 0.900 | +0.000 [+0.000, +0.000] | 1 (McNemar) | 30 |" in text
    assert "| 4000 | 0.700 | 0.500 | +0.200 [" in text
    assert "the base scores: a 0.900 (n = 30), b 0.900 (n = 30); a minus b +0.000" in text
    assert "no difference at 0.05" in text


def test_bases_that_differ_are_said_to():
    """Flat at 90% against flat at 50%: neither degrades, so the difference is one of accuracy."""
    lengths = (250, 500, 1000, 2000, 4000)
    paired = paired_effective_length(frame({n: 18 for n in lengths}, n=20), frame({n: 10 for n in lengths}, n=20),
                                     "correct")
    assert paired.bases_differ(0.05) and paired.base_test["p_value"] < 1e-3
    text = paired_markdown(("flat-90", "flat-50"), paired)
    assert "they differ at 0.05: the difference of effective lengths is partly one of accuracy" in text


def test_the_pairing_keeps_the_models_agreement():
    """A model against itself agrees on every sample: its paired draws of each length's rate stay close
    together (only a discordance the data cannot rule out separates them), where two independent
    draws of the same rates would spread apart."""
    noisy = frame(NOISY, n=20)
    values = noisy["correct"].to_numpy()
    cells = [(length, np.flatnonzero(noisy["context_length"].to_numpy() == length)) for length in NOISY]
    a, b = drawn_pairs(values, values, cells)
    apart = np.abs(drawn_scores(values, cells, seed=1) - drawn_scores(values, cells, seed=2)).mean()
    assert np.abs(a - b).mean() < apart / 2
    paired = paired_effective_length(noisy, noisy.sample(frac=1, random_state=3), "correct")
    assert paired.diff == 0 and paired.low <= 0 <= paired.high
    assert paired.a == effective_length(noisy, "correct")  # each model's own length as `report` gives it


def test_a_continuous_score_is_bootstrapped_with_the_same_samples_for_both_models():
    noisy = frame(NOISY, n=20)
    noisy["correct"] = noisy["correct"] * 0.5 + 0.25  # 0.25 / 0.75: not pass/fail
    paired = paired_effective_length(noisy, noisy.sample(frac=1, random_state=3), "correct")
    assert (paired.diff, paired.low, paired.high) == (0, 0, 0)  # the same ids drawn for both: exactly zero
    assert paired.a.low < paired.a.high


def test_only_shared_samples_are_paired():
    paired = paired_effective_length(frame(CURVE), frame(CURVE).iloc[5:], "correct")
    assert paired.n == 65 and paired.a.counts[0] == 5 and paired.base_test["n"] == 25


def test_a_model_that_is_not_measurable_has_no_difference():
    low = frame({length: 2 for length in CURVE}, n=10)
    paired = paired_effective_length(frame(CURVE), low, "correct")
    assert paired.diff is None and paired.text() == "not measurable: a base score is under the floor of 0.5"


@pytest.mark.parametrize("settings, option", [({"share": 0.0}, "--effective-share"), ({"share": 1.5}, "--effective-share"),
                                              ({"base": ()}, "--effective-base"), ({"base": (0, 500)}, "--effective-base"),
                                              ({"base": (500, 500)}, "--effective-base"),
                                              ({"floor": -0.1}, "--effective-floor"), ({"floor": 1.0}, "--effective-floor")])
def test_settings_outside_their_range_are_refused(settings, option):
    with pytest.raises(ValueError):
        Definition(**settings)
    with pytest.raises(UserError, match=f"^{option}: "):
        definition(**settings)


# ---- in `evalsuite report` and `evalsuite compare`, on hand-made run folders -------------------------------

def hand_made_run(folder, model: str, passes: dict[int, int], n: int = 10):
    """A finished nolima run written from records: n samples per length (depths 0 and 0.5), the first
    `passes[length]` of them correct; the same ids in every run, so runs pair up."""
    from evalsuite.runs.records import Record, RunFolder, config_hash

    params = {"lengths": sorted(passes), "depths": [0.0, 0.5], "samples": n // 2, "hops": ["onehop"]}
    config = {"task": "nolima", "params": params, "limit": None, "model": {"name": model}}
    config["hash"] = config_hash(config)
    run = RunFolder(folder)
    run.create(config)
    run.append([Record(id=f"nolima-onehop-L{length}-{i:03d}", task="nolima", model=model,
                       axes={"hops": "onehop", "context_length": length, "depth": i % 2 * 0.5, "seed": 0},
                       target=("Ines",), prompt={"sha256": "0"}, info={}, outputs=("Ines" if i < passed else "no",),
                       scores={"correct": i < passed}, run=config["hash"])
                for length, passed in passes.items() for i in range(n)])
    run.write_summary({"task": "nolima", "n": n * len(passes)})
    return folder


def test_report_gives_each_run_its_effective_length_beside_its_base(tmp_path, capsys):
    from conftest import invoke

    run = hand_made_run(tmp_path / "a", "model-a", CURVE)
    done = invoke(capsys, "report", str(run), "--no-plots")
    assert done.code == 0, done.err
    expected = effective_length(frame(CURVE), "correct")  # the same records as a frame
    assert (f"### Effective length: model-a: 8000 tokens [{tokens_text(expected.low, 1000)}, {expected.high}]; "
            "base score 0.900 (n = 30)") in done.out
    assert "| 4000 | candidate | 0.700 | 0.78 | no | 10 |" in done.out
    assert "| 500 | base | 0.900 | 1.00 |  | 10 |" in done.out


def test_report_says_a_flat_low_accuracy_run_is_not_measurable(tmp_path, capsys):
    from conftest import invoke

    run = hand_made_run(tmp_path / "a", "model-a", {length: 1 for length in (250, 500, 1000, 2000, 4000)}, n=20)
    done = invoke(capsys, "report", str(run), "--no-plots")
    assert done.code == 0, done.err
    assert "### Effective length: model-a: not measurable: base score 0.050 (n = 60) is under the floor of 0.5" \
        in done.out
    done = invoke(capsys, "report", str(run), "--no-plots", "--effective-floor", "0")
    assert "### Effective length: model-a: 4000 tokens" in done.out


def test_compare_gives_both_models_their_bases_the_difference_and_each_length(tmp_path, capsys):
    from conftest import invoke

    a = hand_made_run(tmp_path / "a", "model-a", CURVE)
    b = hand_made_run(tmp_path / "b", "model-b", WORSE)
    done = invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert done.code == 0, done.err
    assert "## Effective length" in done.out
    assert "| model-a | 8000 tokens [" in done.out and "| model-b | 1000 tokens [" in done.out
    assert "| 0.900 (n = 30) |" in done.out and "| model-a minus model-b | +7000 tokens [" in done.out
    assert "the base scores: model-a 0.900 (n = 30), model-b 0.900 (n = 30)" in done.out
    assert "| base (250, 500 and 1000) | 0.900 | 0.900 |" in done.out and "| 16000 | 0.500 | 0.200 |" in done.out
    (saved,) = [json.loads(p.read_text()) for p in (tmp_path / "cmp").glob("*/comparison.json")]
    found = saved["effective_length"]
    assert (found["a"]["value"], found["b"]["value"], found["diff"], found["n"]) == (8000, 1000, 7000, 70)
    assert found["low"] <= 7000 <= found["high"] and found["share"] == 0.85 and found["base"] == [250, 500, 1000]
    assert found["a"]["base"] == pytest.approx(0.9) and found["a"]["base_n"] == 30 and found["floor"] == 0.5
    assert found["base_test"]["n"] == 30 and len(found["per_length"]) == 7


def test_the_definition_is_an_option_of_report_and_compare(tmp_path, capsys):
    from conftest import invoke

    a = hand_made_run(tmp_path / "a", "model-a", CURVE)
    b = hand_made_run(tmp_path / "b", "model-b", WORSE)
    done = invoke(capsys, "report", str(a), "--no-plots", "--effective-share", "0.5")
    assert done.code == 0, done.err
    assert "### Effective length: model-a: 16000 tokens" in done.out and "keeps at least 50% of" in done.out
    done = invoke(capsys, "report", str(a), "--no-plots", "--effective-base", "250,500")
    # base 0.950 over 250 and 500, the first candidate 500 (0.9) keeps 85% of it, 1000 (0.8) and after do not
    assert "### Effective length: model-a: 500 tokens" in done.out and "from 500 tokens" in done.out
    assert "| 500 | base, candidate | 0.900 |" in done.out and "base score 0.950 (n = 20)" in done.out
    done = invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp"), "--effective-share", "0.95")
    assert done.code == 0, done.err
    (saved,) = [json.loads(p.read_text()) for p in (tmp_path / "cmp").glob("*/comparison.json")]
    assert saved["effective_length"]["share"] == 0.95 and saved["effective_length"]["a"]["value"] == 0
    for option, value, message in (("--effective-share", "1.5", "--effective-share: the share of the base score to "
                                    "keep must be in (0, 1], got 1.5"),
                                   ("--effective-base", "250,x", "--effective-base takes token counts separated by "
                                    "commas, e.g. 250,500,1000, got '250,x'"),
                                   ("--effective-floor", "1", "--effective-floor: the floor of the base score must be "
                                    "in [0, 1), got 1.0")):
        for command in (["report", str(a)], ["compare", str(a), str(b), "--out", str(tmp_path / "bad")]):
            done = invoke(capsys, *command, option, value)
            assert done.code == 2 and done.err.strip() == f"error: {message}"
    assert not (tmp_path / "bad").exists()


def test_a_run_of_one_length_has_no_effective_length_section(tmp_path, capsys):
    from conftest import invoke

    done = invoke(capsys, "report", str(hand_made_run(tmp_path / "a", "model-a", {512: 7})), "--no-plots")
    assert done.code == 0, done.err
    assert "Effective length" not in done.out and "| 512 |" in done.out


# ---- in the paper report: the 64K needle section, and the long-context entries after the paper's ----------

MINI_SUITE = """
name = "mini-long"
[[run]]
task = "needle"
name = "needle-64k"
[run.params]
lengths = [1024, 2048]
depths = [0, 1]
samples = 2
[[run]]
task = "nolima"
name = "nolima"
[run.params]
lengths = [1024, 2048]
depths = [0.5]
samples = 2
"""


def test_the_paper_report_shows_effective_lengths_beside_base_scores(tmp_path, capsys):
    from conftest import invoke

    suite = tmp_path / "mini-long.toml"
    suite.write_text(MINI_SUITE, encoding="utf-8")
    out = tmp_path / "res"
    done = invoke(capsys, "run", "--suite", str(suite), "--model", "fake:target", "--model", "fake:wrong",
                  "--out", str(out), "--no-progress")
    assert done.code == 0, done.err
    done = invoke(capsys, "report", "--paper", str(out), "--out", str(tmp_path / "paper.html"))
    assert done.code == 0, done.err
    markdown = (tmp_path / "paper.md").read_text()
    needle = markdown[markdown.index("Needle retrieval up to"):markdown.index("Attention allocation")]
    assert "effective length, strict scoring (correct_all)" in needle
    assert "the run lacks NoLiMa's base lengths 250, 500 and 1000, so this is not NoLiMa's base" in needle
    assert "| fake-target | 2048 tokens (no interval: 4 samples at a length, 7 needed) | 1.000 (n = 4) |" in needle
    assert "| fake-wrong | not measurable: base score 0.000 (n = 4) is under the floor of 0.5 | 0.000 (n = 4) |" \
        in needle
    extra = markdown[markdown.index("Long context beyond the paper"):]
    assert "nolima (nolima)" in extra and "| fake-target | 2048 tokens (no interval: 4 samples" in extra
    assert "| fake-wrong − fake-target | not measurable: a base score is under the floor of 0.5 | -1.000 [" in extra
    assert "heatmap_pair_onehop.png" in extra and "heatmap_diff_twohop.png" in extra
    assert "Long context beyond the paper" in done.out  # its reading, on the command line too
