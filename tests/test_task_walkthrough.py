"""The task written from scratch in docs/writing-a-task.md (variable tracking on the task kit) is taken
from the page as it stands, written as the folder evalsuite/tasks/vartrack/ it describes (beside the
package's own task folders, in a temporary folder), and held to what a built-in task is held to: the
layers' rule for imports, the registry's table, the conformance checks on its smoke plan, a golden
prompt hash, and a run end to end on the toy models. What the guide shows is code that runs, in at
most 80 lines."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from task_checks import (
    answer_problems,
    golden_problem,
    model,
    plan_problems,
    prompts_digest,
    score_problems,
    smoke_params,
    smoke_plan_problem,
    write_golden,
    write_run,
)
from test_architecture import PACKAGE, import_graph, upward_imports

import evalsuite
import evalsuite.tasks
from evalsuite import registry
from evalsuite.engine.runner import evaluate, make_task

GUIDE = Path(__file__).parents[1] / "docs" / "writing-a-task.md"
LENGTHS, DEPTHS = (256, 512), (0.0, 0.5, 1.0)


def walkthrough_files() -> dict[str, str]:
    """The guide's files of the walkthrough folder: path under evalsuite/tasks/vartrack/ -> source."""
    found = re.findall(r"`evalsuite/tasks/vartrack/([\w.]+)`[^\n]*?(?:\n[^\n]+)*?\n\n```python\n(.*?)```",
                       GUIDE.read_text(encoding="utf-8"), re.S)
    assert [name for name, _ in found] == ["__init__.py", "task.py"], "the guide shows the folder's two files"
    return dict(found)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Any:
    """The walkthrough's folder, found by the registry as a folder of evalsuite/tasks/ is (its tasks'
    path extended by a temporary folder for this module's tests), loaded by its table."""
    root = tmp_path_factory.mktemp("walkthrough") / "tasks"
    (root / "vartrack").mkdir(parents=True)
    for name, source in walkthrough_files().items():
        (root / "vartrack" / name).write_text(source, encoding="utf-8")
    registry.declare_all()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evalsuite.tasks, "__path__", [*evalsuite.tasks.__path__, str(root)])
        patch.setitem(registry._DECLARED_TASKS, "vartrack", registry.folder_tasks(registry.TASK_PACKAGE)["vartrack"])
        yield root / "vartrack"
        registry.TASKS.pop("vartrack", None)
        for name in [m for m in sys.modules if m.startswith("evalsuite.tasks.vartrack")]:
            del sys.modules[name]


def test_the_walkthrough_is_at_most_80_lines_and_the_guide_says_how_many():
    lines = len(walkthrough_files()["task.py"].splitlines())
    assert lines <= 80
    assert f"written from scratch in {lines} lines" in GUIDE.read_text(encoding="utf-8")


def vartrack_upward_imports(folder: Path, copy: Path) -> list[str]:
    """The walkthrough folder's imports that go up the layers, in a copy of the package that holds it."""
    shutil.copytree(PACKAGE, copy, ignore=lambda _, names: [n for n in names if not n.endswith(".py") and "." in n])
    shutil.copytree(folder, copy / "tasks" / "vartrack")
    return [line for line in upward_imports(import_graph.__wrapped__(copy)) if line.startswith("evalsuite.tasks.vartrack")]


def test_its_imports_keep_to_the_layers(folder, tmp_path):
    assert vartrack_upward_imports(folder, tmp_path / "evalsuite") == []
    task = folder.parent / "up" / "task.py"  # the same task, importing the package's public face as an outside one may
    task.parent.mkdir()
    task.write_text((folder / "task.py").read_text().replace("from evalsuite.types import", "from evalsuite import"))
    assert vartrack_upward_imports(task.parent, tmp_path / "again" / "evalsuite") == [
        "evalsuite.tasks.vartrack.task (tasks) -> evalsuite (api)"]


def test_its_table_loads_it_and_the_conformance_checks_pass_on_its_smoke_plan(folder, tmp_path):
    cls = registry.get_task("vartrack")
    assert cls.__module__ == "evalsuite.tasks.vartrack.task" and smoke_plan_problem(cls) is None
    fake = model("fake:target")
    task = make_task("vartrack", smoke_params(cls, tmp_path))
    state = task.prepare(fake)
    plan = list(task.plan(state))
    assert {s.axes["context_length"] for s in plan} == {2000, 3000}
    assert plan_problems(lambda: make_task("vartrack", smoke_params(cls, tmp_path)), fake) == []
    assert answer_problems(task, fake, state, plan) == []
    assert score_problems(task, evaluate(task, fake, state, plan, log_prompts=False)) == []
    run = write_run(task, fake, state, plan, tmp_path / "runs")
    summary = json.loads(run.summary_path.read_text())
    assert summary["errors"] == 0 and all((run.plots / p).stat().st_size > 0 for p in summary["plots"])


def test_its_golden_hash_is_written_by_the_command_the_test_names(folder, tmp_path):
    cls = registry.get_task("vartrack")

    def digest() -> str:
        return prompts_digest(make_task("vartrack", smoke_params(cls, tmp_path)), model("fake:target"))

    assert golden_problem(cls, digest) == (f"task vartrack has no golden prompt hash in {folder / 'golden.json'}: "
                                           f"run `python tests/test_prompt_versions.py vartrack`")
    write_golden(cls, digest())
    assert golden_problem(cls, digest) is None


def test_it_scores_every_reference(folder):
    task = registry.get_task("vartrack")(hops=3)
    sample = next(iter(task.plan(None)))
    names = sample.target
    assert len(names) == 3 == len(set(names)) and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    assert sample.data["chain"][1] == f"VAR {names[1]} = {names[0]}."
    assert task.score(sample, [" " + ", ".join(reversed(names))]) == {"all_found": True, "found_share": 1.0}
    assert task.score(sample, [f"{names[0]} and {names[2].lower()}"]) == {"all_found": False,
                                                                           "found_share": pytest.approx(2 / 3)}


def test_it_runs_end_to_end_on_the_toy_models(folder, tmp_path):
    results = evalsuite.run("vartrack", ["toy-base", "toy-diff"], out=tmp_path, lengths=list(LENGTHS),
                            depths=list(DEPTHS), samples=1, device="cpu")
    base = results.runs[0].path
    records = [json.loads(line) for line in (base / "samples.jsonl").read_text().splitlines()]
    assert len(records) == len(LENGTHS) * len(DEPTHS) and not any(r["error"] for r in records)
    for record in records:
        room = record["axes"]["context_length"] - 32  # the task's answer tokens
        assert 0.99 * room <= record["info"]["prompt_tokens"] <= room
        assert abs(record["info"]["measured_depth"] - record["axes"]["depth"]) <= 0.05
        assert set(record["scores"]) == {"all_found", "found_share"}
    assert (base / "plots" / "heatmap.png").stat().st_size > 1000
    comparison = results.comparison
    assert comparison is not None
    assert (comparison / "heatmap_pair.png").is_file() and (comparison / "heatmap_diff.png").is_file()


def test_its_prompt_holds_the_chain_in_order_after_the_instruction(folder):
    task = registry.get_task("vartrack")(lengths=(512,), depths=(0.25,), samples=1)
    vartrack = sys.modules["evalsuite.tasks.vartrack.task"]
    toy = model("toy-base")
    state = task.prepare(toy)
    sample = next(iter(task.plan(state)))
    (request,), facts = task.requests(sample, toy, state)
    at = [request.prompt.index(line) for line in sample.data["chain"]]
    assert at == sorted(at) and request.prompt.index(vartrack.LAYOUT.instruction) < at[0]
    assert request.prompt.endswith(vartrack.ANSWER_PREFIX.format(value=sample.data["value"]))
    assert facts["prompt_tokens"] == toy.count_tokens(request.prompt)
