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

Plans are small (SMALL); tasks that need a capability run on the built-in toy pair, the rest on
the scripted fake model (a byte tokenizer: its lengths are bytes). A task without an entry in
SMALL runs at its defaults, its plan cut to LIMIT samples. Two deliberately bad tasks show that
the checks can fail.
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
from collections.abc import Sequence
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

import pytest
from paper_data import write_paper_data

from evalsuite import registry
from evalsuite.contracts import TaskBase, TaskView
from evalsuite.types import GenerationRequest, LoglikelihoodRequest, Sample

PLUGIN = Path(__file__).parent / "plugin_pkg"
LIMIT = 4  # samples whose requests and scores are checked
SMALL: dict[str, dict[str, str]] = {  # -T values; {data} is tests/paper_data.py's layout
    "needle": {"lengths": "2000,3000", "depths": "0,1", "needles": "1,3", "queries": "1,2", "samples": "2"},
    "icl": {"dataset": "trec", "data": "{data}/icl/trec.jsonl", "shots": "1,2", "max_tokens": "1024",
            "test_size": "4"},
    "hallucination": {"dataset": "xsum", "data": "{data}/hallucination/xsum.jsonl", "samples": "2"},
    "zeroshot": {"benchmarks": "hellaswag", "data_dir": "{data}/zeroshot", "limit": "2", "bits": "16,8"},
    "nll": {"data": "{data}/nll", "lengths": "128", "documents": "2"},
    "attention": {"lengths": "128,256", "depths": "0,1", "samples": "1"},
    "outliers": {"tokens": "512", "window": "128", "shard_tokens": "256"},
    "nolima": {"lengths": "2000,3000", "depths": "0,1", "samples": "1"},
    "ruler": {"lengths": "512", "samples": "2"},
    "kv": {"pairs": "4,8", "samples": "2"},
}


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
    registry.load_all()  # the installed tasks; a registry loaded before the plugin was there misses it
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

    return make_task(name, {k: v.replace("{data}", str(data)) for k, v in SMALL.get(name, {}).items()})


@cache
def model(spec: str) -> Any:
    from evalsuite.backends import load_model

    return load_model(spec, {}, device="cpu")


def models_for(task: Any) -> tuple[Any, Any]:
    """Two models for the task: the toy pair when it needs a capability, else two scripted fakes."""
    pair = ("toy-base", "toy-diff") if task.required_capabilities() else ("fake:target", "fake:wrong")
    return model(pair[0]), model(pair[1])


def plain(sample: Sample) -> tuple[Any, ...]:
    """A sample as plain values: objects in its data (a loaded benchmark) stand for their type."""
    data = json.dumps(dict(sample.data), sort_keys=True, default=lambda o: type(o).__name__)
    return sample.id, sample.task, json.dumps(dict(sample.axes), sort_keys=True), sample.target, data


@cache
def prepared(name: str, data: Path) -> tuple[Any, Any, Any, list[Sample]]:
    """(task, model, state, plan), made once per task for the checks that read them."""
    task = make(name, data)
    first, _ = models_for(task)
    state = task.prepare(first)
    return task, first, state, list(task.plan(state))


# ---- the checks: each returns what is wrong, so that a bad task can be shown to fail them --------------


def plan_problems(make_task: Any, model: Any) -> list[str]:
    """The plans of two fresh tasks of the same parameters, and of one state read twice, must agree."""
    task, again = make_task(), make_task()
    state = task.prepare(model)
    plans = [list(task.plan(state)), list(task.plan(state)), list(again.plan(again.prepare(model)))]
    problems = [] if plans[0] else ["the plan holds no sample"]
    ids = [s.id for s in plans[0]]
    if len(set(ids)) != len(ids):
        problems.append("sample ids repeat")
    if [plain(s) for s in plans[0]] != [plain(s) for s in plans[1]]:
        problems.append("the same state gives another plan when read again")
    if [plain(s) for s in plans[0]] != [plain(s) for s in plans[2]]:
        problems.append("the same parameters and seed give another plan")
    return problems


def _text_fields(request: Any) -> list[str]:
    fields = [getattr(request, k, "") for k in ("prompt", "prefix", "context", "continuation")]
    return [str(f) for f in fields] + [*getattr(request, "stop", ()), *(getattr(request, "choices", None) or ())]


def answer_problems(task: Any, model: Any, state: Any, samples: Sequence[Sample]) -> list[str]:
    """A text request must not change when its sample's targets do, and must not show the stand-ins."""
    problems = []
    for sample in samples:
        requests, _ = task.requests(sample, model, state)
        stand_ins = tuple(f"[answer {i} withheld]" for i in range(max(1, len(sample.target))))
        swapped, _ = task.requests(dataclasses.replace(sample, target=stand_ins), model, state)
        for request, other in zip(requests, swapped):
            if not isinstance(request, (GenerationRequest, LoglikelihoodRequest)):
                continue  # a probe measures the model itself and is scored against no target
            if request != other or any(s in text for s in stand_ins for text in _text_fields(other)):
                problems.append(f"{sample.id}: a request shows its sample's target")
    return problems


def score_problems(task: Any, records: Sequence[Any]) -> list[str]:
    problems = []
    for record in records:
        if record.error:
            problems.append(f"{record.id}: scoring failed: {record.error}")
        missing = [m for m in task.metrics if m not in record.scores]
        odd = [m for m in task.metrics if not isinstance(record.scores.get(m), (bool, int, float, type(None)))]
        if missing or odd:
            problems.append(f"{record.id}: metrics {missing or odd} missing or not numbers")
        json.loads(record.to_json())  # a record is JSON as it is written
    return problems


def write_run(task: Any, model: Any, state: Any, samples: Sequence[Sample], out: Path) -> Any:
    """A finished run folder of `samples` on `model`: config, the records this test computes, summary."""
    from evalsuite.engine.runner import RunOptions, evaluate, finish, run_config, run_folder_for

    options = RunOptions(out=out, progress=False)
    config = run_config(task, model, options)
    run = run_folder_for(config, options)
    run.create(config)
    run.append(evaluate(task, model, state, samples, log_prompts=True, run_hash=config["hash"]))
    finish(task, run)
    return run


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


def test_every_built_in_task_and_the_plugin_are_checked():
    built_in = {ep.name for ep in entry_points(group="evalsuite.tasks") if ep.value.startswith("evalsuite.")}
    assert built_in | {"kv"} <= set(TASK_NAMES)
    assert set(SMALL) >= built_in | {"kv"}, "give a new built-in task a small plan in SMALL"
