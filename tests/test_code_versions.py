"""Runs know the code that made them: a changed prompt builder starts a new run folder, a changed
scorer scores the saved outputs again on resume with no model call, and the commands that pair runs
name every difference of code between them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite.tasks.needle.task import Needle

NEEDLE = ["--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "--no-progress"]


def one_run(capsys, out: Path, model: str = "fake") -> Path:
    """The run folder the command wrote into (the newest, where several are there)."""
    result = invoke(capsys, "run", "--model", model, *NEEDLE, "--out", str(out))
    assert result.returncode == 0, result.stderr
    return max((p for p in out.iterdir() if p.name.startswith("needle-")), key=lambda p: p.stat().st_mtime_ns)


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_the_config_records_the_task_and_library_versions(capsys, tmp_path):
    config = json.loads((one_run(capsys, tmp_path / "out") / "config.json").read_text())
    assert config["task_versions"] == {"plan": Needle.plan_version, "score": Needle.score_version}
    assert {"evalsuite", "transformers", "torch"} <= set(config["versions"])


def test_a_run_of_an_older_plan_version_is_not_resumed(capsys, tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = one_run(capsys, out)
    monkeypatch.setattr(Needle, "plan_version", Needle.plan_version + 1)
    second = one_run(capsys, out)
    assert second != first
    assert json.loads((second / "config.json").read_text())["task_versions"]["plan"] == Needle.plan_version
    assert len(records(second)) == len(records(first)) == 4  # the new folder ran every sample itself


def test_a_run_of_an_older_scoring_version_is_scored_again_without_a_model_call(capsys, tmp_path, monkeypatch):
    out = tmp_path / "out"
    folder = one_run(capsys, out, "fake:oracle")
    good = records(folder)
    assert all(r["scores"]["correct_all"] for r in good)
    # as an older scorer left it: every sample wrong, scoring version 1
    (folder / "samples.jsonl").write_text("".join(json.dumps({**r, "scores": {**r["scores"], "correct_all": False}})
                                                  + "\n" for r in good))
    monkeypatch.setattr(Needle, "score_version", Needle.score_version + 1)

    from evalsuite.backends import fake

    def no_call(*args, **kwargs):
        raise AssertionError("the model was asked to generate")

    monkeypatch.setattr(fake.FakeModel, "generate", no_call)
    result = invoke(capsys, "run", "--model", "fake:oracle", *NEEDLE, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"scored its 4 saved outputs again with version {Needle.score_version} (no model call)" in result.stderr
    assert [r["scores"] for r in records(folder)] == [r["scores"] for r in good]
    config = json.loads((folder / "config.json").read_text())
    assert config["task_versions"]["score"] == Needle.score_version
    assert json.loads((folder / "summary.json").read_text())["overall"]["correct_all"] == 1.0


@pytest.fixture()
def two_versions(capsys, tmp_path) -> tuple[Path, Path]:
    """The same run twice, the second as a different transformers release recorded it."""
    a = one_run(capsys, tmp_path / "a")
    b = tmp_path / "b" / a.name
    shutil.copytree(a, b)
    config = json.loads((b / "config.json").read_text())
    config["versions"]["transformers"] = "4.99.0"
    (b / "config.json").write_text(json.dumps(config))
    return a, b


def test_compare_names_the_versions_that_differ(capsys, two_versions, tmp_path):
    a, b = two_versions
    result = invoke(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert result.returncode == 0, result.stderr
    want = json.loads((a / "config.json").read_text())["versions"]["transformers"]
    assert f"note: these runs were made by different code: transformers {want} vs 4.99.0" in result.stderr


def test_check_same_versions_refuses_runs_of_different_code(capsys, two_versions):
    a, b = two_versions
    alpha = ("--alpha", "0.1")  # four pairs reach p = 0.068 at best: at 0.1 the check has something to test
    plain = invoke(capsys, "check", str(a), "--baseline", str(b), *alpha)
    assert plain.returncode == 0 and "transformers" in plain.stderr
    strict = invoke(capsys, "check", str(a), "--baseline", str(b), "--same-versions", *alpha)
    assert strict.returncode == 2
    assert "--same-versions: these runs were made by different code: transformers" in strict.stderr
    same = invoke(capsys, "check", str(a), "--baseline", str(a), "--same-versions", *alpha)
    assert same.returncode == 0, same.stderr


def test_a_release_outside_the_tested_range_warns_once_and_is_recorded(capsys, tmp_path, monkeypatch):
    from evalsuite.engine import code_versions
    from evalsuite.modeling import compat

    monkeypatch.setattr(compat, "TESTED", {"transformers": ("1.0.0", "1.0.1")})
    monkeypatch.setattr(code_versions, "_warned", set())
    result = invoke(capsys, "run", "--model", "fake", *NEEDLE, "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: transformers")]
    assert len(warnings) == 1 and "is newer than the newest tested (1.0.1)" in warnings[0]
    folder = next((tmp_path / "out").iterdir())
    assert "transformers" in json.loads((folder / "config.json").read_text())["untested_versions"]
