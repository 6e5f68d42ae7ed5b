"""Every task of evalsuite's own folders holds its prompts to its plan version: its smoke plan is built
on toy-base (its tokenizer and capabilities; no request is run), and the hash of all its samples'
prompt hashes (as records write them) must be the one golden.json beside the task records for that
plan version. A prompt change without a version bump fails here; with a bump, or for a new task,
rewrite that one task's hash (never every task's at once):

    python tests/test_prompt_versions.py NAME [NAME ...]
"""

from __future__ import annotations

import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # run as a script: its helpers sit beside it
    sys.path.insert(0, str(Path(__file__).parent))

from paper_data import write_paper_data
from task_checks import (
    golden_entries,
    golden_path,
    golden_problem,
    prompts_digest,
    smoke_params,
    smoke_plan_problem,
    write_golden,
)

from evalsuite import registry
from evalsuite.engine.runner import make_task
from evalsuite.errors import UserError

TREE_TASKS = sorted(registry.folder_tasks(registry.TASK_PACKAGE))


@cache
def toy_base() -> Any:
    """toy-base through the hf backend: the tokenizer prompts are sized with, and the capabilities the
    probing tasks check for (no request is sent to it)."""
    from evalsuite.backends.hf import HFModel
    from evalsuite.models import HERE

    return HFModel.load(str(HERE / "toy-base"), {}, device="cpu")


def digest_of(name: str, data: Path) -> str:
    """Today's hash of the task's smoke-plan prompts on toy-base."""
    return prompts_digest(make_task(name, smoke_params(registry.get_task(name), data)), toy_base())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_paper_data(tmp_path_factory.mktemp("paper-data"))


@pytest.mark.parametrize("name", TREE_TASKS)
def test_prompts_are_those_of_the_plan_version(name, data):
    cls = registry.get_task(name)
    problem = smoke_plan_problem(cls) or golden_problem(cls, lambda: digest_of(name, data))
    assert problem is None, problem


def test_every_golden_file_holds_only_tasks_of_its_folder():
    for name in TREE_TASKS:
        assert set(golden_entries(golden_path(registry.get_task(name)))) <= set(TREE_TASKS), name


def test_a_changed_needle_prompt_without_a_bump_is_caught(data, monkeypatch):
    from evalsuite.tasks.needle import task as needle

    monkeypatch.setattr(needle, "INSTRUCTION", needle.INSTRUCTION.replace("magic", "secret"))
    problem = golden_problem(registry.get_task("needle"), lambda: digest_of("needle", data))
    assert problem == ("task needle's prompts changed under plan version 1: bump its plan_version, then run "
                       "`python tests/test_prompt_versions.py needle`")


def main(names: list[str]) -> None:
    """Rewrite the golden hash of each named task, in its own folder."""
    if not names:
        raise SystemExit(f"name the tasks whose golden prompt hash to rewrite, e.g. "
                         f"python tests/test_prompt_versions.py needle (tasks: {', '.join(TREE_TASKS)})")
    with tempfile.TemporaryDirectory() as folder:
        data = write_paper_data(Path(folder))
        for name in names:
            try:
                cls = registry.get_task(name)
            except UserError as exc:  # an unknown name: one line naming the known ones
                raise SystemExit(f"error: {exc}") from None
            print(f"written: {write_golden(cls, digest_of(name, data))} ({name}, plan version {cls.plan_version})")


if __name__ == "__main__":
    main(sys.argv[1:])
