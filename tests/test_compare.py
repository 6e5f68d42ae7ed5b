"""`evalsuite compare`: pairing on sample id, paired tests, tables and heatmaps."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from conftest import invoke
from scipy import stats as sps

from evalsuite.analysis.compare import compare, compare_runs, paired_test
from evalsuite.analysis.tables import display_rows
from evalsuite.backends import load_model
from evalsuite.engine.runner import RunOptions, make_task, run_task
from evalsuite.errors import UserError
from evalsuite.runs.identity import task_identity
from evalsuite.runs.records import Record, RunFolder, config_hash
from evalsuite.tasks.needle.view import significance_marks

NEEDLE_PARAMS = {"lengths": "1024,2048", "depths": "0,1", "samples": "6"}


def needle_run(out: Path, model: str, params: dict[str, str] = NEEDLE_PARAMS, limit: int | None = None,
               log_prompts: bool = False) -> Path:
    """A finished needle run of a fake model, made in-process (fast)."""
    options = RunOptions(out=out, limit=limit, log_prompts=log_prompts, progress=False)
    return run_task(make_task("needle", params), load_model(model, {}, "cpu"), options).path


def synthetic_run(folder: Path, model: str, scores: dict[str, list], axes: list[dict] | None = None,
                  task: str = "synthetic", params: dict | None = None, errors: dict[int, str] | None = None) -> Path:
    """A finished run folder written directly from records: one record per position of
    the score lists, ids s0000, s0001, ... so that runs pair up."""
    n = len(next(iter(scores.values())))
    params = params or {"size": n}
    config = {"task": task, "params": params, "limit": None, "model": {"name": model}}
    config["hash"] = config_hash(config)
    run = RunFolder(folder)
    run.create(config)
    errors = errors or {}
    records = []
    for i in range(n):
        row = {m: values[i] for m, values in scores.items() if values[i] is not None}
        records.append(Record(id=f"s{i:04d}", task=task, model=model, axes=(axes or [{}] * n)[i], target=("t",),
                              prompt={"sha256": "0"}, info={}, outputs=(f"out {i}",), scores=row,
                              error=errors.get(i), run=config["hash"]))
    run.append(records)
    run.write_summary({"task": task, "n": n})
    return folder


def pass_fail_pair(only_a: int, only_b: int, both: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * only_a + [False] * only_b + [True] * both + [False] * neither
    b = [False] * only_a + [True] * only_b + [True] * both + [False] * neither
    return a, b


def test_needle_oracle_vs_wrong_writes_tables_and_marked_heatmap(tmp_path, capsys):
    run_a, run_b = needle_run(tmp_path, "fake:oracle"), needle_run(tmp_path, "fake:wrong")
    code, out, err = invoke(capsys, "compare", str(run_a), str(run_b), "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    assert "| correct_all | 24 | 1.000 | 0.000 | +1.000" in out
    folder = Path(out.split("written: ")[1].split()[0])
    for name in ("comparison.md", "comparison.tex", "comparison.json", "overall.csv", "cells.csv",
                 "heatmap_pair.png", "heatmap_diff.png"):
        assert (folder / name).is_file(), name
    overall = pd.read_csv(folder / "overall.csv").set_index("metric")
    assert overall.loc["correct_all", "diff"] == 1.0
    assert overall.loc["correct_all", "a_only"] == 24 and overall.loc["correct_all", "b_only"] == 0
    assert overall.loc["correct_all", "p_value"] == pytest.approx(2 * 0.5**24)
    cells = pd.read_csv(folder / "cells.csv")
    assert len(cells) == 2 * 2 * 4  # lengths x depths x metrics (strict and substring)
    # 6 of 6 discordant in a cell: exact two-sided McNemar p = 2/64 < 0.05, so every cell is marked
    assert cells["p_value"].tolist() == pytest.approx([2 / 64] * 16)
    assert cells["significant"].all()
    assert r"correct\_all" in (folder / "comparison.tex").read_text()
    picture = mpimg.imread(folder / "heatmap_diff.png")
    assert picture.shape[0] > 100 and picture.std() > 0


def test_needle_marks_follow_significance(tmp_path):
    run_a = needle_run(tmp_path, "fake:oracle", {"lengths": "1024", "depths": "0,1", "samples": "2"})
    run_b = needle_run(tmp_path, "fake:wrong", {"lengths": "1024", "depths": "0,1", "samples": "2"})
    marks = significance_marks(compare(run_a, run_b).cells)
    # 2 of 2 discordant: p = 0.5, not significant
    assert list(marks) == [(1, 1)]
    assert not marks[(1, 1)].to_numpy().any()


def test_tiny_diff_vs_base_writes_tables_and_heatmap(tmp_path, tiny_models):
    params = {"lengths": "128,256", "depths": "0,1", "samples": "1", "tokens_per_query": "4"}
    runs = []
    for kind in ("diff", "base"):
        options = RunOptions(out=tmp_path, progress=False)
        runs.append(run_task(make_task("needle", params), load_model(str(tiny_models[kind]), {}, "cpu"), options))
    folder = compare_runs(runs[0].path, runs[1].path, tmp_path / "cmp")
    saved = json.loads((folder / "comparison.json").read_text())
    assert {row["metric"] for row in saved["overall"]} == {"correct_all", "correct_mean", "correct_all_substring",
                                                           "correct_mean_substring"}
    assert all(row["n"] == 4 for row in saved["overall"])
    assert (folder / "heatmap_diff.png").stat().st_size > 1000
    assert (saved["a"]["model"], saved["b"]["model"]) == ("tiny-diff", "tiny-base")
    assert "# needle: tiny-diff vs tiny-base" in (folder / "comparison.md").read_text()


def test_different_task_configurations_are_refused(tmp_path, capsys):
    run_a = needle_run(tmp_path, "fake:oracle", {"lengths": "1024", "depths": "0", "samples": "1"})
    run_b = needle_run(tmp_path, "fake:oracle", {"lengths": "2048", "depths": "0", "samples": "1"})
    with pytest.raises(UserError, match=r"lengths: \[1024\] vs \[2048\]"):
        compare(run_a, run_b)
    code, _, err = invoke(capsys, "compare", str(run_a), str(run_b), "--out", str(tmp_path / "cmp"))
    assert code == 2
    assert err.startswith("error: cannot compare") and len(err.strip().splitlines()) == 1


def test_runs_join_on_sample_id_when_one_was_limited(tmp_path):
    run_a = needle_run(tmp_path, "fake:oracle", {"lengths": "1024", "depths": "0,1", "samples": "3"})
    run_b = needle_run(tmp_path, "fake:wrong", {"lengths": "1024", "depths": "0,1", "samples": "3"}, limit=4)
    comparison = compare(run_a, run_b)
    assert comparison.overall[0]["n"] == 4
    assert "left out, present in one run only: 2 of fake-oracle, 0 of fake-wrong" in comparison.notes()


def test_same_model_twice_is_labelled_by_run_folder(tmp_path):
    run_a = synthetic_run(tmp_path / "r1", "m", {"score": [1, 0, 1]})
    run_b = synthetic_run(tmp_path / "r2", "m", {"score": [1, 1, 1]})
    assert compare(run_a, run_b).names == ("r1", "r2")


def test_pass_fail_metric_uses_exact_mcnemar(tmp_path):
    a, b = pass_fail_pair(only_a=10, only_b=2, both=30, neither=8)
    comparison = compare(synthetic_run(tmp_path / "a", "A", {"ok": a}), synthetic_run(tmp_path / "b", "B", {"ok": b}))
    row = comparison.overall[0]
    assert (row["test"], row["n"], row["a_only"], row["b_only"]) == ("McNemar", 50, 10, 2)
    assert row["diff"] == pytest.approx(8 / 50)
    assert row["p_value"] == pytest.approx(sps.binomtest(10, 12, 0.5).pvalue)
    assert row["low"] < row["diff"] < row["high"]


def test_continuous_metric_uses_paired_bootstrap(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.uniform(0.2, 0.8, size=60)
    shifted = base - 0.1 + rng.normal(0, 0.02, size=60)  # every sample a little worse
    run_a = synthetic_run(tmp_path / "a", "A", {"bleu": base.tolist()})
    run_b = synthetic_run(tmp_path / "b", "B", {"bleu": shifted.tolist()})
    row = compare(run_a, run_b).overall[0]
    assert row["test"] == "permutation" and "a_only" not in row
    assert row["diff"] == pytest.approx(float((base - shifted).mean()))
    assert row["p_value"] < 0.001 and row["low"] > 0.09
    same = compare(run_a, synthetic_run(tmp_path / "c", "C", {"bleu": base.tolist()})).overall[0]
    assert same["diff"] == 0 and same["p_value"] == 1.0


def test_unregistered_task_infers_axes_and_metrics_and_plots(tmp_path):
    axes = [{"n_shots": s, "dataset": d} for s in (1, 4, 16) for d in ("x", "y") for _ in range(5)]
    a = [1.0] * 30
    b = [1.0 if ax["n_shots"] > 1 else 0.0 for ax in axes]
    run_a = synthetic_run(tmp_path / "a", "A", {"acc": a}, axes)
    run_b = synthetic_run(tmp_path / "b", "B", {"acc": b}, axes)
    folder = compare_runs(run_a, run_b, tmp_path / "cmp")
    cells = pd.read_csv(folder / "cells.csv")
    assert list(cells.columns[:2]) == ["dataset", "n_shots"]
    assert cells.set_index(["dataset", "n_shots"])["diff"].to_dict() == {
        ("x", 1): 1.0, ("x", 4): 0.0, ("x", 16): 0.0, ("y", 1): 1.0, ("y", 4): 0.0, ("y", 16): 0.0}
    assert (folder / "difference_acc.png").stat().st_size > 1000


def test_an_errored_sample_counts_as_a_fail(tmp_path):
    run_a = synthetic_run(tmp_path / "a", "A", {"ok": [True, True, True]})
    run_b = synthetic_run(tmp_path / "b", "B", {"ok": [True, None, True]}, errors={1: "judge timed out"})
    row = compare(run_a, run_b).overall[0]
    assert (row["n"], row["a_only"], row["mean_b"]) == (3, 1, pytest.approx(2 / 3))


def test_the_paired_test_is_deterministic_and_resamples_clusters_whole():
    rng = np.random.default_rng(5)
    a, b = rng.random(200), rng.random(200)
    first, second = paired_test(a, b, False), paired_test(a, b, False)
    assert first == second
    clusters = [i // 20 for i in range(200)]  # ten clusters of twenty correlated samples
    shifted = b.copy()
    for c in range(10):
        shifted[c * 20:(c + 1) * 20] += rng.normal(0, 0.3)
    independent, clustered = paired_test(a, shifted, False), paired_test(a, shifted, False, clusters)
    assert clustered["diff"] == pytest.approx(independent["diff"])
    assert clustered["high"] - clustered["low"] > 2 * (independent["high"] - independent["low"])
    assert clustered["test"] == "permutation (clustered)" and clustered["clusters"] == 10


def test_compare_needs_existing_inputs(tmp_path, capsys):
    code, _, err = invoke(capsys, "compare", str(tmp_path / "missing-a"), str(tmp_path / "missing-b"))
    assert code == 2 and err.startswith("error: no such run folder or suite result")


def test_identity_ignores_preset_and_where_the_package_is_installed():
    import evalsuite

    shipped = str(Path(evalsuite.__file__).resolve().parent / "suites" / "data" / "x.jsonl")
    config = {"task": "icl", "params": {"data": shipped, "shots": "1,4", "preset": "smoke"}}
    assert task_identity(config) == {"task": "icl", "params": {"data": "<evalsuite>/suites/data/x.jsonl",
                                                               "shots": "1,4"}}
    elsewhere = {"task": "icl", "params": {"data": "/home/me/x.jsonl", "shots": "1,4"}}
    assert task_identity(elsewhere)["params"]["data"] == "/home/me/x.jsonl"


def test_one_paired_document_is_not_testable_and_the_run_still_succeeds(tmp_path, capsys):
    """Two toy models on one document: the runs and the comparison succeed, and every statistic
    that needs two or more paired samples says so instead of failing."""
    document = tmp_path / "ONE_DOCUMENT.txt"
    words = "the river ran past the old mill and the miller counted his sacks of grain".split()
    document.write_text(" ".join(words[i % len(words)] for i in range(3000)) + "\n", encoding="utf-8")
    code, out, err = invoke(capsys, "run", "--model", "toy-diff", "--model", "toy-base", "--task", "nll",
                            "-T", "lengths=2048", "-T", f"data={document}", "--out", str(tmp_path / "out"),
                            "--no-progress")
    assert code == 0, err
    assert "Traceback" not in err
    folder = next((tmp_path / "out").glob("compare-nll-*"))
    table = (folder / "comparison.md").read_text()
    assert table.count("not testable (n = 1)") == 4  # nll and nll_second_half, overall and at 2048
    overall = pd.read_csv(folder / "overall.csv").set_index("metric")
    assert overall.loc["nll", "n"] == 1 and np.isnan(overall.loc["nll", "p_value"])
    assert np.isfinite(overall.loc["nll", "diff"])


@pytest.mark.parametrize("a, b, clusters, label", [
    ([], [], None, "not testable (n = 0)"),
    ([1.0], [0.0], None, "not testable (n = 1)"),
    ([True], [False], None, "not testable (n = 1)"),
    ([0.2, 0.4, 0.9], [0.1, 0.3, 0.5], ["d", "d", "d"], "not testable (n = 3 in 1 cluster)"),
])
def test_fewer_than_two_paired_samples_are_shown_as_not_testable(a, b, clusters, label):
    pass_fail = bool(a) and isinstance(a[0], bool)
    row = paired_test(np.array(a, dtype=float), np.array(b, dtype=float), pass_fail, clusters)
    assert row["test"] == label and np.isnan(row["p_value"]) and np.isnan(row["low"]) and np.isnan(row["high"])
    row.update(metric="m", significant=False)
    header, body = display_rows([row], [], ("A", "B"))
    cells = dict(zip(header, body[0]))
    assert cells["test"] == label and cells["p"] == "n/a" and cells["significant"] == "n/a"


def test_an_untestable_row_is_written_with_an_empty_significant_cell():
    """One paired sample in a cell: no test, so `significant` is neither True nor False (empty in the CSV)."""
    from evalsuite.analysis.compare import compare_frames
    from evalsuite.analysis.tables import csv_frame

    ids = [f"s{i}" for i in range(5)]
    cells = ["a", "b", "b", "b", "b"]
    frame_a = pd.DataFrame({"id": ids, "cell": cells, "ok": [1.0, 1.0, 1.0, 1.0, 1.0]})
    frame_b = pd.DataFrame({"id": ids, "cell": cells, "ok": [0.0, 0.0, 0.0, 0.0, 0.0]})
    rows = compare_frames(frame_a, frame_b, ["cell"], ["ok"])
    assert [row["significant"] for row in rows] == [None, False]  # n = 1 untestable; n = 4: p = 0.125
    written = pd.read_csv(__import__("io").StringIO(csv_frame(rows, ["cell"]).to_csv(index=False)),
                          keep_default_na=False)
    assert written["significant"].tolist() == ["", "False"]


def test_an_errored_sample_counts_as_a_fail_in_report_and_compare_alike(tmp_path, capsys):
    """One rule everywhere: one pass and one errored sample is 0.500 in the report's summary, compare
    and the paper report (the report showed 1.000 with n = 2 before), and the report's table says so."""
    from evalsuite.analysis.frame import run_frame, summarize
    from evalsuite.analysis.report import report_runs
    from evalsuite.paper.measures import estimates

    errored = synthetic_run(tmp_path / "a", "A", {"ok": [True, None]}, errors={1: "RuntimeError: boom"})
    fine = synthetic_run(tmp_path / "b", "B", {"ok": [True, True]})
    (row,) = summarize(run_frame(RunFolder(errored)), (), ["ok"])
    assert (row["ok"], row["n"], row["errors"]) == (0.5, 2, 1)
    (overall,) = [r for r in compare(errored, fine).overall if r["metric"] == "ok"]
    assert (overall["mean_a"], overall["n"]) == (0.5, 2)
    ((_, estimate),) = estimates(RunFolder(errored), (), "ok").items()
    assert (estimate.mean, estimate.n) == (0.5, 2)

    ran = invoke(capsys, "run", "--model", "fake", "--task", "needle", "-T", "lengths=1024", "-T", "depths=0",
                 "-T", "samples=2", "--no-progress", "--out", str(tmp_path / "runs"))
    assert ran.code == 0, ran.err
    (records,) = (tmp_path / "runs").glob("needle-*/samples.jsonl")
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    rows[0].update(error="RuntimeError: boom", scores={})
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report_runs([records.parent], plots=False)
    assert "| 0.500 [" in text and "(1 errored); a sample that failed with an error counts as a fail" in text
