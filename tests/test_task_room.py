"""A task is one folder: a throwaway task folder, written here as a contributor would add one to
evalsuite/tasks/, is found with no reinstall, passes the conformance checks, and each step left out
(the table in its __init__.py, a loadable class, the smoke plan, the golden hash) fails with one line
naming the fix, in `list`, `run` and the tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import invoke
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
)

from evalsuite import registry
from evalsuite.contracts import ContractError
from evalsuite.engine.runner import evaluate, make_task
from evalsuite.errors import UserError

TASK = '''
"""Passkey retrieval: one five-digit key among lines of filler, asked for at the end."""

import random
from dataclasses import dataclass
from typing import Any

from evalsuite.contracts import TaskBase
from evalsuite.types import GenerationRequest, Sample

PROMPT = "{filler}The passkey is {key}. Remember it.\\n{filler}What is the passkey? The passkey is"


@dataclass(frozen=True)
class Passkey(TaskBase, name="passkey", metrics=("correct",), group_by=("lines",){header}):
    """Passkey retrieval: recall one key hidden among filler lines."""

    lines: tuple[int, ...] = (10, 40)
    samples: int = 3

    def plan(self, state: Any):
        for lines in self.lines:
            for index in range(self.samples):
                sample_id = f"passkey-{lines}-{index:03d}"
                key = str(random.Random(sample_id).randrange(10_000, 100_000))
                yield Sample(id=sample_id, task=self.name, axes={"lines": lines}, target=(key,),
                             data={"key": key})

    def requests(self, sample: Sample, model: Any, state: Any):
        filler = "The grass is green and the sky is blue.\\n" * (sample.axes["lines"] // 2)
        prompt = PROMPT.format(filler=filler, key=sample.data["key"])
        return [GenerationRequest(prompt=prompt, max_new_tokens=8, stop=("\\n",))], {}

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, Any]:
        return {"correct": outputs[0].strip() == sample.target[0]}
'''
SMOKE = ', smoke_plan={"lines": "4,8", "samples": "2"}'


def task_folder(tmp_path: Path, monkeypatch, *, header: str = SMOKE, table: str | None = "task:Passkey") -> str:
    """A package of task folders in tmp_path, holding passkey/ (its __init__ declaring `table`, None: no
    table) on sys.path; its dotted name, unique to this test."""
    package = f"room_{tmp_path.name}".replace("-", "_")
    folder = tmp_path / package / "passkey"
    folder.mkdir(parents=True)
    (tmp_path / package / "__init__.py").write_text("")
    declared = "" if table is None else f'\nTASKS = {{"passkey": "{package}.passkey.{table}"}}\n'
    (folder / "__init__.py").write_text(f'"""Passkey retrieval."""\n{declared}')
    (folder / "task.py").write_text(textwrap.dedent(TASK).replace("{header}", header))
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


@pytest.fixture
def room(monkeypatch):
    """The registry as it is, given back as it was: a test may declare and register tasks of its own."""
    registry.declare_all()
    tasks, declared = dict(registry.TASKS), dict(registry._DECLARED_TASKS)
    yield monkeypatch
    registry.TASKS.clear()
    registry.TASKS.update(tasks)
    registry._DECLARED_TASKS.clear()
    registry._DECLARED_TASKS.update(declared)


def declare(package: str) -> None:
    """The package's task folders declared beside evalsuite's own, as if they stood in evalsuite/tasks/."""
    registry._DECLARED_TASKS.update(registry.folder_tasks(package))


def test_a_new_task_folder_is_found_with_no_reinstall_and_passes_the_checks(tmp_path, room):
    declare(task_folder(tmp_path, room))
    assert "passkey" in registry.task_names() and "passkey" not in registry.TASKS  # declared, not yet imported
    cls = registry.get_task("passkey")
    assert smoke_plan_problem(cls) is None
    fake = model("fake:target")
    task = make_task("passkey", smoke_params(cls, tmp_path))
    state = task.prepare(fake)
    plan = list(task.plan(state))
    assert [s.axes["lines"] for s in plan] == [4, 4, 8, 8]
    assert plan_problems(lambda: make_task("passkey", smoke_params(cls, tmp_path)), fake) == []
    assert answer_problems(task, fake, state, plan) == []
    records = evaluate(task, fake, state, plan, log_prompts=False)
    assert score_problems(task, records) == [] and all(r.scores["correct"] for r in records)


def test_a_folder_with_a_task_but_no_table_fails_naming_the_line_to_add(tmp_path, room, capsys):
    package = task_folder(tmp_path, room, table=None)
    with pytest.raises(UserError) as caught:
        registry.folder_tasks(package)
    assert str(caught.value) == (f"{tmp_path / package / 'passkey'}/ holds a task.py but declares no task: add "
                                 f'TASKS = {{"passkey": "{package}.passkey.task:<TaskClass>"}} to its __init__.py')
    room.setattr(registry, "TASK_PACKAGE", package)
    room.setattr(registry, "_declared", False)  # read the tables again, this package's
    for args in (["list"], ["run", "--model", "fake", "--task", "passkey", "--out", str(tmp_path / "out")]):
        result = invoke(capsys, *args)
        assert result.code == 2 and result.err.strip() == f"error: {caught.value}", result


def test_a_declared_task_that_cannot_be_loaded_fails_in_list_and_run(tmp_path, room, capsys):
    declare(task_folder(tmp_path, room, table="task:PassKey"))
    for args in (["list"], ["run", "--model", "fake", "--task", "passkey", "--out", str(tmp_path / "out")]):
        result = invoke(capsys, *args)
        (line,) = result.err.strip().splitlines()
        assert result.code == 2 and line.startswith("error: task passkey is declared in "), result
        assert "passkey/__init__.py as" in line and "PassKey" in line
        assert line.endswith("correct its entry in TASKS there, or the module it names")


def test_a_task_without_a_smoke_plan_is_told_how_to_add_one(tmp_path, room):
    declare(task_folder(tmp_path, room, header=""))
    cls = registry.get_task("passkey")
    assert smoke_plan_problem(cls) == (
        'task passkey declares no smoke plan: add smoke_plan={...} (small -T values the fake byte-tokenized model '
        'can hold, e.g. {"lengths": "2000,3000", "samples": "1"}) to the header of Passkey in '
        f"{tmp_path / cls.__module__.split('.')[0] / 'passkey' / 'task.py'}")


def test_a_smoke_plan_naming_no_parameter_is_refused_when_the_task_loads(tmp_path, room):
    declare(task_folder(tmp_path, room, header=', smoke_plan={"line": "4"}'))
    with pytest.raises(ContractError) as caught:
        registry.get_task("passkey")
    assert str(caught.value).startswith("task passkey (") and str(caught.value).endswith(
        "task class Passkey: 'smoke_plan' names 'line', which is not one of its parameters (lines, samples)")


def test_a_task_without_a_golden_hash_is_told_the_command_and_a_prompt_change_the_bump(tmp_path, room):
    declare(task_folder(tmp_path, room))
    cls = registry.get_task("passkey")
    golden = tmp_path / cls.__module__.split(".")[0] / "passkey" / "golden.json"

    def digest() -> str:
        return prompts_digest(make_task("passkey", smoke_params(cls, tmp_path)), model("fake:target"))

    command = "`python tests/test_prompt_versions.py passkey`"
    assert golden_problem(cls, digest) == f"task passkey has no golden prompt hash in {golden}: run {command}"
    assert write_golden(cls, digest()) == golden
    assert golden_problem(cls, digest) is None
    module = __import__(cls.__module__, fromlist=["PROMPT"])
    room.setattr(module, "PROMPT", module.PROMPT.replace("Remember it.", "Keep it."))
    assert golden_problem(cls, digest) == (f"task passkey's prompts changed under plan version 1: bump its "
                                           f"plan_version, then run {command}")
    room.setattr(cls, "plan_version", 2)
    assert golden_problem(cls, digest) == (f"task passkey is at plan version 2, its golden hash in {golden} at 1: "
                                           f"run {command}")


def test_a_misspelt_header_keyword_is_one_line_naming_it(tmp_path, room):
    declare(task_folder(tmp_path, room, header=', metric=("correct",)'))
    with pytest.raises(ContractError) as caught:
        registry.get_task("passkey")
    assert str(caught.value).endswith("task class Passkey: 'metric' is no member of the Task contract: did you "
                                      "mean 'metrics'?")


def test_the_header_sets_members_that_a_subclass_inherits(tmp_path, room):
    declare(task_folder(tmp_path, room))
    cls = registry.get_task("passkey")
    assert (cls.name, cls.metrics, cls.plan_version, dict(cls.smoke_plan)) == (
        "passkey", ("correct",), 1, {"lines": "4,8", "samples": "2"})
    longer = type("Longer", (cls,), {"__module__": cls.__module__})
    assert longer.name == "passkey" and longer.smoke_plan is cls.smoke_plan
    versioned = type.__new__(type(cls), "Versioned", (cls,), {"__module__": cls.__module__}, plan_version=3)
    assert versioned.plan_version == 3 and cls.plan_version == 1
