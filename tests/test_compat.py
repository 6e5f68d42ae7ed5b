"""One check per transformers internal that evalsuite uses (evalsuite/modeling/compat.py): when an upstream
release changes one, the test named after it fails, instead of a run going silently wrong."""

from __future__ import annotations

import logging
import re
import tokenize
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from conftest import TINY

from evalsuite.backends.hf import HFModel, diff_attention
from evalsuite.modeling import compat
from evalsuite.types import GenerationRequest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalsuite"


def tiny(kind: str, implementation: str = "sdpa") -> torch.nn.Module:
    """A random two-layer model: Llama, DiffLlama (one-pass attention installed) or DIFF V2."""
    common = dict(vocab_size=97, hidden_size=TINY["hidden"], intermediate_size=TINY["intermediate"],
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)  # the same random weights in every test
    if kind == "v2":
        from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config, DiffLlamaV2ForCausalLM

        config = DiffLlamaV2Config(**common, head_dim=16)
        config._attn_implementation = implementation
        model = DiffLlamaV2ForCausalLM(config)
    else:
        config_class = transformers.DiffLlamaConfig if kind == "diff" else transformers.LlamaConfig
        config = config_class(**common, attn_implementation=implementation)
        model = transformers.AutoModelForCausalLM.from_config(config)
        if kind == "diff":
            assert diff_attention.install(model, "one_pass") == 2
    return model.eval()


def tokens(width: int = 9) -> torch.Tensor:
    return torch.arange(3, 3 + width)[None]


def test_the_cache_keyword_is_the_one_the_models_take():
    want = "cache" if compat._release(transformers.__version__) >= (5, 24) else "past_key_values"
    assert compat.cache_keyword() == want


@pytest.mark.parametrize("kind", ["base", "diff", "v2"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_model_call_fills_the_cache_it_is_given(kind, implementation):
    """The failure this module exists for: an attention that reads the wrong keyword never fills
    the cache, silently. Every layer must hold every token after the call."""
    model = tiny(kind, implementation)
    kv_cache = compat.empty_cache(model.config)
    with torch.inference_mode():
        out = model(input_ids=tokens(), use_cache=True, **compat.cache_argument(kv_cache))
    returned = compat.returned_cache(out)
    assert returned is kv_cache
    assert returned.get_seq_length() == 9
    assert [k.shape[2] for k, _ in compat.cache_tensors(returned)] == [9, 9]


@pytest.mark.parametrize("kind", ["base", "diff", "v2"])
def test_cached_greedy_steps_equal_the_uncached_argmax(kind):
    """Decoding over the cache gives the tokens a full forward pass gives, and the cache grows by
    one position a step."""
    model = tiny(kind)
    ids = tokens(6)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **compat.cache_argument(None))
        kv_cache = compat.returned_cache(out)
        for step in range(4):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            full = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            assert token.item() == full.item()
            ids = torch.cat([ids, token], dim=1)
            out = model(input_ids=token, use_cache=True, **compat.cache_argument(kv_cache))
            kv_cache = compat.returned_cache(out)
            assert kv_cache.get_seq_length() == 6 + step + 1


def test_caches_made_from_tensors_keep_them_and_take_views():
    keys = [torch.randn(1, 2, 5, 4) for _ in range(3)]
    values = [torch.randn(1, 2, 5, 4) for _ in range(3)]
    made = compat.new_cache(zip(keys, values))
    assert compat.is_plain_cache(made)
    assert all(torch.equal(k, k2) and torch.equal(v, v2)
               for (k, v), (k2, v2) in zip(compat.cache_tensors(made), zip(keys, values)))
    wide = [(k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1)) for k, v in zip(keys, values)]
    compat.set_cache_tensors(made, wide)
    assert [k.shape[0] for k, _ in compat.cache_tensors(made)] == [3, 3, 3]
    assert made.get_seq_length() == 5


@pytest.mark.parametrize("kind", ["base", "diff", "v2"])
def test_a_growing_cache_decodes_to_the_same_bits_without_copying_each_step(kind):
    """Decode steps over a growing cache give the logits a plain dynamic cache gives, bit for bit,
    past its room (a new buffer) and after rows are cut out (set from outside); between those, a
    step writes into the buffer it had (the keys stay views of one storage)."""
    model = tiny(kind)
    ids = torch.arange(3, 3 + 3 * 7).reshape(3, 7)
    steps = 10 + compat.ROOM_COLUMNS + 6  # the cut at step 10 makes new buffers with room from there
    with torch.inference_mode():
        prefill = model(input_ids=ids, use_cache=True)
        plain = compat.new_cache(compat.cache_tensors(compat.returned_cache(prefill)))
        growing = compat.growing_cache(compat.cache_tensors(compat.returned_cache(prefill)))
        assert compat.is_plain_cache(growing)
        token = prefill.logits[:, -1:].argmax(-1)
        storages = []
        for step in range(steps):
            if step == 10:  # the second row finishes: cut out of both caches
                for made in (plain, growing):
                    compat.set_cache_tensors(made, [(k[[0, 2]], v[[0, 2]]) for k, v in compat.cache_tensors(made)])
                token = token[[0, 2]]
            want = model(input_ids=token, use_cache=True, **compat.cache_argument(plain)).logits
            got = model(input_ids=token, use_cache=True, **compat.cache_argument(growing)).logits
            assert torch.equal(got, want)
            storages.append(compat.cache_tensors(growing)[0][0])  # held: no storage is freed and reused
            token = want[:, -1:].argmax(-1)
    assert growing.get_seq_length() == plain.get_seq_length() == 7 + steps
    # new buffers at the first step, the step after the cut and the step past the room only
    assert len({keys.untyped_storage().data_ptr() for keys in storages}) == 3


def test_a_static_cache_holds_a_prefill_and_continues_after_it():
    model = tiny("base")
    with torch.inference_mode():
        prefill = compat.returned_cache(model(input_ids=tokens(5), use_cache=True))
        pairs = compat.cache_tensors(prefill)
        static = compat.static_cache(model.config, slots=2, columns=16, like=pairs)
        compat.fill_static_cache(static, pairs)
        for (k, v), (sk, sv) in zip(pairs, compat.cache_tensors(static)):
            assert sk.shape == (2, k.shape[1], 16, k.shape[3])
            assert torch.equal(sk[:1, :, :5], k) and torch.equal(sv[:1, :, :5], v)
        assert static.get_seq_length() == 5


def test_a_registered_attention_function_is_called_in_every_layer():
    calls = []

    def counting(module, *args, **kwargs):
        calls.append(module.layer_idx)
        return compat.attention_function("sdpa")(module, *args, **kwargs)

    compat.register_attention("evalsuite_test_counting", counting, masks_like="sdpa")
    assert compat.has_mask_function("evalsuite_test_counting")
    model = tiny("base")
    model.set_attn_implementation("evalsuite_test_counting")
    assert compat.attention_implementation(model.config) == "evalsuite_test_counting"
    with torch.inference_mode():
        model(input_ids=tokens(), use_cache=False)
    assert calls == [0, 1]


def test_the_modeling_pieces_evalsuite_builds_on_are_there():
    diffllama = compat.diffllama_modeling()
    for name in ("DiffLlamaAttention", "apply_rotary_pos_emb", "eager_attention_forward"):
        assert hasattr(diffllama, name), name
    llama = compat.llama_modeling()
    for name in ("LlamaDecoderLayer", "LlamaForCausalLM", "LlamaModel", "LlamaPreTrainedModel", "LlamaRMSNorm",
                 "LlamaRotaryEmbedding", "eager_attention_forward", "rotate_half"):
        assert hasattr(llama, name), name


def test_no_deprecation_warning_from_evalsuite_calls(tiny_models, caplog):
    """Generation, shared prefixes and log-likelihoods on DiffLlama warn of nothing deprecated."""
    model = HFModel.load(str(tiny_models["diff"]), {}, device="cpu")
    requests = [GenerationRequest(prompt=f"question {i}: ", max_new_tokens=3, prefix="a shared beginning ")
                for i in range(3)]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        model.generate(requests)
        model.generate(requests[:1])
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "deprecat" in m.lower()], messages


def test_a_version_outside_the_tested_range_is_named():
    low, high = compat.TESTED["transformers"]
    assert compat.untested({"transformers": high}) == {}
    assert compat.untested({"transformers": low}) == {}
    older = compat.untested({"transformers": "4.0.0"})["transformers"]
    newer = compat.untested({"transformers": "99.1.0.dev0"})["transformers"]
    assert f"oldest tested ({low})" in older and f"newest tested ({high})" in newer


def test_the_tested_range_is_the_one_pyproject_and_the_constraints_state():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["evalsuite"]["tested"] == {name: list(ends) for name, ends in compat.TESTED.items()}
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    lowest = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "constraints-lowest.txt").read_text(), re.M))
    for name, (low, high) in compat.TESTED.items():
        assert pins[name] == high and lowest[name] == low, name
    declared = {re.split(r"[<>=;\[ ]", d, maxsplit=1)[0]: d for d in project["project"]["dependencies"]}
    assert declared["transformers"] == f"transformers>={compat.TESTED['transformers'][0]}"


INTERNALS = re.compile(r"cache_utils|masking_utils|modeling_utils|transformers\.models\b|\.layers\[|\._attn_implementation\b|"
                       r"\bpast_key_values\b|ALL_ATTENTION_FUNCTIONS|ALL_MASK_ATTENTION_FUNCTIONS|\bDynamicCache\b|"
                       r"\bStaticCache\b|\bDynamicLayer\b|AttentionInterface|AttentionMaskInterface")


def code_lines(path: Path) -> dict[int, str]:
    """Each line's code, with comments and string literals (docstrings included) blanked out."""
    lines = [list(line) for line in path.read_text().splitlines()]
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type not in (tokenize.COMMENT, tokenize.STRING):
                continue
            (first, start), (last, end) = token.start, token.end
            for number in range(first, last + 1):
                row = lines[number - 1]
                row[start if number == first else 0 : end if number == last else len(row)] = " "
    return {number: "".join(row) for number, row in enumerate(lines, 1)}


def test_transformers_internals_are_named_in_the_seam_only():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "compat.py" or "vllm" in path.parts:  # vLLM's own modeling API is a separate dependency
            continue
        outside += [f"{path.relative_to(ROOT)}:{number}: {code}" for number, code in code_lines(path).items()
                    if INTERNALS.search(code)]
    assert not outside, "\n".join(outside)


def test_the_internals_search_finds_what_it_looks_for(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('from transformers.cache_utils import DynamicLayer\nx = cache.layers[0].keys  # a cache\n'
                      '"""past_key_values in a docstring"""\n')
    found = [code for code in code_lines(module).values() if INTERNALS.search(code)]
    assert len(found) == 2
