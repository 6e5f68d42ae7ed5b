"""Every registered task, built-in or from an outside package (tests/plugin_pkg, installed here
as pip installs it), held to what the Task contract promises:

- a deterministic plan: the same parameters and seed give the same samples, from a fresh task;
- no answer in any request: a request is the same when its sample's targets are replaced by
  other strings, none of which it then shows (its prompt, context, continuation, stop strings
  or closed answer set), so a request cannot carry the answer it is scored against. Probe
  requests measure the model itself (teacher-forced text, answers included where the probe asks
  for them) and are scored against no target: they are left out;
- scores that cover the declared metrics, for every sample, with no scoring error;
- a declared plan and score version (whole numbers from 1), recorded with every run;
- a view that draws from a run: records this test writes (two models, one run each), summarised,
  plotted, compared and shown in HTML by the task's own view;
- `prepare(None)` works, as it must to read a finished run without loading a model.

Each task runs its smoke plan (`smoke_plan` in its header; tests/task_checks.py fills "{data}" with
tests/paper_data.py's files); tasks that need a capability run on the built-in toy pair, the rest on
the scripted fake model (a byte tokenizer: its lengths are bytes). An outside task without a smoke
plan runs at its defaults, its plan cut to LIMIT samples; every task of evalsuite's own folders
declares one, and every such folder is checked. Two deliberately bad tasks show that the checks can fail.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import pytest
from paper_data import write_paper_data
from task_checks import (
    LIMIT,
    answer_problems,
    model,
    models_for,
    plan_problems,
    score_problems,
    smoke_params,
    smoke_plan_problem,
    write_run,
)

from evalsuite import registry
from evalsuite.contracts import TaskBase, TaskView
from evalsuite.types import GenerationRequest, Sample

PLUGIN = Path(__file__).parent / "plugin_pkg"


def _install_plugin() -> None:
    """tests/plugin_pkg installed by pip into a folder of its own, put on the path, and its entry
    points loaded as the registry loads any outside package's."""
    target = Path(tempfile.mkdtemp(prefix="evalsuite-plugin-"))
    atexit.register(shutil.rmtree, target, True)
    source = Path(shutil.copytree(PLUGIN, target / "source", ignore=shutil.ignore_patterns("build", "*.egg-info")))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target / "site"), str(source)], check=True, capture_output=True)
    sys.path.insert(0, str(target / "site"))
    importlib.invalidate_caches()
    registry.load_all()  # the tasks declared; a registry read before the plugin was there misses it
    for ep in entry_points(group="evalsuite.tasks"):
        if ep.name not in registry.TASKS:
            registry.register_task(ep.load())


_install_plugin()
TASK_NAMES = sorted(registry.TASKS)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_paper_data(tmp_path_factory.mktemp("paper-data"))


def make(name: str, data: Path) -> Any:
    from evalsuite.engine.runner import make_task

    return make_task(name, smoke_params(registry.get_task(name), data))


@cache
def prepared(name: str, data: Path) -> tuple[Any, Any, Any, list[Sample]]:
    """(task, model, state, plan), made once per task for the checks that read them."""
    task = make(name, data)
    first, _ = models_for(task)
    state = task.prepare(first)
    return task, first, state, list(task.plan(state))


# ---- the conformance suite, one test per promise and task ---------------------------------------------


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_plan_is_deterministic(name, data):
    task = make(name, data)
    assert plan_problems(lambda: make(name, data), models_for(task)[0]) == []


@pytest.mark.parametrize("name", TASK_NAMES)
def test_no_request_carries_its_answer(name, data):
    task, first, state, plan = prepared(name, data)
    assert answer_problems(task, first, state, plan[:LIMIT]) == []


@pytest.mark.parametrize("name", TASK_NAMES)
def test_scores_cover_the_declared_metrics(name, data):
    from evalsuite.engine.runner import evaluate

    task, first, state, plan = prepared(name, data)
    records = evaluate(task, first, state, plan[:LIMIT], log_prompts=False)
    assert len(records) == len(plan[:LIMIT]) and score_problems(task, records) == []


@pytest.mark.parametrize("name", TASK_NAMES)
def test_plan_and_score_versions_are_declared_and_recorded(name, data, tmp_path):
    task, first, state, plan = prepared(name, data)
    for version in (type(task).plan_version, type(task).score_version):
        assert isinstance(version, int) and not isinstance(version, bool) and version >= 1
    config = write_run(task, first, state, plan[:1], tmp_path).read_config()
    assert config["task_versions"] == {"plan": type(task).plan_version, "score": type(task).score_version}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_view_draws_from_a_run_this_test_writes(name, data, tmp_path):
    from evalsuite.analysis.compare import compare

    task, first, state, plan = prepared(name, data)
    second = models_for(task)[1]
    runs = [write_run(task, m, task.prepare(m), plan[:LIMIT], tmp_path / "runs") for m in (first, second)]
    view = task.view(task)
    summary = json.loads(runs[0].summary_path.read_text())
    assert summary["n"] == len(plan[:LIMIT]) and summary["errors"] == 0
    if type(view).plots is not TaskView.plots:  # a view that draws: its files are there and not empty
        assert summary["plots"] and all((runs[0].plots / p).stat().st_size > 0 for p in summary["plots"])
    comparison = compare(runs[0].path, runs[1].path)
    drawn = [*view.pair_report(comparison, tmp_path), *view.grid_report([comparison], tmp_path)]
    assert all(Path(p).is_file() and Path(p).stat().st_size > 0 for p in drawn)
    html = view.html_samples(runs[0].read_records())
    assert html is None or isinstance(html, str)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_prepare_without_a_model_reads_a_finished_run(name, data):
    task = make(name, data)
    state = task.prepare(None)
    list(task.plan(state))  # whatever it holds without a model, reading it raises nothing


# ---- bad tasks fail the checks -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Leaky(TaskBase):
    """Key-value recall that shows its answer: in the prompt, or as the only allowed answer."""

    name: ClassVar[str] = "leaky"
    metrics: ClassVar[tuple[str, ...]] = ("correct",)
    group_by: ClassVar[tuple[str, ...]] = ("pairs",)
    leak: str = "prompt"
    random_plan: bool = False

    def plan(self, state: Any) -> list[Sample]:
        import random

        rng = random.Random() if self.random_plan else random.Random(0)  # unseeded: another plan each time
        return [Sample(id=f"leaky-{i}", task=self.name, axes={"pairs": 2}, target=(str(rng.randrange(10**6)),),
                       data={"key": f"k{i}"}) for i in range(3)]

    def requests(self, sample: Sample, model: Any, state: Any) -> tuple[list[GenerationRequest], dict[str, Any]]:
        prompt = f"What is the value of {sample.data['key']}?"
        if self.leak == "prompt":
            return [GenerationRequest(prompt=f"{prompt} (it is {sample.target[0]})")], {}
        return [GenerationRequest(prompt=prompt, choices=sample.target)], {}

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        return {"correct": outputs[0] == sample.target[0]}


@pytest.mark.parametrize("leak", ["prompt", "choices"])
def test_a_task_that_puts_its_answer_in_a_request_fails(leak):
    task = Leaky(leak=leak)
    problems = answer_problems(task, model("fake:echo"), None, task.plan(None))
    assert problems == [f"leaky-{i}: a request shows its sample's target" for i in range(3)]


def test_a_task_whose_plan_is_not_seeded_fails():
    assert plan_problems(lambda: Leaky(random_plan=True), model("fake:echo")) == [
        "the same state gives another plan when read again", "the same parameters and seed give another plan"]
    assert plan_problems(lambda: Leaky(), model("fake:echo")) == []


def test_every_task_folder_and_the_plugin_are_checked():
    """Every folder of evalsuite/tasks that holds a task.py declares its tasks, each of which is checked here."""
    folders = {path.parent for path in (Path(registry.__file__).parent / "tasks").glob("*/task.py")}
    declared = registry.folder_tasks(registry.TASK_PACKAGE)
    assert folders == {Path(d.origin).parent for d in declared.values()}
    assert set(declared) | {"kv"} <= set(TASK_NAMES)


@pytest.mark.parametrize("name", sorted(registry.folder_tasks(registry.TASK_PACKAGE)))
def test_every_task_of_the_tree_declares_a_smoke_plan(name):
    assert smoke_plan_problem(registry.get_task(name)) is None
