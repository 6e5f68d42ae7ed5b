"""The scripted fake model: a real adapter with a byte tokenizer and no weights.

It lets tests drive the whole pipeline (runner, resume, reports) quickly and
with known answers. Behaviours, chosen as `fake:<behaviour>`:

    target    answers every request with its sample's target, which the runner tells it before
              asking (contracts.SCRIPTED_ANSWERS, which only this behaviour's class implements;
              requests never carry it): any task, built-in or plugin, can be shown end to end
              before a real model
    oracle    answers needle questions by reading the prompt (a needle test fixture)
    wrong     answers with a number that is never a needle's
    echo      repeats the last line of the prompt, one byte a token

Its tokens are bytes (plus a BOS in a count). Open answers stop at the first stop string (target's
are its targets whole); oracle and wrong answer a needle question whole, whatever its budget. A continuation is greedy when it
is what generation would answer after the context, and then it is the likeliest (-0.1), as a
real model's greedy continuation is: tests/test_backend_conformance.py holds it to that.

`-M delay=SECONDS` sleeps per request, so a test can kill a run mid-way.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalsuite.backends import checked_by_loading
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
    """The fake model with a behaviour from BEHAVIOURS: no capability beyond the adapter's own."""

    cuts_at_stop = True  # an open answer ends before its first stop string, as a model's does

    def __init__(self, behaviour: str, options: FakeOptions):
        self.behaviour = behaviour
        self.options = options
        self.name = f"fake-{behaviour}"
        self.max_context = options.max_context
        self.chat_template = options.chat_template

    @classmethod
    def from_options(cls, behaviour: str, raw: dict[str, str]) -> FakeModel:
        if behaviour not in BEHAVIOURS:
            raise unknown("fake model behaviour", behaviour, BEHAVIOURS)
        kind = ScriptedFakeModel if behaviour == "target" else FakeModel
        return kind(behaviour, build_params(FakeOptions, raw, flag="-M"))

    def fingerprint(self) -> dict[str, Any]:
        return {"backend": "fake", "name": self.name, "behaviour": self.behaviour, "max_context": self.max_context}

    def count_tokens(self, text: str) -> int:
        return len(text.encode("utf-8")) + 1  # bytes plus a BOS

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        if not self.chat_template:
            return user + assistant_prefix
        return f"<user>{user}</user><assistant>{assistant_prefix}"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return [self._reply(r) for r in requests]

    def _reply(self, request: GenerationRequest) -> str:
        time.sleep(self.options.delay)
        answer = self._answer(request)
        return _cut_at_stop(answer, request.stop) if self.cuts_at_stop and not request.choices else answer

    def _answer(self, request: GenerationRequest) -> str:
        text = request.prefix + request.prompt
        if request.choices:
            return request.choices[int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(request.choices)]
        if self.behaviour == "echo":
            return text.rstrip().splitlines()[-1][: request.max_new_tokens] if text.strip() else ""
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

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        if any(not r.continuation for r in requests):
            raise UserError("empty continuation")
        out = []
        for r in requests:
            if self._greedy(r):
                out.append(Loglikelihood(logprob=-0.1, is_greedy=True, tokens=len(r.continuation.encode())))
                continue
            # deterministic pseudo log-probabilities below the greedy one's: enough to exercise the plumbing
            digest = hashlib.sha256((r.prefix + r.context + "\x00" + r.continuation).encode()).digest()
            out.append(Loglikelihood(logprob=self._unlikely(digest), is_greedy=False, tokens=len(r.continuation.encode())))
        return out

    def _greedy(self, request: LoglikelihoodRequest) -> bool:
        """Whether generation after the context answers the continuation, byte for byte."""
        budget = len(request.continuation.encode())
        asked = GenerationRequest(prompt=request.context, prefix=request.prefix, max_new_tokens=budget)
        return self._answer(asked).encode()[:budget] == request.continuation.encode()

    def _unlikely(self, digest: bytes) -> float:
        return -1.0 - digest[0] / 32.0


class ScriptedFakeModel(FakeModel):
    """`fake:target`: answers with the targets it was told (contracts.SCRIPTED_ANSWERS)."""

    cuts_at_stop = False  # the target whole: it shows a task's plumbing, not a model's limits

    def __init__(self, behaviour: str, options: FakeOptions):
        super().__init__(behaviour, options)
        self._expected: dict[int, tuple[Any, tuple[str, ...]]] = {}  # id(request) -> (request, target)

    def expect(self, requests: Sequence[Any], targets: Sequence[tuple[str, ...]]) -> None:
        """SCRIPTED_ANSWERS: the targets of the requests of the next calls (those told before are forgotten)."""
        self._expected = {id(r): (r, tuple(t)) for r, t in zip(requests, targets, strict=True)}

    def _target(self, request: Any) -> tuple[str, ...]:
        """What `expect` said `request` (this very object) expects; nothing when it was not told."""
        told, target = self._expected.get(id(request), (None, ()))
        return target if told is request else ()

    def _answer(self, request: GenerationRequest) -> str:
        target = self._target(request)
        if request.choices:  # the choice that spells the target (choices may be shortened labels)
            matching = [c for c in request.choices if any(t.strip().startswith(c.strip()) for t in target)]
            return max(matching, key=len) if matching else request.choices[0]
        return " " + " ".join(target)

    def _greedy(self, request: LoglikelihoodRequest) -> bool:
        """The continuation that is a target is the likeliest, and greedy."""
        return _is_target(request, self._target(request))

    def _unlikely(self, digest: bytes) -> float:
        return -5.0


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Text up to the first stop string, as a model's answer ends there."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def _is_target(request: LoglikelihoodRequest, target: tuple[str, ...]) -> bool:
    return request.continuation.strip() in {t.strip() for t in target}


@checked_by_loading
def load(rest: str, options: Mapping[str, str], *, device: str = "cpu", batch_size: int = 8,
         label: str | None = None) -> FakeModel:
    """The `fake[:behaviour]` backend's loader (behaviour defaults to oracle)."""
    return FakeModel.from_options(rest or "oracle", dict(options))
