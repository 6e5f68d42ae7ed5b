"""Effective length on hand-made records whose answer is known: the rule, the undefined case,
errors as fails, the bootstrap interval and the paired difference."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from evalsuite.analysis.effective_length import (
    effective_length,
    effective_lengths,
    length_swept,
    paired_effective_length,
    paired_markdown,
    report_markdown,
)


def frame(passes: dict[int, int], n: int = 10, prefix: str = "s") -> pd.DataFrame:
    """n samples per length, the first `passes[length]` of them correct (ids shared across models)."""
    rows = [{"id": f"{prefix}-{length}-{i}", "context_length": length, "depth": i % 2 * 0.5,
             "correct": float(i < passed), "error": None}
            for length, passed in passes.items() for i in range(n)]
    return pd.DataFrame(rows)


# scores 1.0, 0.9, 0.8, 0.9: 0.8 falls below 85% of 1.0, so the model keeps 512 (2048's recovery does not count)
CURVE = {256: 10, 512: 9, 1024: 8, 2048: 9}


def test_the_longest_length_kept_without_a_break():
    found = effective_length(frame(CURVE), "correct")
    assert found is not None
    assert found.value == 512 and found.lengths == (256, 512, 1024, 2048)
    assert found.scores == pytest.approx((1.0, 0.9, 0.8, 0.9)) and found.counts == (10, 10, 10, 10)
    assert effective_length(frame(CURVE), "correct", threshold=0.75).value == 2048
    assert effective_length(frame(CURVE), "correct", threshold=0.95).value == 256


def test_the_rule_row_by_row():
    scores = np.array([[0.5, 0.45, 0.43, 0.1], [0.5, 0.6, 0.1, 0.6], [0.0, 0.3, 0.3, 0.3], [0.4, 0.3, 0.4, 0.4]])
    found = effective_lengths(scores, np.array([1, 2, 4, 8]), 0.85)  # 0.43 / 0.5 = 0.86 keeps; 0.1 does not
    assert found[:2].tolist() == [4.0, 2.0] and math.isnan(found[2]) and found[3] == 1.0


def test_a_zero_short_context_score_is_undefined_and_said_so():
    found = effective_length(frame({256: 0, 512: 3, 1024: 2}), "correct")
    assert found is not None and found.value is None and found.low is None
    assert found.text() == "undefined: its score at the shortest length (256 tokens) is zero"
    assert "undefined" in report_markdown("toy", found)


def test_one_length_has_no_effective_length():
    assert effective_length(frame({512: 5}), "correct") is None
    assert not length_swept(frame({512: 5})) and length_swept(frame(CURVE))


def test_an_errored_sample_counts_as_a_fail():
    rows = frame({256: 10, 512: 10})
    rows.loc[rows.index[-2:], "correct"] = np.nan  # two 512-token samples crashed: 8 of 10
    rows.loc[rows.index[-2:], "error"] = "CUDA out of memory"
    found = effective_length(rows, "correct")
    assert found.scores == pytest.approx((1.0, 0.8)) and found.value == 256


def test_the_interval_is_seeded_and_brackets_the_value():
    noisy = frame({256: 16, 512: 15, 1024: 12, 2048: 6}, n=20)
    first, again = effective_length(noisy, "correct"), effective_length(noisy, "correct")
    assert first == again  # the same records give the same interval
    assert first.value == 512 and first.low <= first.value <= first.high
    assert {first.low, first.high} <= {256, 512, 1024, 2048} and first.low < first.high
    assert effective_length(noisy, "correct", seed=1).value == 512


def test_a_clear_curve_has_a_narrow_interval():
    found = effective_length(frame({256: 1000, 512: 990, 1024: 400}, n=1000), "correct")
    assert (found.value, found.low, found.high) == (512, 512, 512)


def test_the_paired_difference_and_its_interval():
    a = frame(CURVE)
    b = frame({256: 10, 512: 5, 1024: 4, 2048: 2})  # keeps 256 only
    paired = paired_effective_length(a, b, "correct")
    assert (paired.a.value, paired.b.value, paired.diff) == (512, 256, 256)
    assert paired.low <= 256 <= paired.high and paired.n == 40
    text = paired_markdown(("a", "b"), paired)
    assert f"| a minus b | +256 tokens [{paired.low:+d}, {paired.high:+d}] |" in text
    assert "| a | 512 tokens [" in text and "| b | 256 tokens [" in text


def test_the_pairing_draws_the_same_samples_for_both_models():
    """A model against itself: every paired resample differs by exactly zero (independent draws would not)."""
    noisy = frame({256: 16, 512: 15, 1024: 12, 2048: 6}, n=20)
    paired = paired_effective_length(noisy, noisy.sample(frac=1, random_state=3), "correct")
    assert (paired.diff, paired.low, paired.high) == (0, 0, 0)
    assert paired.a.low < paired.a.high  # while each model alone has an interval of some width


def test_only_shared_samples_are_paired():
    a = frame(CURVE)
    b = frame(CURVE).iloc[5:]  # b lacks five 256-token samples
    paired = paired_effective_length(a, b, "correct")
    assert paired.n == 35 and paired.a.counts[0] == 5


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_a_threshold_outside_zero_to_one_is_refused(threshold):
    with pytest.raises(ValueError, match="share"):
        effective_length(frame(CURVE), "correct", threshold=threshold)


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


def test_report_gives_each_run_its_effective_length(tmp_path, capsys):
    from conftest import invoke

    run = hand_made_run(tmp_path / "a", "model-a", CURVE)
    done = invoke(capsys, "report", str(run), "--no-plots")
    assert done.code == 0, done.err
    expected = effective_length(frame(CURVE), "correct")  # the same records as a frame
    assert f"### Effective length: model-a: 512 tokens [{expected.low}, {expected.high}]" in done.out
    assert "| 1024 | 0.800 | 0.80 | no | 10 |" in done.out


def test_compare_gives_both_models_and_their_difference(tmp_path, capsys):
    from conftest import invoke

    a = hand_made_run(tmp_path / "a", "model-a", CURVE)
    b = hand_made_run(tmp_path / "b", "model-b", {256: 10, 512: 5, 1024: 4, 2048: 2})
    done = invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert done.code == 0, done.err
    assert "## Effective length" in done.out
    assert "| model-a | 512 tokens [" in done.out and "| model-b | 256 tokens [" in done.out
    assert "| model-a minus model-b | +256 tokens [" in done.out
    (saved,) = [json.loads(p.read_text()) for p in (tmp_path / "cmp").glob("*/comparison.json")]
    found = saved["effective_length"]
    assert (found["a"]["value"], found["b"]["value"], found["diff"], found["n"]) == (512, 256, 256, 40)
    assert found["low"] <= 256 <= found["high"] and found["threshold"] == 0.85


def test_the_share_to_keep_is_an_option_of_report_and_compare(tmp_path, capsys):
    from conftest import invoke

    a = hand_made_run(tmp_path / "a", "model-a", CURVE)
    b = hand_made_run(tmp_path / "b", "model-b", {256: 10, 512: 5, 1024: 4, 2048: 2})
    done = invoke(capsys, "report", str(a), "--no-plots", "--effective-share", "0.75")
    assert done.code == 0, done.err
    assert "### Effective length: model-a: 2048 tokens" in done.out and "keeps at least 75%" in done.out
    done = invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp"), "--effective-share", "0.95")
    assert done.code == 0, done.err
    (saved,) = [json.loads(p.read_text()) for p in (tmp_path / "cmp").glob("*/comparison.json")]
    assert saved["effective_length"]["threshold"] == 0.95 and saved["effective_length"]["a"]["value"] == 256
    for command in (["report", str(a)], ["compare", str(a), str(b), "--out", str(tmp_path / "bad")]):
        done = invoke(capsys, *command, "--effective-share", "1.5")
        assert done.code == 2 and done.err.strip() == ("error: --effective-share: the share of the short-context score "
                                                       "to keep must be in (0, 1], got 1.5")
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


def test_the_paper_report_shows_effective_lengths(tmp_path, capsys):
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
    assert "| fake-target | 2048 tokens [2048, 2048] | 1.000 |" in needle
    assert "| fake-wrong | undefined: its score at the shortest length (1024 tokens) is zero | 0.000 |" in needle
    extra = markdown[markdown.index("Long context beyond the paper"):]
    assert "nolima (nolima)" in extra and "| fake-target | 2048 tokens [2048, 2048] |" in extra
    assert "heatmap_pair_onehop.png" in extra and "heatmap_diff_twohop.png" in extra
    assert "Long context beyond the paper" in done.out  # its reading, on the command line too


def test_samples_without_a_length_or_a_value_are_left_out():
    rows = frame(CURVE)
    rows.loc[0, "context_length"] = np.nan  # a record of another shape
    rows.loc[11, "correct"] = np.nan  # no value, and no error: not a fail
    found = effective_length(rows, "correct")
    assert found.counts == (9, 9, 10, 10) and found.value == 512
