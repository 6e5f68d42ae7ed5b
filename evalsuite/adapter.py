"""The model adapter: the one interface every backend implements.

Tasks only build requests and read outputs; batching, sorting by length,
prefix caching and memory limits live inside the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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


@dataclass(frozen=True)
class LoglikelihoodRequest:
    """log p(continuation | prefix + context), summed over continuation tokens."""

    context: str
    continuation: str
    prefix: str = ""


@dataclass(frozen=True)
class Loglikelihood:
    logprob: float
    is_greedy: bool  # every continuation token was the argmax (lm-eval's second value)
    tokens: int


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
