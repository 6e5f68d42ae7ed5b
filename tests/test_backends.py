"""The backend registry, named models, what backends share (backends/common), capabilities and
the scripted `fake:target` backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import invoke

from evalsuite import UserError, register_backend
from evalsuite.backends import load_model, resolve_spec, split_spec
from evalsuite.backends.common.choices import END, ChoiceTrie
from evalsuite.backends.common.tokens import move_trailing_whitespace
from evalsuite.backends.fake import FakeModel
from evalsuite.contracts import SCRIPTED_ANSWERS, TOKEN_NLL, ContractError, capabilities_of
from evalsuite.models import HERE
from evalsuite.registry import BACKENDS, backend_names

BACKENDS_DIR = Path(__file__).resolve().parents[1] / "evalsuite" / "backends"

ICL_DATA = Path(__file__).resolve().parents[1] / "evalsuite" / "suites" / "data" / "icl-smoke.jsonl"


def test_specs_pick_registered_backends_and_fall_back_to_hf_paths():
    assert {"hf", "gguf", "fake"} <= set(backend_names())
    assert split_spec("fake:wrong") == ("fake", "wrong")
    assert split_spec("fake") == ("fake", "")
    assert split_spec("gguf:/m/model.gguf") == ("gguf", "/m/model.gguf")
    assert split_spec("/models/llama") == ("hf", "/models/llama")
    assert split_spec("org/model") == ("hf", "org/model")


def test_named_models_resolve_in_one_place_to_their_backend_spec_and_label():
    assert resolve_spec("toy-diff") == ("hf", str(HERE / "toy-diff"), "toy-diff")
    assert resolve_spec("gguf:/m/x.gguf") == ("gguf", "/m/x.gguf", None)
    assert resolve_spec("/models/llama") == ("hf", "/models/llama", None)
    assert resolve_spec("fake:oracle") == ("fake", "oracle", None)


def test_backends_share_code_by_name_through_common_only():
    """vllm and server import what they share from backends/common, never from hf; common
    itself imports no backend (and no torch, for the server backend's sake)."""
    for package in ("vllm", "server", "common"):
        for module in sorted((BACKENDS_DIR / package).glob("*.py")):
            source = module.read_text()
            assert "backends.hf" not in source and "from ..hf" not in source, module
    for module in sorted((BACKENDS_DIR / "common").glob("*.py")):
        assert "import torch" not in module.read_text(), module


def test_the_continuation_split_moves_the_contexts_trailing_whitespace():
    assert move_trailing_whitespace("Hello world. ", "The") == ("Hello world.", " The")
    assert move_trailing_whitespace("a\n\n", "b") == ("a", "\n\nb")
    assert move_trailing_whitespace("a", " b") == ("a", " b")


def test_the_choice_trie_picks_alike_under_torch_and_numpy_logits():
    import numpy as np
    import torch

    trie = ChoiceTrie([" a", " ab", " b"], encode=lambda text: [ord(c) for c in text])
    values = np.zeros(256, dtype=np.float32)
    values[[ord(" "), ord("a"), ord("b"), ord("z")]] = [1.0, 2.0, 1.5, 9.0]
    for logits in (torch.from_numpy(values), values):
        token, node = trie.pick(trie.root, logits)
        assert token == ord(" ")
        token, node = trie.pick(node, logits)
        assert token == ord("a") and END in node
        assert trie.pick(node, logits) == (None, node)  # ' a' ends: the argmax 'z' continues no choice
    assert ChoiceTrie.ends_at(node, ord("b")) is False and ChoiceTrie.ends_at(node, ord("z")) is True


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


@pytest.mark.parametrize("declared, refused", [
    ({TOKEN_NLL}, r"declares token_nll but lacks encode, token_nll \(evalsuite\.contracts\.TokenNLL\)"),
    ({"token_nl"}, r"declares the unknown capability 'token_nl' \(did you mean 'token_nll'\?\)"),
])
def test_a_backend_whose_adapter_lacks_what_it_declares_is_refused_at_load(capsys, declared, refused):
    @register_backend("half-test")
    def load(rest, options, *, device, batch_size, label):
        model = FakeModel.from_options("oracle", {})
        model.capabilities = frozenset(declared)  # the earlier contract's list, held to what it implements
        return model

    try:
        with pytest.raises(ContractError, match=r"^backend 'half-test' returned FakeModel, which " + refused + "$"):
            load_model("half-test:x", {})
        ran = invoke(capsys, "run", "--model", "half-test:x", "--task", "needle", "-T", "lengths=256", "--dry-run")
        assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
        assert "half-test" in ran.stderr and "Traceback" not in ran.stderr
    finally:
        BACKENDS.pop("half-test")


def test_an_adapter_offers_what_it_implements():
    assert capabilities_of(load_model("fake:target", {})) == {SCRIPTED_ANSWERS}  # it has expect()
    assert capabilities_of(load_model("fake:oracle", {})) == frozenset()


def test_an_unknown_fake_behaviour_is_one_line(tmp_path):
    with pytest.raises(UserError, match="unknown fake model behaviour 'oracel'.*did you mean 'oracle'"):
        load_model("fake:oracel", {})


@pytest.mark.parametrize("task, params, metric", [
    ("needle", ["-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "-T", "needles=3"],
     "correct_all"),
    ("icl", ["-T", f"data={ICL_DATA}", "-T", "shots=1,4", "-T", "test_size=6"], "correct"),
])
def test_fake_target_answers_every_task_from_its_samples(capsys, tmp_path, task, params, metric):
    ran = invoke(capsys, "run", "--model", "fake:target", "--task", task, *params, "--no-progress", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    (summary,) = tmp_path.glob(f"{task}-fake-target-*/summary.json")
    assert json.loads(summary.read_text())["overall"][metric] == 1.0
