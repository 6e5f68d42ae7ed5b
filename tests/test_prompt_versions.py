"""Every built-in task's prompts are held to its plan version: a fixed plan of each task is built
on toy-base (its tokenizer and capabilities; no request is run), and the hash of all its samples'
prompt hashes (as records write them) must be the one tests/data/prompt_versions.json records for
that plan version. A prompt change without a version bump fails here; with a bump, rewrite the file:

    python tests/test_prompt_versions.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from paper_data import write_paper_data

from evalsuite.engine.runner import make_task
from evalsuite.runs.records import prompt_fields

GOLDEN = Path(__file__).parent / "data" / "prompt_versions.json"
# a small fixed plan of each built-in task (-T values; {data} is tests/paper_data.py's layout)
PLANS: dict[str, dict[str, str]] = {
    "needle": {"lengths": "256,1024", "depths": "0,0.5,1", "needles": "1,3", "queries": "1,2", "samples": "2"},
    "icl": {"dataset": "trec", "data": "{data}/icl/trec.jsonl", "shots": "1,4", "max_tokens": "2048",
            "test_size": "8"},
    "hallucination": {"dataset": "qasper", "data": "{data}/hallucination/qasper.jsonl", "samples": "3"},
    "zeroshot": {"benchmarks": "hellaswag", "data_dir": "{data}/zeroshot", "limit": "4"},
    "nll": {"data": "{data}/nll", "lengths": "512", "documents": "2"},
    "attention": {"lengths": "512", "samples": "1"},
    "outliers": {"tokens": "4096", "window": "512", "shard_tokens": "2048"},
    "nolima": {"lengths": "256,512", "depths": "0,0.5,1", "samples": "1"},
    "ruler": {"subtasks": "niah_single_1", "lengths": "512", "samples": "2"},
}


def builtin_tasks() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="evalsuite.tasks") if ep.value.startswith("evalsuite.")}


@cache
def toy_base() -> Any:
    """toy-base through the hf backend: the tokenizer prompts are sized with, and the capabilities the
    probing tasks check for (no request is sent to it)."""
    from evalsuite.backends.hf import HFModel
    from evalsuite.models import HERE

    return HFModel.load(str(HERE / "toy-base"), {}, device="cpu")


def _request_text(request: Any) -> str:
    """What a record's prompt hash covers (engine.runner._prompt_text)."""
    return str(getattr(request, "prefix", "")) + str(getattr(request, "prompt", None) or getattr(request, "context", ""))


def prompts_digest(name: str, data: Path, params: dict[str, str] | None = None) -> str:
    """sha256 over the fixed plan's (sample id, prompt hash) pairs, in plan order."""
    raw = {k: v.replace("{data}", str(data)) for k, v in (params or PLANS[name]).items()}
    task = make_task(name, raw)
    model = toy_base()
    state = task.prepare(model)
    digest = hashlib.sha256()
    for sample in task.plan(state):
        requests, _ = task.requests(sample, model, state)
        sha = prompt_fields([_request_text(r) for r in requests], keep_text=False)["sha256"]
        digest.update(f"{sample.id} {sha}\n".encode())
    return digest.hexdigest()


def recorded() -> dict[str, dict[str, Any]]:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_paper_data(tmp_path_factory.mktemp("paper-data"))


def test_every_built_in_task_has_a_fixed_plan():
    assert set(PLANS) == builtin_tasks()
    assert set(recorded()) == set(PLANS)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_prompts_are_those_of_the_plan_version(name, data):
    task_class = type(make_task(name, {k: v.replace("{data}", str(data)) for k, v in PLANS[name].items()}))
    golden = recorded()[name]
    assert task_class.plan_version == golden["plan_version"], (
        f"{name}'s plan version changed: rewrite {GOLDEN.name} (python tests/test_prompt_versions.py)")
    assert prompts_digest(name, data) == golden["sha256"], (
        f"{name}'s prompts changed under plan version {golden['plan_version']}: bump {name}'s plan_version")


def test_a_changed_needle_prompt_without_a_bump_is_caught(data, monkeypatch):
    from evalsuite.tasks.needle import task as needle

    monkeypatch.setattr(needle, "INSTRUCTION", needle.INSTRUCTION.replace("magic", "secret"))
    assert prompts_digest("needle", data) != recorded()["needle"]["sha256"]


def write_golden() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        data = write_paper_data(Path(folder))
        out = {}
        for name in sorted(PLANS):
            task = make_task(name, {k: v.replace("{data}", str(data)) for k, v in PLANS[name].items()})
            out[name] = {"plan_version": type(task).plan_version, "sha256": prompts_digest(name, data)}
    GOLDEN.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"written: {GOLDEN}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    write_golden()
