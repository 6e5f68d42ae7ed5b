"""The task written from scratch in docs/writing-a-task.md (variable tracking on the task kit) is
taken from the page as it stands, registered, and run end to end on the toy models: what the guide
shows is code that runs, in at most 80 lines."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import evalsuite
from evalsuite.registry import get_task

GUIDE = Path(__file__).parents[1] / "docs" / "writing-a-task.md"
LENGTHS, DEPTHS = (256, 512), (0.0, 0.5, 1.0)


def walkthrough_source() -> str:
    """The guide's first python block: the walkthrough task."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert blocks and blocks[0].startswith('"""Variable tracking'), "the guide opens with the walkthrough task"
    return blocks[0]


@pytest.fixture(scope="module")
def vartrack(tmp_path_factory) -> Any:
    """The walkthrough's module, imported from a file written from the guide (which registers the task)."""
    path = tmp_path_factory.mktemp("walkthrough") / "vartrack_walkthrough.py"
    path.write_text(walkthrough_source(), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def test_the_walkthrough_is_at_most_80_lines_and_the_guide_says_how_many():
    lines = len(walkthrough_source().splitlines())
    assert lines <= 80
    assert f"written from scratch in {lines} lines" in GUIDE.read_text(encoding="utf-8")


def test_it_registers_and_scores_every_reference(vartrack):
    task = get_task("vartrack")(hops=3)
    sample = next(iter(task.plan(None)))
    names = sample.target
    assert len(names) == 3 == len(set(names)) and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    assert sample.data["chain"][1] == f"VAR {names[1]} = {names[0]}."
    assert task.score(sample, [" " + ", ".join(reversed(names))]) == {"all_found": True, "found_share": 1.0}
    assert task.score(sample, [f"{names[0]} and {names[2].lower()}"]) == {"all_found": False,
                                                                           "found_share": pytest.approx(2 / 3)}


def test_it_runs_end_to_end_on_the_toy_models(vartrack, tmp_path):
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


def test_its_prompt_holds_the_chain_in_order_after_the_instruction(vartrack):
    from evalsuite.backends import load_model

    model = load_model("toy-base", {}, device="cpu")
    task = get_task("vartrack")(lengths=(512,), depths=(0.25,), samples=1)
    state = task.prepare(model)
    sample = next(iter(task.plan(state)))
    (request,), facts = task.requests(sample, model, state)
    at = [request.prompt.index(line) for line in sample.data["chain"]]
    assert at == sorted(at) and request.prompt.index(vartrack.LAYOUT.instruction) < at[0]
    assert request.prompt.endswith(vartrack.ANSWER_PREFIX.format(value=sample.data["value"]))
    assert facts["prompt_tokens"] == model.count_tokens(request.prompt)
