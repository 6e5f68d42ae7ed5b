"""docs/ci-workflow.yml's trend job on a pull request: a checkpoint without a training step
(checkpoints/candidate saved without trainer_state.json) passes with a notice instead of exiting
2, and one with a step is evaluated at it. The job's own step-finding script is run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

WORKFLOW = Path(__file__).parents[1] / "docs" / "ci-workflow.yml"


def trend_steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["trend"]["steps"]


def found_step(checkpoint: Path, step: str, tmp_path: Path) -> str:
    """What the job's step-finding script writes to $GITHUB_OUTPUT for this checkpoint and input."""
    (script,) = [s["run"] for s in trend_steps() if s.get("id") == "step"]
    output = tmp_path / "github_output"
    output.write_text("")
    env = {**os.environ, "CHECKPOINT": str(checkpoint), "STEP": step, "GITHUB_OUTPUT": str(output),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-e", "-c", script], env=env, check=True, timeout=120)
    return output.read_text()


def test_a_candidate_without_a_step_skips_the_trend_and_one_with_a_step_is_evaluated_at_it(tmp_path):
    candidate = tmp_path / "checkpoints" / "candidate"
    candidate.mkdir(parents=True)
    assert found_step(candidate, "", tmp_path) == "step=\n"
    assert found_step(candidate, "700", tmp_path) == "step=700\n"
    (candidate / "trainer_state.json").write_text(json.dumps({"global_step": 1500}))
    assert found_step(candidate, "", tmp_path) == "step=1500\n"
    named = tmp_path / "run1" / "checkpoint-2500"
    named.mkdir(parents=True)
    assert found_step(named, "", tmp_path) == "step=2500\n"


def test_every_step_that_needs_the_training_step_waits_for_one():
    steps = {s.get("name"): s for s in trend_steps()}
    for name in ("Evaluate the new checkpoint at its step", "Trend and gate", "Keep the series for the next checkpoint"):
        assert "steps.step.outputs.step != ''" in steps[name].get("if", ""), name
    assert "--step \"${{ steps.step.outputs.step }}\"" in steps["Evaluate the new checkpoint at its step"]["run"]
    assert steps["No training step, no trend"]["if"] == "steps.step.outputs.step == ''"


def test_pull_requests_install_the_pinned_releases_and_a_scheduled_job_the_newest():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "schedule" in triggers and "pull_request" in triggers
    for name in ("smoke", "trend"):
        installs = [s["run"] for s in jobs[name]["steps"] if "pip install" in s.get("run", "")]
        assert installs and all("-c constraints.txt" in line for run in installs
                                for line in run.splitlines() if "pip install" in line and "--upgrade pip" not in line)
        assert jobs[name]["if"] == "github.event_name != 'schedule'"
    newest = jobs["newest"]
    assert "schedule" in newest["if"]
    (install,) = [s["run"] for s in newest["steps"] if "pip install" in s.get("run", "")]
    assert "constraints" not in install and "--upgrade" in install
