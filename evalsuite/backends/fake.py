"""The scripted fake model: a real adapter with a byte tokenizer and no weights.

It lets tests drive the whole pipeline (runner, resume, reports) quickly and
with known answers. Behaviours, chosen as `fake:<behaviour>`:

    target    answers every request with its sample's target, which the runner tells it before
              asking (contracts.SCRIPTED_ANSWERS; requests never carry it): any task, built-in
              or plugin, can be shown end to end before a real model
    oracle    answers needle questions by reading the prompt (a needle test fixture)
    wrong     answers with a number that is never a needle's
    echo      repeats the last line of the prompt

`-M delay=SECONDS` sleeps per request, so a test can kill a run mid-way.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalsuite.contracts import SCRIPTED_ANSWERS
from evalsuite.errors import UserError, unknown
from evalsuite.params import build_params
from evalsuite.types import GenerationRequest, Loglikelihood, LoglikelihoodRequest

BEHAVIOURS = ("target", "oracle", "wrong", "echo")


@dataclass(frozen=True)
class FakeOptions:
    name = "fake model"
    delay: float = 0.0
    max_context: int = 1 << 20
    chat_template: bool = False


class FakeModel:
    def __init__(self, behaviour: str, options: FakeOptions):
        self.behaviour = behaviour
        self.options = options
        self.name = f"fake-{behaviour}"
        self.max_context = options.max_context
        self.chat_template = options.chat_template
        self.capabilities = frozenset({SCRIPTED_ANSWERS}) if behaviour == "target" else frozenset[str]()
        self._expected: dict[int, tuple[Any, tuple[str, ...]]] = {}  # id(request) -> (request, target)

    @classmethod
    def from_options(cls, behaviour: str, raw: dict[str, str]) -> FakeModel:
        if behaviour not in BEHAVIOURS:
            raise unknown("fake model behaviour", behaviour, BEHAVIOURS)
        return cls(behaviour, build_params(FakeOptions, raw, flag="-M"))

    def fingerprint(self) -> dict[str, Any]:
        return {"backend": "fake", "name": self.name, "behaviour": self.behaviour, "max_context": self.max_context}

    def count_tokens(self, text: str) -> int:
        return len(text.encode("utf-8")) + 1  # bytes plus a BOS

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        if not self.chat_template:
            return user + assistant_prefix
        return f"<user>{user}</user><assistant>{assistant_prefix}"

    def expect(self, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
        """SCRIPTED_ANSWERS: the targets of the requests of the next calls (those told before are forgotten)."""
        self._expected = {id(r): (r, tuple(t)) for r, t in zip(requests, targets, strict=True)}

    def _target(self, request: Any) -> tuple[str, ...]:
        """What `expect` said `request` (this very object) expects; nothing when it was not told."""
        told, target = self._expected.get(id(request), (None, ()))
        return target if told is request else ()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerationRequest) -> str:
        time.sleep(self.options.delay)
        text = request.prefix + request.prompt
        if self.behaviour == "target":
            return self._target_answer(request, self._target(request))
        if request.choices:
            return request.choices[int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(request.choices)]
        if self.behaviour == "echo":
            return text.rstrip().splitlines()[-1][: request.max_new_tokens]
        asked = re.findall(r"magic numbers? of ([A-Z][a-z]+(?:(?:, | and )[A-Z][a-z]+)*)\?", text)
        cities = re.split(r", | and ", asked[-1]) if asked else []
        numbers = dict(re.findall(r"The magic number of ([A-Z][a-z]+) is (\d+)\.", text))
        if self.behaviour == "wrong":
            return " 1. " * len(cities)
        if not cities:
            return ""
        # the prompt already says "The magic number of <first city> is"
        parts = [numbers.get(cities[0], "0")]
        parts += [f"The magic number of {c} is {numbers.get(c, '0')}" for c in cities[1:]]
        return " " + ". ".join(parts) + "."

    @staticmethod
    def _target_answer(request: GenerationRequest, target: tuple[str, ...]) -> str:
        if request.choices:  # the choice that spells the target (choices may be shortened labels)
            matching = [c for c in request.choices if any(t.strip().startswith(c.strip()) for t in target)]
            return max(matching, key=len) if matching else request.choices[0]
        return " " + " ".join(target)

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        if any(not r.continuation for r in requests):
            raise UserError("empty continuation")
        if self.behaviour == "target":  # the continuation that is a target is the likeliest, and greedy
            hits = [_is_target(r, self._target(r)) for r in requests]
            return [Loglikelihood(logprob=-0.1 if hit else -5.0, is_greedy=hit, tokens=len(r.continuation.encode()))
                    for r, hit in zip(requests, hits)]
        # deterministic pseudo log-probabilities: enough to exercise the plumbing
        out = []
        for r in requests:
            digest = hashlib.sha256((r.prefix + r.context + "\x00" + r.continuation).encode()).digest()
            out.append(Loglikelihood(logprob=-1.0 - digest[0] / 32.0, is_greedy=digest[1] % 2 == 0,
                                     tokens=len(r.continuation.encode())))
        return out


def _is_target(request: LoglikelihoodRequest, target: tuple[str, ...]) -> bool:
    return request.continuation.strip() in {t.strip() for t in target}


def load(rest: str, options: Mapping[str, str], *, device: str = "cpu", batch_size: int = 8,
         label: str | None = None) -> FakeModel:
    """The `fake[:behaviour]` backend's loader (behaviour defaults to oracle)."""
    return FakeModel.from_options(rest or "oracle", dict(options))
