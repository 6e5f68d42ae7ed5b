"""A run is its content: weights, config, tokenizer and task parameters, never where files live."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import invoke

from evalsuite.runs.identity import unversioned_identity
from evalsuite.runs.records import config_hash

TOY_BASE = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-base"
NEEDLE = ["--task", "needle", "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=1", "--no-progress"]


def run_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir())


def test_a_copied_checkpoint_resumes_the_same_run_folder(capsys, tmp_path):
    out = tmp_path / "out"
    for place in ("first", "second"):
        copy = tmp_path / place / "toy-base"
        shutil.copytree(TOY_BASE, copy)
        assert invoke(capsys, "run", "--model", str(copy), *NEEDLE, "--out", str(out)).returncode == 0
    (folder,) = run_folders(out)
    config = json.loads((folder / "config.json").read_text())
    assert config["identity_rule"] == "content+plan-version"
    assert config["model"]["path"].endswith("first/toy-base")  # where it was first found, for the reader
    assert (folder / "samples.jsonl").read_text().count("\n") == 2  # the second run added nothing


def test_a_folder_of_a_release_that_recorded_no_task_version_is_named_not_resumed(capsys, tmp_path):
    out = tmp_path / "out"
    assert invoke(capsys, "run", "--model", "toy-base", *NEEDLE, "--out", str(out)).returncode == 0
    (folder,) = run_folders(out)
    config = json.loads((folder / "config.json").read_text())
    earlier = config_hash(unversioned_identity(config["task"], config["params"], config["limit"], config["model"]))
    # the folder as the earlier release named it: its hash without the task's plan version
    old = folder.with_name(folder.name.rsplit("-", 1)[0] + "-" + earlier[:10])
    folder.rename(old)
    result = invoke(capsys, "run", "--model", "toy-base", *NEEDLE, "--out", str(out))
    assert result.returncode == 0
    assert f"{old} holds this run as an earlier evalsuite made it" in result.stderr
    assert run_folders(out) == sorted([old, folder])
    assert (folder / "samples.jsonl").read_text().count("\n") == 2
