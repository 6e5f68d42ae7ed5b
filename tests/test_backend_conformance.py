"""Every backend that loads without downloading weights, held to one suite: `fake`, `hf` on the
built-in toy models, `server` against a completions server on loopback (real HTTP) that serves
them, and `bigram`, the backend docs/writing-a-backend.md writes, taken from the page and
registered through an entry point as an installed plugin is. The checks:

- the contract: the adapter's members, a file-name safe name, its capabilities those whose
  protocol it implements (contracts.capabilities_of);
- the fingerprint: JSON, the same for two loads of one model, different for another model;
- counting agrees with what the model reads: `count_tokens(context + continuation)` is as many
  tokens more than `count_tokens(context)` as `loglikelihood` scores in the continuation;
- generation: one function of `prefix + prompt` (alone, in a batch, split at a prefix, twice),
  at most `max_new_tokens` tokens, cut before the first stop string, one of its `choices`;
- log-likelihoods: finite, and the continuation generation gives is greedy and the likeliest;
- each capability the adapter offers does what its protocol says (CAPABILITY_CHECKS).

A deliberately broken backend for each check (BROKEN) shows that the check fails.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from completions_server import CompletionsServer
from conftest import invoke

from evalsuite.backends import backend_names, check_model, get_backend, load_model
from evalsuite.contracts import (
    ACTIVATION_PROBE,
    ATTENTION_ALLOCATION,
    ATTENTION_QUANTIZATION,
    BATCH_LIMITS,
    CAPABILITIES,
    PREFIX_CACHE,
    SCRIPTED_ANSWERS,
    TOKEN_IDS,
    TOKEN_LOGLIKELIHOOD,
    TOKEN_NLL,
    ModelAdapter,
    capabilities_of,
    validate_adapter,
)
from evalsuite.registry import BACKENDS
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

GUIDE = Path(__file__).parents[1] / "docs" / "writing-a-backend.md"
FACTS = "The magic number of Paris is 42.\nThe magic number of Rome is 17.\n"
PROMPT = FACTS + "What is the magic number of Paris? Answer: The magic number of Paris is"
SPLITS = [("The magic number of Paris is", " 42."), (PROMPT, " 42. The magic"), ("What is the magic", " number")]
ALTERNATIVES = (" 17.", " 42.", " 4", " 1", " The", " the", ".", ",", "4", "1", "T", "W", "x")
TOLERANCE = 1e-3  # log-probabilities of one sequence through two code paths (float32 on a CPU)
# built-in backends the suite cannot load here, and why (any other must be in CASES)
WITHOUT_SUITE = {"gguf": "needs a GGUF file (no toy one ships); it is the hf adapter behind transformers' reader",
                 "vllm": "needs vLLM: test_vllm_passes_the_checks_that_call_the_model, marker vllm, below"}
VLLM_FAST = {"enforce_eager": "true", "kv_cache_memory_bytes": str(256 << 20)}  # as tests/test_vllm_backend.py


@dataclass
class Backend:
    """A backend under test: how to load one model of it and a different one."""

    name: str
    load: Callable[[bool], ModelAdapter]  # other=False: the model; True: another model
    _loaded: ModelAdapter | None = field(default=None, repr=False)

    @property
    def model(self) -> ModelAdapter:
        """The model, loaded once for the checks that only call it."""
        if self._loaded is None:
            self._loaded = self.load(False)
        return self._loaded


def by_spec(name: str, spec: str, other: str, options: dict[str, str] | None = None,
            other_options: dict[str, str] | None = None) -> Backend:
    """A registered backend, loaded the way a run loads it (load_model: the registry, then the check at load)."""
    return Backend(name, lambda alt: load_model(other if alt else spec, (other_options if alt else options) or {},
                                                device="cpu"))


# ---- the backends under test -------------------------------------------------------------------


@pytest.fixture(scope="module")
def bigram_plugin(tmp_path_factory) -> Iterator[str]:
    """docs/writing-a-backend.md's module and entry point, written as an installed package (its
    dist-info on sys.path), found through importlib.metadata and loaded as the registry loads a plugin."""
    from importlib.metadata import entry_points

    site = tmp_path_factory.mktemp("site")
    module, entry = guide_blocks()
    (site / "evalsuite_bigram.py").write_text(module, encoding="utf-8")
    info = site / "evalsuite_bigram-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evalsuite-bigram\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points_ini(entry))
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        (found,) = [ep for ep in entry_points(group="evalsuite.backends") if ep.name == "bigram"]
        assert found.value == "evalsuite_bigram:load"
        assert found.load() is get_backend("bigram")  # the module's decorator registered what the entry point names
        yield "bigram"
    finally:
        BACKENDS.pop("bigram", None)
        sys.modules.pop("evalsuite_bigram", None)
        sys.path.remove(str(site))


@pytest.fixture(scope="module")
def toy_servers() -> Iterator[dict[str, str]]:
    """A completions server per toy model, each backed by the hf adapter: {served name: base URL}."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for name in ("toy-base", "toy-diff"):
            server = stack.enter_context(CompletionsServer(load_model(name, {}, device="cpu"), served_name=name))
            urls[name] = server.url
        yield urls


CASES = ("fake", "fake-target", "hf", "server", "bigram")
GENERATING = ("fake", "hf", "server", "bigram")  # fake:target answers only what it was told


class Backends(dict[str, Backend]):
    """Each case of CASES, built on first use (the server and plugin fixtures only when asked)."""

    def __init__(self, request: Any):
        super().__init__()
        self.request = request

    def __missing__(self, name: str) -> Backend:
        self[name] = build(name, self.request)
        return self[name]


@pytest.fixture(scope="module")
def backends(request) -> Backends:
    return Backends(request)


def build(name: str, request: Any) -> Backend:
    if name == "fake":
        return by_spec(name, "fake:echo", "fake:oracle")
    if name == "fake-target":
        return by_spec(name, "fake:target", "fake:echo")
    if name == "hf":
        return by_spec(name, "toy-base", "toy-diff")
    if name == "server":
        urls = request.getfixturevalue("toy_servers")
        return by_spec(name, "server:toy-base", "server:toy-diff", {"base_url": urls["toy-base"], "retries": "0"},
                       {"base_url": urls["toy-diff"], "retries": "0"})
    if name == "bigram":
        request.getfixturevalue("bigram_plugin")
        return by_spec(name, "bigram:0.5", "bigram:2")
    raise KeyError(name)


# ---- the checks ------------------------------------------------------------------------------


def check_contract(backend: Backend) -> None:
    model = backend.model
    validate_adapter(model, backend.name)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", model.name), f"name {model.name!r} is not file-name safe"
    assert isinstance(model.max_context, int) and model.max_context > 0
    assert isinstance(model.chat_template, bool)
    if not model.chat_template:
        assert model.format_user_turn("Q?", " A:") == "Q? A:"
    assert capabilities_of(model) <= set(CAPABILITIES)


def check_fingerprint_is_stable(backend: Backend) -> None:
    first, second = backend.load(False).fingerprint(), backend.load(False).fingerprint()
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True), "two loads, two fingerprints"


def check_fingerprint_tells_models_apart(backend: Backend) -> None:
    one, other = backend.load(False).fingerprint(), backend.load(True).fingerprint()
    assert json.dumps(one, sort_keys=True) != json.dumps(other, sort_keys=True), "two models, one fingerprint"


def check_counting_matches_scoring(backend: Backend) -> None:
    model = backend.model
    assert model.count_tokens(PROMPT + PROMPT) > model.count_tokens(PROMPT) >= 1
    requests = [LoglikelihoodRequest(context, continuation) for context, continuation in SPLITS]
    requests.append(LoglikelihoodRequest(" Answer: The magic number of Paris is", " 42.", prefix=FACTS))
    for request, scored in zip(requests, model.loglikelihood(requests)):
        before = request.prefix + request.context
        more = model.count_tokens(before + request.continuation) - model.count_tokens(before)
        assert more == scored.tokens, f"{request}: counted {more} more tokens, scored {scored.tokens}"


def check_generation_is_one_function_of_the_prompt(backend: Backend) -> None:
    model = backend.model
    whole = GenerationRequest(prompt=PROMPT, max_new_tokens=8)
    split = GenerationRequest(prompt=PROMPT[len(FACTS):], prefix=FACTS, max_new_tokens=8)
    short = GenerationRequest(prompt="The magic number of Rome is", max_new_tokens=8)
    alone = model.generate([whole])
    assert alone[0], "the check needs an answer to this prompt"
    assert model.generate([whole]) == alone, "the same request, another answer"
    assert model.generate([split]) == alone, "prefix + prompt answered otherwise than the prompt whole"
    assert model.generate([short, whole]) == model.generate([short]) + alone, "answers change in a batch"


def check_max_new_tokens(backend: Backend) -> None:
    model = backend.model
    for budget in (1, 3):
        (answer,) = model.generate([GenerationRequest(prompt=PROMPT, max_new_tokens=budget)])
        more = model.count_tokens(PROMPT + answer) - model.count_tokens(PROMPT)
        assert more <= budget, f"{answer!r}: {more} tokens for max_new_tokens={budget}"


def check_stop_strings(backend: Backend) -> None:
    model = backend.model
    (free,) = model.generate([GenerationRequest(prompt=PROMPT, max_new_tokens=16)])
    assert len(free) >= 3, f"the check needs an answer of a few characters, not {free!r}"
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    (stopped,) = model.generate([GenerationRequest(prompt=PROMPT, max_new_tokens=16, stop=("@@never@@", stop))])
    assert stopped == free[: free.index(stop)], f"stop {stop!r}: {stopped!r} from {free!r}"


def check_choices(backend: Backend) -> None:
    choices = (" 42.", " 17.", " 99.")
    (answer,) = backend.model.generate([GenerationRequest(prompt=PROMPT, max_new_tokens=4, choices=choices)])
    assert answer in choices, f"{answer!r} is none of {choices}"


def check_greedy_continuation_scores_highest(backend: Backend) -> None:
    model = backend.model
    (greedy,) = model.generate([GenerationRequest(prompt=PROMPT, max_new_tokens=1)])
    assert greedy, "the check needs the prompt's first answer token"
    others = [a for a in ALTERNATIVES if a != greedy]
    scored = model.loglikelihood([LoglikelihoodRequest(PROMPT, c) for c in (greedy, *others)])
    assert all(math.isfinite(s.logprob) and s.logprob <= TOLERANCE and s.tokens >= 1 for s in scored), scored
    best, rest = scored[0], [s for s in scored[1:] if s.tokens == scored[0].tokens]
    assert best.is_greedy, f"generation's own continuation {greedy!r} is not greedy: {best}"
    assert rest and best.logprob >= max(s.logprob for s in rest) - TOLERANCE, f"{greedy!r} scores below another"
    assert not any(s.is_greedy for s in rest if s.logprob < best.logprob - TOLERANCE), "a less likely token is greedy"


CHECKS: dict[str, Callable[[Backend], None]] = {
    "contract": check_contract, "fingerprint_stable": check_fingerprint_is_stable,
    "fingerprint_apart": check_fingerprint_tells_models_apart, "counting": check_counting_matches_scoring,
    "generation": check_generation_is_one_function_of_the_prompt, "max_new_tokens": check_max_new_tokens,
    "stop": check_stop_strings, "choices": check_choices, "greedy": check_greedy_continuation_scores_highest,
}
EVERY_BACKEND = ("contract", "fingerprint_stable", "fingerprint_apart")  # the rest need a model that answers


# ---- each capability, as its protocol says -----------------------------------------------------


def check_token_ids(model: Any) -> None:
    for text in ("", PROMPT, " 42."):
        ids = model.encode(text)
        assert all(isinstance(i, int) for i in ids) and len(ids) == model.count_tokens(text), "ids and count differ"
        rest = model.encode(text, first=False)
        assert ids[len(ids) - len(rest):] == rest, "first=True may only add the prompt's leading special tokens"


def check_token_loglikelihood(model: Any) -> None:
    assert isinstance(model.prefix_token_id, int)
    context, continuation = SPLITS[0]
    before, whole = model.encode(context), model.encode(context + continuation)
    assert whole[: len(before)] == before
    (by_ids,) = model.loglikelihood_tokens([(before, whole[len(before):])])
    (by_text,) = model.loglikelihood([LoglikelihoodRequest(context, continuation)])
    assert by_ids.logprob == pytest.approx(by_text.logprob, abs=TOLERANCE), (by_ids, by_text)
    assert (by_ids.tokens, by_ids.is_greedy) == (by_text.tokens, by_text.is_greedy)


def check_token_nll(model: Any) -> None:
    context, continuation = SPLITS[1]
    whole, before = model.encode(context + continuation), model.encode(context)
    (nll,) = model.token_nll([whole])
    assert len(nll) == len(whole) - 1 and all(math.isfinite(v) and v >= -TOLERANCE for v in nll)
    (scored,) = model.loglikelihood([LoglikelihoodRequest(context, continuation)])
    assert -sum(nll[len(before) - 1:]) == pytest.approx(scored.logprob, abs=TOLERANCE * len(nll)), "NLL and log p differ"


def check_attention_allocation(model: Any) -> None:
    ids, offsets = model.encode_with_offsets(PROMPT)
    assert ids == model.encode(PROMPT) and len(ids) == model.count_tokens(PROMPT) and len(offsets) == len(ids)
    assert all(0 <= start <= end <= len(PROMPT) for start, end in offsets)
    assert "".join(PROMPT[s:e] for s, e in offsets if e > s).replace(" ", "") == PROMPT.replace(" ", "")
    n, layers = len(ids), model.attention_layers()
    queries, spans = [n - 1, n // 2], [(0, n // 3), (n // 3, n)]  # together, every key a query sees
    shares = model.attention_mass(ids, queries, spans)
    assert layers >= 1 and set(shares.layers) <= set(range(layers))
    assert shares.mass.shape[0] == len(shares.layers) and shares.mass.shape[2:] == (2, 2)
    np.testing.assert_allclose(shares.mass.sum(axis=-1), 1.0, atol=1e-4)  # each row's attention, whole
    if shares.attention_map == "softmax":
        assert (shares.mass >= -1e-6).all()
    first = model.attention_mass(ids, queries, spans, layers=[shares.layers[0]])
    np.testing.assert_allclose(first.mass[0], shares.mass[0], atol=1e-5)


def check_activation_probe(model: Any) -> None:
    window = model.encode(PROMPT)[:24]
    seen: list[tuple[str, int, tuple[int, ...]]] = []
    model.probe_activations([window], lambda kind, layer, values, valid: seen.append((kind, layer, values.shape)))
    hidden = [(layer, shape) for kind, layer, shape in seen if kind == "hidden"]
    layers = sorted(layer for layer, _ in hidden)
    assert layers and layers == list(range(len(layers))), f"each layer's output once per pass, not {layers}"
    assert all(shape[-2] == len(window) for _, shape in hidden), "a hidden state per token of the window"
    assert {layer for kind, layer, _ in seen if kind == "attention_logits"} == set(layers)


def check_attention_quantization(model: Any) -> None:
    requests = [LoglikelihoodRequest(context, continuation) for context, continuation in SPLITS]

    def scores() -> list[float]:
        return [s.logprob for s in model.loglikelihood(requests)]

    before = scores()
    with model.quantized_attention(None):
        assert scores() == pytest.approx(before, abs=1e-5), "bits=None must run the model as loaded"
    with model.quantized_attention(2):
        coarse = scores()
    assert max(abs(a - b) for a, b in zip(coarse, before)) > 1e-3, "2-bit attention logits changed nothing"
    assert scores() == pytest.approx(before, abs=1e-5), "the quantization outlived its block"


def check_batch_limits(model: Any) -> None:
    limits = model.batch_limits
    assert {"rows", "tokens", "halvings"} <= set(limits), f"batch limits without rows, tokens or halvings: {limits}"
    assert limits["rows"] >= 1 and limits["tokens"] >= 1 and isinstance(limits["halvings"], list), limits


def check_prefix_cache(model: Any) -> None:
    request = GenerationRequest(prompt=PROMPT[len(FACTS):], prefix=FACTS, max_new_tokens=8)
    scored = LoglikelihoodRequest(" Answer: The magic number of Paris is", " 42.", prefix=FACTS)
    cached = model.generate([request]), model.loglikelihood([scored])[0].logprob
    model.use_prefix_cache(False)
    try:
        uncached = model.generate([request]), model.loglikelihood([scored])[0].logprob
    finally:
        model.use_prefix_cache(True)
    assert uncached[0] == cached[0] and uncached[1] == pytest.approx(cached[1], abs=TOLERANCE), "the cache changed results"


def check_scripted_answers(model: Any) -> None:
    told, untold = GenerationRequest(prompt="Q?"), GenerationRequest(prompt="Q?")
    right, wrong = LoglikelihoodRequest("Q?", " 42"), LoglikelihoodRequest("Q?", " 17")
    model.expect([told, right, wrong], [("42",), ("42",), ("42",)])
    assert model.generate([told])[0].split() == ["42"], "a told request answered otherwise than its target"
    assert "42" not in model.generate([untold])[0], "an equal request that was not told got the target"
    hit, miss = model.loglikelihood([right, wrong])
    assert hit.is_greedy and not miss.is_greedy and hit.logprob > miss.logprob


CAPABILITY_CHECKS: dict[str, Callable[[Any], None]] = {
    TOKEN_IDS: check_token_ids, TOKEN_LOGLIKELIHOOD: check_token_loglikelihood, TOKEN_NLL: check_token_nll,
    ATTENTION_ALLOCATION: check_attention_allocation, ACTIVATION_PROBE: check_activation_probe,
    ATTENTION_QUANTIZATION: check_attention_quantization, BATCH_LIMITS: check_batch_limits,
    PREFIX_CACHE: check_prefix_cache, SCRIPTED_ANSWERS: check_scripted_answers,
}


# ---- the suite over every backend --------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("check", EVERY_BACKEND)
def test_every_backend_meets_the_contract(backends, case, check):
    CHECKS[check](backends[case])


@pytest.mark.parametrize("case", GENERATING)
@pytest.mark.parametrize("check", [c for c in CHECKS if c not in EVERY_BACKEND])
def test_every_backend_counts_generates_and_scores_as_the_contract_says(backends, case, check):
    CHECKS[check](backends[case])


@pytest.mark.parametrize("case", CASES)
def test_each_capability_an_adapter_offers_does_what_its_protocol_says(backends, case):
    model = backends[case].model
    for capability in sorted(capabilities_of(model)):
        CAPABILITY_CHECKS[capability](model)


def test_every_capability_has_a_check_and_a_backend_here_that_offers_it(backends):
    assert set(CAPABILITY_CHECKS) == set(CAPABILITIES)
    offered = set().union(*(capabilities_of(backends[case].model) for case in ("fake-target", "hf")))
    assert offered == set(CAPABILITIES)
    assert capabilities_of(backends["fake"].model) == frozenset()


def test_the_differential_toy_model_passes_the_capability_checks(backends):
    model = backends["hf"].load(True)  # toy-diff: differential attention maps, lambda-normalised
    for capability in (ATTENTION_ALLOCATION, ACTIVATION_PROBE, TOKEN_NLL):
        CAPABILITY_CHECKS[capability](model)


@pytest.mark.vllm
def test_vllm_passes_the_checks_that_call_the_model():
    """One vLLM engine (one per process is what a small machine affords): every check but the
    two that load a second model, and each capability it offers."""
    pytest.importorskip("vllm")
    backend = Backend("vllm", lambda other: pytest.fail("one engine only"))
    backend._loaded = load_model("vllm:toy-base", VLLM_FAST, device="cpu")
    for name, check in CHECKS.items():
        if not name.startswith("fingerprint"):
            check(backend)
    assert capabilities_of(backend.model) == {TOKEN_IDS, TOKEN_LOGLIKELIHOOD, TOKEN_NLL, PREFIX_CACHE}
    for capability in sorted(capabilities_of(backend.model)):
        CAPABILITY_CHECKS[capability](backend.model)


def test_every_built_in_backend_is_in_the_suite_or_says_why_not():
    built_in = {name for name in backend_names() if get_backend(name).__module__.startswith("evalsuite.")}
    missing = built_in - {"fake", "hf", "server"} - set(WITHOUT_SUITE)
    assert not missing, f"backends {sorted(missing)} are not in the conformance suite: add them to CASES in {__file__}"


# ---- a broken backend for each check -----------------------------------------------------------


class Broken:
    """A working adapter with one member replaced: what every other member does, it still does."""

    def __init__(self, model: Any, **replaced: Any):
        self._model = model
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def fake(spec: str = "fake:echo") -> Any:
    return load_model(spec, {})


def broken_fake(**replaced: Any) -> Backend:
    return Backend("broken", lambda other: Broken(fake("fake:oracle" if other else "fake:echo"), **replaced))


def each_load_differs() -> Backend:
    """fake:echo whose fingerprint counts its loads."""
    loads = itertools.count()

    def load(other: bool) -> Any:
        number = next(loads)
        return Broken(fake(), fingerprint=lambda: {"backend": "fake", "load": number})

    return Backend("broken", load)


def rewriting(rewrite: Callable[[GenerationRequest], GenerationRequest]) -> Backend:
    """fake:echo, each request rewritten before it reads it."""
    model = fake()
    return Backend("broken", lambda other: Broken(model, generate=lambda requests: model.generate(
        [rewrite(r) for r in requests])))


def scores_inverted() -> Backend:
    """fake:echo whose log-probabilities are upside down: the greedy continuation the least likely."""
    model = fake()
    return Backend("broken", lambda other: Broken(model, loglikelihood=lambda requests: [
        replace(s, logprob=-10.0 - s.logprob) for s in model.loglikelihood(requests)]))


BROKEN: dict[str, Callable[[], Backend]] = {
    "contract": lambda: broken_fake(name="fake echo/1"),
    "fingerprint_stable": each_load_differs,
    "fingerprint_apart": lambda: broken_fake(fingerprint=lambda: {"backend": "fake"}),
    "counting": lambda: broken_fake(count_tokens=lambda text: 1 + len(text.split())),  # counts words, scores bytes
    "generation": lambda: rewriting(lambda r: replace(r, prompt=r.prompt + r.prefix, prefix="")),  # prefix last
    "max_new_tokens": lambda: rewriting(lambda r: replace(r, max_new_tokens=64)),
    "stop": lambda: rewriting(lambda r: replace(r, stop=())),
    "choices": lambda: rewriting(lambda r: replace(r, choices=None)),  # answers freely
    "greedy": scores_inverted,
}


def test_every_check_has_a_broken_backend():
    assert set(BROKEN) == set(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_each_check_fails_on_a_backend_broken_for_it(check):
    with pytest.raises(AssertionError):
        CHECKS[check](BROKEN[check]())


@pytest.fixture(scope="module")
def toy_base(backends) -> Any:
    return backends["hf"].model


class _NoOp(contextlib.AbstractContextManager):
    def __exit__(self, *exc: object) -> None:
        return None


def skip_layer_zero(model: Any) -> Callable[..., None]:
    def probe(windows: Any, observe: Any) -> None:
        model.probe_activations(windows, lambda kind, layer, *rest: layer == 0 or observe(kind, layer, *rest))
    return probe


def doubled_mass(model: Any) -> Callable[..., Any]:
    def attention_mass(*args: Any, **kwargs: Any) -> Any:
        shares = model.attention_mass(*args, **kwargs)
        return replace(shares, mass=shares.mass * 2)
    return attention_mass


def cache_off_differs(model: Any) -> dict[str, Any]:
    state = {"on": True}

    def use_prefix_cache(on: bool) -> None:
        state["on"] = on

    def generate(requests: Any) -> list[str]:
        return [out + ("" if state["on"] else "!") for out in model.generate(requests)]

    return {"use_prefix_cache": use_prefix_cache, "generate": generate}


CAPABILITY_BROKEN: dict[str, Callable[[Any], dict[str, Any]]] = {
    TOKEN_IDS: lambda m: {"encode": lambda text, first=True: m.encode(text, first=False)},  # never the BOS
    TOKEN_LOGLIKELIHOOD: lambda m: {"loglikelihood_tokens": lambda pairs: m.loglikelihood_tokens(
        [(c, t[:-1] or t) for c, t in pairs])},  # drops the last continuation token
    TOKEN_NLL: lambda m: {"token_nll": lambda windows: [[-v for v in row] for row in m.token_nll(windows)]},
    ATTENTION_ALLOCATION: lambda m: {"attention_mass": doubled_mass(m)},
    ACTIVATION_PROBE: lambda m: {"probe_activations": skip_layer_zero(m)},
    ATTENTION_QUANTIZATION: lambda m: {"quantized_attention": lambda bits: _NoOp()},
    BATCH_LIMITS: lambda m: {"batch_limits": {"rows": 8, "tokens": 4096}},  # no halvings
    PREFIX_CACHE: cache_off_differs,
}


def test_every_capability_check_has_a_broken_backend():
    assert set(CAPABILITY_BROKEN) | {SCRIPTED_ANSWERS} == set(CAPABILITY_CHECKS)  # scripted answers: below


@pytest.mark.parametrize("capability", CAPABILITY_BROKEN)
def test_each_capability_check_fails_on_an_adapter_broken_for_it(toy_base, capability):
    broken = Broken(toy_base, **CAPABILITY_BROKEN[capability](toy_base))
    assert capability in capabilities_of(broken)
    with pytest.raises(AssertionError):
        CAPABILITY_CHECKS[capability](broken)


def test_the_scripted_answers_check_fails_on_a_model_that_answers_by_the_prompt():
    target = fake("fake:target")
    told: dict[str, tuple[str, ...]] = {}

    def expect(requests: Any, targets: Any) -> None:  # keyed by text: an untold equal request gets it too
        told.update({r.prompt if hasattr(r, "prompt") else r.context: tuple(t) for r, t in zip(requests, targets)})

    def generate(requests: Any) -> list[str]:
        return [" " + " ".join(told.get(r.prompt, ())) for r in requests]

    with pytest.raises(AssertionError):
        check_scripted_answers(Broken(target, expect=expect, generate=generate))


# ---- capabilities are what an adapter implements, and every loader is checked the same way ------


def test_capabilities_are_read_off_what_the_adapter_implements(toy_base):
    assert capabilities_of(toy_base) == set(CAPABILITIES) - {SCRIPTED_ANSWERS}
    assert capabilities_of(Broken(fake(), encode=lambda text, first=True: list(text.encode()))) == {TOKEN_IDS}
    assert capabilities_of(fake("fake:target")) == {SCRIPTED_ANSWERS}


def test_a_plugin_loader_is_checked_ahead_by_its_own_check(bigram_plugin):
    from evalsuite.errors import UserError

    check_model("bigram:2", {})
    with pytest.raises(UserError, match=r"'x' is no smoothing"):
        check_model("bigram:x", {})
    for name in ("hf", "gguf", "fake", "server", "vllm"):
        assert callable(getattr(get_backend(name), "check", None)), f"the {name} loader carries no check"


# ---- docs/writing-a-backend.md, followed -------------------------------------------------------


def guide_blocks() -> tuple[str, str]:
    """The guide's python block (the backend module) and its toml block (the entry point)."""
    text = GUIDE.read_text(encoding="utf-8")
    (module,) = re.findall(r"```python\n(.*?)```", text, re.S)
    entry = re.findall(r"```toml\n(.*?)```", text, re.S)[0]
    return module, entry


def entry_points_ini(toml_block: str) -> str:
    """pyproject.toml's entry-point table as the entry_points.txt pip writes from it."""
    import tomllib

    tables = tomllib.loads(toml_block)["project"]["entry-points"]
    return "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items()) + "\n"
                   for group, names in tables.items())


def test_the_guide_says_how_long_its_backend_is():
    module, _ = guide_blocks()
    lines = len(module.splitlines())
    assert lines <= 90 and f"## 1. A backend in {lines} lines" in GUIDE.read_text(encoding="utf-8")


def test_the_guides_run_command_runs_its_backend_end_to_end(bigram_plugin, tmp_path, capsys):
    text = GUIDE.read_text(encoding="utf-8")
    (command,) = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()
                  if line.startswith("evalsuite run")]
    ran = invoke(capsys, *shlex.split(command)[1:], "--out", str(tmp_path), "--no-progress")
    assert ran.code == 0, ran.err
    runs = sorted(tmp_path.glob("needle-bigram-*"))
    assert len(runs) == 2 and list(tmp_path.glob("compare-*")), sorted(p.name for p in tmp_path.iterdir())
    records = [json.loads(line) for line in (runs[0] / "samples.jsonl").read_text().splitlines()]
    assert records and not any(r["error"] for r in records)
