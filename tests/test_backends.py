"""The backend registry, capabilities and the scripted `fake:target` backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from evalsuite import UserError, register_backend
from evalsuite.backends import load_model, split_spec
from evalsuite.backends.fake import FakeModel
from evalsuite.registry import BACKENDS, backend_names

ICL_DATA = Path(__file__).resolve().parents[1] / "evalsuite" / "suites" / "data" / "icl-smoke.jsonl"


def test_specs_pick_registered_backends_and_fall_back_to_hf_paths():
    assert {"hf", "gguf", "fake"} <= set(backend_names())
    assert split_spec("fake:wrong") == ("fake", "wrong")
    assert split_spec("fake") == ("fake", "")
    assert split_spec("gguf:/m/model.gguf") == ("gguf", "/m/model.gguf")
    assert split_spec("/models/llama") == ("hf", "/models/llama")
    assert split_spec("org/model") == ("hf", "org/model")


def test_a_backend_registered_at_runtime_is_picked_by_its_prefix():
    seen = {}

    @register_backend("scripted-test")
    def load(rest, options, *, device, batch_size, label):
        seen.update(rest=rest, options=dict(options), device=device)
        return FakeModel.from_options("target", {})

    try:
        model = load_model("scripted-test:anything", {"k": "v"}, device="cpu")
        assert isinstance(model, FakeModel) and seen == {"rest": "anything", "options": {"k": "v"}, "device": "cpu"}
    finally:
        BACKENDS.pop("scripted-test")


def test_an_unknown_fake_behaviour_is_one_line(tmp_path):
    with pytest.raises(UserError, match="unknown fake model behaviour 'oracel'.*did you mean 'oracle'"):
        load_model("fake:oracel", {})


@pytest.mark.parametrize("task, params, metric", [
    ("needle", ["-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "-T", "needles=3"],
     "correct_all"),
    ("icl", ["-T", f"data={ICL_DATA}", "-T", "shots=1,4", "-T", "test_size=6"], "correct"),
])
def test_fake_target_answers_every_task_from_its_samples(tmp_path, task, params, metric):
    ran = run_cli("run", "--model", "fake:target", "--task", task, *params, "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    (summary,) = tmp_path.glob(f"{task}-fake-target-*/summary.json")
    assert json.loads(summary.read_text())["overall"][metric] == 1.0
