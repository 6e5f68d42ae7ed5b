"""The model adapter: the one interface every backend implements.

Tasks only build requests and read outputs; batching, sorting by length,
prefix caching and memory limits live inside the backend.

Beyond generate and loglikelihood, a backend may offer capabilities, named in
its `capabilities` set and each a small protocol below. A task names the ones
it needs (`required_capabilities`) and calls them through the adapter only; a
backend without one is refused before the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationRequest:
    """Greedy generation of `prompt`, continued after a shared `prefix`.

    The model sees `prefix + prompt`. Requests with the same non-empty prefix
    may share one encoding of it (its KV cache). `choices`, when given, closes
    the answer set: the output is always exactly one of them.
    """

    prompt: str
    prefix: str = ""
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    target: tuple[str, ...] = ()  # the sample's expected answer, for scripted backends; real backends ignore it


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """log p(continuation | prefix + context), summed over continuation tokens."""

    context: str
    continuation: str
    prefix: str = ""
    target: tuple[str, ...] = ()  # the sample's expected answer, for scripted backends; real backends ignore it


@dataclass(frozen=True)
class Loglikelihood:
    logprob: float
    is_greedy: bool  # every continuation token was the argmax (lm-eval's second value)
    tokens: int


@runtime_checkable
class ModelAdapter(Protocol):
    name: str  # short, file-name safe
    capabilities: frozenset[str]  # names from CAPABILITIES that this backend offers
    max_context: int  # tokens the model can attend over
    chat_template: bool  # prompts are wrapped in the model's chat template

    def fingerprint(self) -> dict[str, Any]:
        """What exactly was loaded: path, config and weights hashes, dtype, attention..."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` as a full prompt (special tokens the backend adds included)."""
        ...

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        """`user` wrapped as a chat turn when chat templates are on, else unchanged + prefix."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]: ...

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]: ...


@runtime_checkable
class TokenLoglikelihood(Protocol):
    """Optional: log-likelihoods of token-id pairs. The lm-eval wrapper scores rolling text
    with lm-eval's own token windows through it; without it, it cuts text at whitespace."""

    prefix_token_id: int  # what a text's first token is conditioned on (BOS, else EOS), as in lm-eval

    def encode(self, text: str, first: bool = True) -> list[int]: ...

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Loglikelihood]:
        """Each (context ids, continuation ids): log p(continuation | context), as `loglikelihood`."""
        ...


# ---- capabilities beyond generate/loglikelihood -----------------------------------------------

ATTENTION_QUANTIZATION = "attention_quantization"
ACTIVATION_PROBE = "activation_probe"
ATTENTION_ALLOCATION = "attention_allocation"
TOKEN_NLL = "token_nll"
CAPABILITIES = (ATTENTION_QUANTIZATION, ACTIVATION_PROBE, ATTENTION_ALLOCATION, TOKEN_NLL)


@runtime_checkable
class QuantizedAttention(Protocol):
    """ATTENTION_QUANTIZATION: attention logits quantized to `bits` inside the context
    (None: as loaded). The granularity is the backend's own option."""

    def quantized_attention(self, bits: int | None) -> AbstractContextManager[None]: ...


# observe(kind, layer, values, valid): kind "hidden" (a layer's output) or "attention_logits"
# (pre-softmax q.k scaled); `valid` marks the causal entries of `values`, or None for all.
ActivationObserver = Callable[[str, int, Any, Any], None]


@runtime_checkable
class ActivationProbe(Protocol):
    """ACTIVATION_PROBE: token windows through the model, every layer's activations observed."""

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids of `text`; with `first`, the special tokens a prompt starts with (BOS)."""
        ...

    def probe_activations(self, windows: Sequence[Sequence[int]], observe: ActivationObserver) -> None:
        """Each window through the model; `observe` sees every layer's activations once per pass."""
        ...


@dataclass(frozen=True)
class AttentionMass:
    """What query rows pay to spans of key positions: `mass[l, h, r, s]` is the sum of head h's
    attention weights (layer `layers[l]`, query row r) over span s (a numpy array)."""

    layers: tuple[int, ...]
    mass: Any  # numpy float64, shape (layers, heads, query rows, spans)
    attention_map: str  # "softmax", or "differential": DIFF heads, (w1 - λ·w2) / normalisation
    normalisation: str = ""  # differential maps: "1 - lambda_init", "1 - lambda" or "1"
    lambdas: tuple[float, ...] = ()  # differential maps: λ of each layer in `layers`


@runtime_checkable
class AttentionAllocation(Protocol):
    """ATTENTION_ALLOCATION: the attention a few query rows pay to spans of key positions, per
    layer and head, computed from those rows only (memory linear in the prompt)."""

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` as a full prompt (what `count_tokens` counts) and each token's
        character span in `text` ((0, 0) for special tokens the tokenizer adds)."""
        ...

    def attention_layers(self) -> int:
        """How many layers have attention (valid layer indices are 0 .. this - 1)."""
        ...

    def attention_mass(self, ids: Sequence[int], queries: Sequence[int], spans: Sequence[tuple[int, int]],
                       layers: Sequence[int] | None = None, differential_norm: str = "lambda_init") -> AttentionMass:
        """Causal attention of the rows at positions `queries` of the prompt `ids` on each key span
        [start, end), for `layers` (None: all); DIFF layers give their differential heads, divided
        by 1 - λ_init (`differential_norm` "lambda_init"), 1 - λ ("lambda") or 1 ("none")."""
        ...


@runtime_checkable
class TokenNLL(Protocol):
    """TOKEN_NLL: the teacher-forced negative log-likelihood of every token of token windows,
    in memory linear in the window (no sequence x vocabulary logits tensor)."""

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids of `text`; with `first`, the special tokens a prompt starts with (BOS)."""
        ...

    def token_nll(self, windows: Sequence[Sequence[int]]) -> list[list[float]]:
        """For each window, -log p(window[i] | window[:i]) for i = 1 .. len - 1 (natural log)."""
        ...


class ProbeRequest(Protocol):
    """A request that measures the model itself through one capability."""

    capability: ClassVar[str]

    def measure(self, model: ModelAdapter) -> Any: ...


def missing_capabilities(model: ModelAdapter, needed: Sequence[str]) -> list[str]:
    offered: frozenset[str] = getattr(model, "capabilities", frozenset())
    return [name for name in needed if name not in offered]
