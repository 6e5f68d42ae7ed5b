"""An errored sample scores 0 on every higher-is-better metric, fractional ones too, and has no value of a
lower-is-better one: one rule, so report, compare, check, trend, the effective length and the Python frame
show the same rate for the same records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import invoke
from test_compare import synthetic_run

import evalsuite
from evalsuite.analysis.compare import compare
from evalsuite.analysis.effective_length import metric_scores
from evalsuite.analysis.frame import run_frame, summarize
from evalsuite.analysis.outcomes import load_outcomes
from evalsuite.runs.records import RunFolder

# two needles asked at once: correct_mean is 0, 0.5 or 1, a fractional metric
NEEDLE = {"needles": [2], "queries": [2], "lengths": [1024], "depths": [0], "samples": 4}
HALF = {"correct_all": False, "correct_mean": 0.5, "hits": [True, False], "ambiguous": False,
        "offered": [["x"], []], "correct_all_substring": False, "correct_mean_substring": 0.5}


def rewritten(folder: Path, changes: dict[int, dict]) -> Path:
    """The run's records with some replaced as a model that answers one query of two, or one whose
    sample errored, would have left them."""
    records = folder / "samples.jsonl"
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    for index, change in changes.items():
        rows[index].update(change)
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Step 1: scores 1, 0.5, 1, 0.5 (0.750). Step 2: 1, 0.5, 1 and an errored sample: 0.625 by the
    rule, 0.833 if the error were left out, which would rank the crashing checkpoint higher."""
    out = tmp_path_factory.mktemp("errors") / "results"
    runs = {step: evalsuite.run("needle", "fake:oracle", out=out, checkpoint_step=step, **NEEDLE).runs[0].path
            for step in (1, 2)}
    rewritten(runs[1], {1: {"scores": HALF}, 3: {"scores": HALF}})
    rewritten(runs[2], {1: {"scores": HALF}, 3: {"scores": {}, "error": "RuntimeError: CUDA out of memory"}})
    return {"out": out, "base": runs[1], "errored": runs[2]}


def test_a_fractional_metric_with_an_errored_sample_has_one_rate_everywhere(checkpoints, capsys, tmp_path):
    errored, base = checkpoints["errored"], checkpoints["base"]
    rate = 2.5 / 4

    report = invoke(capsys, "report", str(errored), "--no-plots")
    assert report.code == 0, report.err
    assert f"| {rate:.3f} [" in report.out and "0.833" not in report.out

    compared = compare(errored, base)
    (overall,) = [r for r in compared.overall if r["metric"] == "correct_mean"]
    assert (overall["mean_a"], overall["mean_b"], overall["n"]) == (pytest.approx(rate), pytest.approx(0.75), 4)
    assert f"errored samples: 1 of {errored.name}, 0 of {base.name}" in compared.markdown()

    checked = evalsuite.check(errored, base, alpha=0.1)  # four pairs reach p = 0.068 at best: 0.1 tests them
    (row,) = [c for c in checked.reported if c.metric == "correct_mean"]
    assert (row.candidate, row.baseline, row.n) == (pytest.approx(rate), pytest.approx(0.75), 4)
    assert any("1 candidate samples failed with an error" in note for note in checked.notes)

    points = evalsuite.api.trend([checkpoints["out"]], out=tmp_path).points
    (point,) = points[(points["step"] == 2) & (points["metric"] == "correct_mean") & (points["cell"] == "all")].itertuples()
    assert (point.mean, point.n) == (pytest.approx(rate), 4)

    frame = evalsuite.load(errored).frame
    assert frame["correct_mean"].mean() == pytest.approx(rate)  # the README's pandas line
    assert frame["correct_all"].mean() == pytest.approx(0.5)  # pass, fail, pass, error
    assert np.nanmean(metric_scores(frame, "correct_mean")) == pytest.approx(rate)  # what the effective length reads


def test_a_baseline_file_that_kept_no_value_for_an_errored_sample_reads_the_same(checkpoints, tmp_path):
    exported = evalsuite.api.export_baseline(checkpoints["errored"], tmp_path / "baseline.json")
    (from_file,) = load_outcomes(exported)
    errored_id = from_file.ids[3]
    assert from_file.scores["correct_mean"][3] is None and errored_id in from_file.errors  # the file keeps the raw record
    (from_run,) = load_outcomes(checkpoints["errored"])
    assert from_file.frame()["correct_mean"].tolist() == from_run.frame()["correct_mean"].tolist() == [1, 0.5, 1, 0]


def test_a_lower_is_better_metric_has_no_value_for_an_errored_sample(tmp_path):
    """A loss of 0 would be the best score: an errored sample has no nll, and the count of errors is kept."""
    folder = synthetic_run(tmp_path / "nll", "A", {"nll": [2.0, None, 3.0], "nll_second_half": [1.0, None, 2.0]},
                           axes=[{"context_length": 2048}] * 3, task="nll", errors={1: "RuntimeError: boom"})
    frame = run_frame(RunFolder(folder))
    assert frame["nll"].isna().tolist() == [False, True, False]
    (row,) = summarize(frame, (), ["nll"])
    assert (row["nll"], row["errors"]) == (2.5, 1)
    (outcomes,) = load_outcomes(folder)
    assert outcomes.frame()["nll"].isna().tolist() == [False, True, False]


def test_a_task_not_installed_here_scores_its_errored_samples_as_fails(tmp_path):
    """Its metrics are read from the records, and with no declaration of direction each is higher-is-better."""
    folder = synthetic_run(tmp_path / "plugin", "A", {"share": [0.5, None, 1.0]}, errors={1: "ValueError: x"})
    assert run_frame(RunFolder(folder))["share"].tolist() == [0.5, 0.0, 1.0]
