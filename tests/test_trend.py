"""Checkpoint series: the training step a run records (`--step`, a checkpoint folder's name, its
trainer_state.json), `evalsuite trend`'s points, figure and tables, and its gate, which checks each
checkpoint against an earlier one with `check`'s per-cell gate.

The series is real: the shipped toy-base checkpoint evaluated as steps 1000, 2000 and 3000, and a
copy of it whose middle layer's attention is broken (queries and keys scaled to zero) as step 4000."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import invoke

import evalsuite
from evalsuite.engine.steps import checkpoint_of, family_of, identity_with_step, step_from_name
from evalsuite.errors import UserError
from evalsuite.runs.identity import run_identity
from evalsuite.runs.records import config_hash

NEEDLE = {"lengths": [256, 512], "depths": [0, 0.5, 1], "samples": 2}
NEEDLE_FLAGS = ("-T", "lengths=256,512", "-T", "depths=0,0.5,1", "-T", "samples=2")
CELLS = 1 + 2 * 3  # all samples, then length x depth


# ---- the step of a checkpoint ---------------------------------------------------------------------

@pytest.mark.parametrize(("name", "step"), [
    ("checkpoint-1500", 1500), ("step_1500", 1500), ("global_step1500", 1500), ("global-step-20", 20),
    ("step1500", 1500), ("iter_0001500", 1500), ("run1-step1500", 1500), ("ckpt-7", 7), ("Checkpoint-0", 0),
    ("toy-base", None), ("llama-3-8b", None), ("checkpoint", None), ("model-v2", None), ("stepper-3x", None),
])
def test_the_step_is_read_from_a_checkpoint_folders_name(name, step):
    assert step_from_name(name) == step


@pytest.mark.parametrize(("name", "family"), [
    ("checkpoint-1500", "run1"), ("global_step1500", "run1"), ("run2-step1500", "run2"), ("toy-base", "toy-base"),
])
def test_the_family_is_the_name_without_its_step(name, family):
    assert family_of(name, Path("/data/run1") / name) == family


def test_the_step_is_read_from_trainer_state_json(tmp_path):
    folder = tmp_path / "runs" / "final"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2500, "epoch": 1.0}))
    found = checkpoint_of({"name": "final", "path": str(folder)}, None)
    assert found == {"step": 2500, "step_from": "trainer_state.json", "family": "final"}


def test_the_folders_name_comes_before_trainer_state_and_step_before_both(tmp_path):
    folder = tmp_path / "run1" / "checkpoint-300"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 300}))
    fingerprint = {"name": "checkpoint-300", "path": str(folder)}
    assert checkpoint_of(fingerprint, None) == {"step": 300, "step_from": "folder name", "family": "run1"}
    assert checkpoint_of(fingerprint, 7) == {"step": 7, "step_from": "--step", "family": "run1"}


def test_no_step_anywhere_is_no_checkpoint_entry(tmp_path):
    assert checkpoint_of({"name": "toy-base", "path": str(tmp_path / "toy-base")}, None) is None
    assert checkpoint_of({"name": "fake-oracle"}, None) is None  # a backend without a folder: --step only
    assert checkpoint_of({"name": "fake-oracle"}, 10)["step"] == 10


@pytest.mark.parametrize("content", ["{not json", json.dumps({"global_step": "ten"}), json.dumps([1, 2])])
def test_a_damaged_trainer_state_is_one_line_asking_for_step(tmp_path, content):
    (tmp_path / "trainer_state.json").write_text(content)
    with pytest.raises(UserError, match="--step N"):
        checkpoint_of({"name": "x", "path": str(tmp_path)}, None)


def test_only_a_step_changes_the_run_identity():
    identity = run_identity("needle", {"lengths": [256]}, None, {"name": "m", "backend": "fake"}, 1)
    assert identity_with_step(identity, None) is identity
    with_step = identity_with_step(identity, {"step": 5, "family": "m"})
    assert config_hash(with_step) != config_hash(identity)
    assert config_hash(identity_with_step(identity, {"step": 6, "family": "m"})) != config_hash(with_step)


def test_a_run_without_a_step_keeps_its_hash_and_config(tmp_path):
    run = evalsuite.run("needle", "fake:oracle", out=tmp_path, lengths=[768], depths=[0], samples=2).runs[0]
    config = run.read_config()
    assert "checkpoint" not in config
    expected = run_identity("needle", config["params"], config["limit"], config["model"], config["task_versions"]["plan"])
    assert config["hash"] == config_hash(expected)
    stepped = evalsuite.run("needle", "fake:oracle", out=tmp_path, lengths=[768], depths=[0], samples=2,
                            checkpoint_step=100).runs[0]
    assert stepped.path != run.path
    assert stepped.read_config()["checkpoint"] == {"step": 100, "step_from": "--step", "family": "fake-oracle"}


def test_a_negative_step_is_refused_in_one_line(capsys, tmp_path):
    code, out, err = invoke(capsys, "run", "--model", "fake:oracle", "--task", "needle", "-T", "lengths=768",
                            "--step", "-5", "--out", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "--step" in err and "Traceback" not in err


# ---- the toy series -------------------------------------------------------------------------------

def broken_copy(folder: Path) -> Path:
    """toy-base with layer 1's queries and keys scaled to zero: its attention there is uniform, so the
    retrieval circuit is gone."""
    from safetensors.torch import load_file, save_file

    from evalsuite.models import HERE

    shutil.copytree(HERE / "toy-base", folder)
    weights = load_file(folder / "model.safetensors")
    for name in ("q_proj", "k_proj"):
        key = f"model.layers.1.self_attn.{name}.weight"
        weights[key] = weights[key] * 0.0
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> dict[str, Path]:
    """Run folders by step under one results folder: toy-base at 1000, 2000, 3000; the broken copy
    at 4000 (its step read from its folder's name, checkpoint-4000) and again as 5000 (--step)."""
    import torch

    root = tmp_path_factory.mktemp("trend")
    out = root / "results"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as conftest's one_thread does for each test: a tiny model gains nothing from more
    try:
        runs = {step: evalsuite.run("needle", "toy-base", out=out, checkpoint_step=step, **NEEDLE).runs[0].path
                for step in (1000, 2000, 3000)}
        broken = broken_copy(root / "checkpoints" / "toy-base" / "checkpoint-4000")
        runs[4000] = evalsuite.run("needle", str(broken), out=out, **NEEDLE).runs[0].path
        runs[5000] = evalsuite.run("needle", str(broken), out=out, checkpoint_step=5000, **NEEDLE).runs[0].path
    finally:
        torch.set_num_threads(threads)
    return {"out": out, "root": root, **{str(step): path for step, path in runs.items()}}


def config_of(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_each_step_is_its_own_run_and_the_broken_checkpoint_scores_lower(series):
    folders = {series[str(step)] for step in (1000, 2000, 3000, 4000, 5000)}
    assert len(folders) == 5  # one checkpoint under three steps: three runs
    assert config_of(series["2000"])["checkpoint"] == {"step": 2000, "step_from": "--step", "family": "toy-base"}
    assert config_of(series["4000"])["checkpoint"] == {"step": 4000, "step_from": "folder name", "family": "toy-base"}
    good, broken = summary_of(series["3000"])["overall"], summary_of(series["4000"])["overall"]
    assert good["correct_all"] == 1.0 and broken["correct_all"] <= 0.25, (good, broken)


def test_the_cli_step_finds_the_run_the_api_made(capsys, series):
    code, out, err = invoke(capsys, "run", "--model", "toy-base", "--task", "needle", *NEEDLE_FLAGS,
                            "--step", "2000", "--out", str(series["out"]), "--no-progress")
    assert code == 0, err
    assert str(series["2000"].name) in out  # the same folder, already finished


def test_the_first_three_checkpoints_pass_the_gate(capsys, series, tmp_path):
    runs = [str(series[step]) for step in ("1000", "2000", "3000")]
    code, out, err = invoke(capsys, "trend", *runs, "--gate", "--out", str(tmp_path))
    assert code == 0, out + err
    assert "PASS (2 checkpoints checked)" in out
    assert out.count("| pass |") == 2 and "REGRESSION" not in out


def test_a_broken_checkpoint_fails_the_gate_naming_its_step(capsys, series, tmp_path, monkeypatch):
    summary_file = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    code, out, err = invoke(capsys, "trend", str(series["out"]), "--gate", "--out", str(tmp_path))
    assert code == 1, out + err
    # the cells of 2 samples are not testable (p >= 0.26 at best); the 12 samples over all fail
    assert "| toy-base | 4000 | 3000 | 7 | 1 | **REGRESSION** |" in out
    assert "| toy-base | 5000 | 4000 | 7 | 0 | pass |" in out  # the same broken weights again: no drop
    assert "step 4000 (toy-base) failed correct_all over all samples" in out
    assert "step 5000" not in out.split("| pass |")[-1]
    figure = tmp_path / "trend_correct_all.png"
    assert figure.stat().st_size > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(figure).shape[1] > 500
    table = (tmp_path / "trend.md").read_text()
    assert "## evalsuite check: FAIL" in table  # the full check table of the regression
    assert "| toy-base | 4000 | 3000 | 7 | 1 | **REGRESSION** |" in summary_file.read_text()


def test_against_best_gates_the_latest_checkpoint_against_the_best_before_it(capsys, series, tmp_path):
    code, out, _ = invoke(capsys, "trend", str(series["out"]), "--gate", "--latest-only", "--out", str(tmp_path))
    assert code == 0 and "| toy-base | 5000 | 4000 | 7 | 0 | pass |" in out and "PASS (1 checkpoint checked)" in out
    code, out, _ = invoke(capsys, "trend", str(series["out"]), "--gate", "--latest-only", "--against", "best",
                          "--out", str(tmp_path))
    assert code == 1 and "| toy-base | 5000 | 3000 | 7 | 1 | **REGRESSION** |" in out


def test_the_points_hold_each_cell_with_a_wilson_interval(series, tmp_path):
    import pandas as pd

    result = evalsuite.api.trend([series["out"]], out=tmp_path)
    assert not result.gated and (tmp_path / "trend.csv").is_file()
    points = pd.read_csv(tmp_path / "trend.csv")
    primary = points[points["metric"] == "correct_all"]
    assert sorted(primary["step"].unique()) == [1000, 2000, 3000, 4000, 5000]
    assert (primary.groupby("step").size() == CELLS).all()
    pooled = primary[(primary["cell"] == "all") & (primary["step"] == 1000)].iloc[0]
    assert (pooled["n"], pooled["mean"]) == (12, 1.0)
    assert pooled["low"] == pytest.approx(0.7575, abs=1e-4)  # Wilson's lower bound for 12 of 12
    assert set(points["family"]) == {"toy-base"}


# ---- series are kept apart; bad input -------------------------------------------------------------

def test_runs_of_another_task_configuration_are_another_series(capsys, tmp_path):
    for step, lengths in ((1, [768]), (2, [768]), (1, [1024]), (2, [1024])):  # 6 samples: 4 cannot reach 0.05
        evalsuite.run("needle", "fake:oracle", out=tmp_path / "r", lengths=lengths, depths=[0, 0.5, 1], samples=2,
                      checkpoint_step=step)
    code, out, err = invoke(capsys, "trend", str(tmp_path / "r"), "--gate", "--out", str(tmp_path / "t"))
    assert code == 0, out + err
    assert "| fake-oracle #1 | 2 | 1 |" in out and "| fake-oracle #2 | 2 | 1 |" in out


def test_a_series_of_one_checkpoint_has_nothing_to_gate(capsys, tmp_path):
    evalsuite.run("needle", "fake:oracle", out=tmp_path, lengths=[768], depths=[0, 1], samples=2, checkpoint_step=1)
    code, out, err = invoke(capsys, "trend", str(tmp_path), "--gate", "--latest-only", "--out", str(tmp_path / "t"))
    assert code == 0, err
    assert "note: nothing gated: no series has two checkpoints yet" in out


def test_two_runs_of_one_step_are_refused(capsys, tmp_path):
    for limit in (None, 2):
        evalsuite.run("needle", "fake:oracle", out=tmp_path, lengths=[768], depths=[0, 1], samples=2, limit=limit,
                      checkpoint_step=1)
    code, _, err = invoke(capsys, "trend", str(tmp_path), "--out", str(tmp_path / "t"))
    assert code == 2 and "two runs of fake-oracle at step 1" in err and err.count("\n") == 1


def test_no_run_with_a_step_is_one_line(capsys, tmp_path):
    evalsuite.run("needle", "fake:oracle", out=tmp_path, lengths=[768], depths=[0], samples=2)
    code, _, err = invoke(capsys, "trend", str(tmp_path), "--out", str(tmp_path / "t"))
    assert code == 2 and "no finished run with a training step" in err and err.count("\n") == 1
    code, _, err = invoke(capsys, "trend", str(tmp_path / "missing"))
    assert code == 2 and "no such run folder" in err


def test_against_without_gate_is_a_usage_error(capsys, tmp_path):
    code, _, err = invoke(capsys, "trend", str(tmp_path), "--against", "best")
    assert code == 2 and "--gate" in err
