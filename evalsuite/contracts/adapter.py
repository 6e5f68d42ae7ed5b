"""The model adapter: what every backend implements, the capabilities beyond it, and the check at load.

A backend's loader returns an adapter: `ModelAdapter`'s members, plus the members of each
capability's protocol (`PROTOCOLS`) it offers. Implementing a protocol is the one declaration: an
adapter offers a capability exactly when it has that protocol's members (`capabilities_of`,
`offers`), so what it says it does and what it does cannot drift apart. The names (`TOKEN_NLL`
...) are what tasks ask for and records keep. `validate_adapter` runs on every adapter a loader
returns and refuses, in one line naming what is missing, one that lacks a member of the contract.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol, cast, runtime_checkable

from evalsuite.errors import UserError
from evalsuite.types import AttentionMass, GenerationRequest, Loglikelihood, LoglikelihoodRequest


class ContractError(UserError, TypeError):
    """A task or backend that does not meet its contract (shown as one line)."""


@runtime_checkable
class ModelAdapter(Protocol):
    name: str  # short, file-name safe
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
class TokenIds(Protocol):
    """TOKEN_IDS: the model's own token ids of a text (a task that counts answer tokens uses them;
    without them it counts bytes)."""

    def encode(self, text: str, first: bool = True) -> list[int]:
        """Token ids of `text`; with `first`, the special tokens a prompt starts with (BOS)."""
        ...


@runtime_checkable
class TokenLoglikelihood(Protocol):
    """TOKEN_LOGLIKELIHOOD: log-likelihoods of token-id pairs. The lm-eval wrapper scores rolling
    text with lm-eval's own token windows through it; without it, it cuts text at whitespace."""

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
SCRIPTED_ANSWERS = "scripted_answers"
TOKEN_IDS = "token_ids"
PREFIX_CACHE = "prefix_cache"
TOKEN_LOGLIKELIHOOD = "token_loglikelihood"
BATCH_LIMITS = "batch_limits"
CAPABILITIES = (ATTENTION_QUANTIZATION, ACTIVATION_PROBE, ATTENTION_ALLOCATION, TOKEN_NLL, SCRIPTED_ANSWERS, TOKEN_IDS,
                TOKEN_LOGLIKELIHOOD, BATCH_LIMITS, PREFIX_CACHE)


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
                       layers: Sequence[int] | None = None, differential_norm: str = "lambda") -> AttentionMass:
        """Causal attention of the rows at positions `queries` of the prompt `ids` on each key span
        [start, end), for `layers` (None: all); DIFF layers give their differential heads, divided
        by the layer's 1 - λ (`differential_norm` "lambda"), 1 - λ_init ("lambda_init") or 1 ("none")."""
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


@runtime_checkable
class ScriptedAnswers(Protocol):
    """SCRIPTED_ANSWERS: a scripted model (fake:target) that answers with the expected answers it is
    told before it is asked. Requests never carry them; a real model does not offer this."""

    def expect(self, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
        """The target of the sample of each request (same order), for the next calls with them."""
        ...


@runtime_checkable
class BatchLimits(Protocol):
    """BATCH_LIMITS: a backend that halves its batches on running out of memory says what is in
    force: {"rows", "tokens"}, and "halvings": one entry per halving so far (the runner keeps a
    run's halvings in batch_limits.json)."""

    @property
    def batch_limits(self) -> dict[str, Any]: ...


@runtime_checkable
class PrefixCaching(Protocol):
    """PREFIX_CACHE: a shared prefix's KV cache computed once and reused (the same results, sooner);
    a run asked not to (`--no-prefix-cache`) turns it off. How it caches is the backend's own
    business (its own -M options); an adapter without a cache has nothing to turn off."""

    def use_prefix_cache(self, on: bool) -> None: ...


def tell_expected_answers(model: ModelAdapter, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
    """Tell a model offering SCRIPTED_ANSWERS what each request's sample expects; others are told nothing."""
    if offers(model, SCRIPTED_ANSWERS):
        cast(ScriptedAnswers, model).expect(requests, targets)  # its declared capability says it can


class ProbeRequest(Protocol):
    """A request that measures the model itself through one capability."""

    capability: ClassVar[str]

    def measure(self, model: ModelAdapter) -> Mapping[str, Any]:
        """What the model showed, as a JSON-able mapping (stored as it is; types.py)."""
        ...


def missing_capabilities(model: ModelAdapter, needed: Sequence[str]) -> list[str]:
    return [name for name in needed if not offers(model, name)]


def offers(model: ModelAdapter, capability: str) -> bool:
    """Whether the adapter implements `capability`'s protocol (False for a name that is none)."""
    protocol = PROTOCOLS.get(capability)
    return protocol is not None and isinstance(model, protocol)


def capabilities_of(model: ModelAdapter) -> frozenset[str]:
    """The names of the capabilities the adapter offers: those whose protocol it implements."""
    return frozenset(name for name in CAPABILITIES if offers(model, name))


# ---- the check at load ------------------------------------------------------------------------

PROTOCOLS: Mapping[str, type] = {
    ATTENTION_QUANTIZATION: QuantizedAttention, ACTIVATION_PROBE: ActivationProbe,
    ATTENTION_ALLOCATION: AttentionAllocation, TOKEN_NLL: TokenNLL, SCRIPTED_ANSWERS: ScriptedAnswers,
    TOKEN_IDS: TokenIds, TOKEN_LOGLIKELIHOOD: TokenLoglikelihood, BATCH_LIMITS: BatchLimits, PREFIX_CACHE: PrefixCaching,
}


def protocol_members(protocol: type) -> list[str]:
    """The public members a protocol asks for (methods, properties and annotated attributes)."""
    names = {name for name in vars(protocol) if not name.startswith("_")}
    return sorted(names | set(getattr(protocol, "__annotations__", {})))


def validate_adapter(model: Any, backend: str) -> None:
    """Raise ContractError naming the first thing the adapter a backend loaded lacks: a member of
    `ModelAdapter`, or, for an adapter written against the earlier contract that still lists its
    capabilities in a `capabilities` attribute, a known name for each and that name's protocol
    members: such a list is held to what the adapter implements, never trusted on its own."""
    label = f"backend {backend!r} returned {type(model).__qualname__}"
    lacking = [name for name in protocol_members(ModelAdapter) if not hasattr(model, name)]
    if lacking:
        raise ContractError(f"{label}, which lacks {', '.join(lacking)} of the model adapter contract "
                            "(evalsuite.contracts.ModelAdapter)")
    declared: Any = getattr(model, "capabilities", frozenset())
    if not isinstance(declared, (frozenset, set, tuple, list)) or not all(isinstance(n, str) for n in declared):
        raise ContractError(f"{label}, whose 'capabilities' must name capabilities from CAPABILITIES "
                            "(or be left out: an adapter offers what it implements)")
    for name in sorted(declared):
        if name not in PROTOCOLS:
            close = difflib.get_close_matches(name, CAPABILITIES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(CAPABILITIES)}"
            raise ContractError(f"{label}, which declares the unknown capability {name!r}{hint}")
        protocol = PROTOCOLS[name]
        missing = [member for member in protocol_members(protocol) if not hasattr(model, member)]
        if missing:
            raise ContractError(f"{label}, which declares {name} but lacks {', '.join(missing)} "
                                f"(evalsuite.contracts.{protocol.__name__})")
