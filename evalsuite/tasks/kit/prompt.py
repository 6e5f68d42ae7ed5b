"""The long-context prompt builder: a haystack at an exact token length, an item at a depth measured
in tokens, other items at seeded sentence boundaries, an instruction before and a question after,
in the model's chat template when it has one.

    Layout(instruction).render(model, haystack, question, answer_prefix)   the text around a haystack
    Haystack.load(spec, field)       a task's haystack (prepare): the built-in filler or a text's sentences
    check_lengths(model, lengths, answer_budget)   refuse lengths the model cannot hold, before a run
    build_prompt(model, haystack, tokens=, depth=, item=, others=, render=, seed=)   -> Built

A prompt of `tokens` tokens is what the model holds minus the answer's new tokens. The depth is the
share of the haystack's other tokens (other items and sentence fragments included) before `item`,
and `Built.facts` are what a record keeps of it: prompt_tokens, haystack_sentences,
answer_boundary (haystack pieces before the item), answer_token (the item's first token),
haystack_tokens and measured_depth.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalsuite.contracts import ModelAdapter
from evalsuite.errors import UserError

from .depth import Placement
from .filler import TextHaystack, builtin_sentences, load_haystack
from .ledger import PieceTokens, Supply, gather_supply, place_at_depth


@dataclass(frozen=True)
class Layout:
    """The text around a haystack: "{instruction}\\n\\n{haystack}\\n\\n{question_label}{question}", then
    the answer's start: the assistant turn of a chat template, or "\\n{answer_label} {prefix}"."""

    instruction: str
    question_label: str = "Question: "
    answer_label: str = "Answer:"

    def render(self, model: ModelAdapter, haystack: str, question: str, answer_prefix: str = "") -> str:
        user = f"{self.instruction}\n\n{haystack}\n\n{self.question_label}{question}"
        if model.chat_template:
            return model.format_user_turn(user, answer_prefix)
        return f"{user}\n{self.answer_label}{' ' + answer_prefix if answer_prefix else ''}"


@dataclass(frozen=True)
class Haystack:
    """A task's haystack, loaded once per run by `prepare`: `text` None is the built-in filler. Per
    model, the token counts of its words are kept across samples (each word counted once a run)."""

    text: TextHaystack | None
    source: str = "builtin"
    word_tokens: dict[str, PieceTokens] = field(default_factory=dict)

    @classmethod
    def load(cls, spec: str, field: str = "text") -> Haystack:
        return cls(load_haystack(spec, field), spec)

    def tokens_for(self, model: ModelAdapter) -> PieceTokens:
        if model.name not in self.word_tokens:
            self.word_tokens[model.name] = PieceTokens(model.count_tokens)
        return self.word_tokens[model.name]

    def check(self, model: ModelAdapter, longest: int) -> None:
        """Refuse a text too short for the longest prompt, before anything runs."""
        if self.text is not None:
            available = model.count_tokens(" ".join(self.text.sentences))
            if available < longest:
                raise UserError(f"haystack {self.source} holds {available} tokens, too short for length {longest}")

    def sentences(self, rng: random.Random, tokens: int) -> Iterator[str]:
        """The stream a prompt of `tokens` tokens is cut from: the text's, or the built-in filler (a
        task's own haystack subclasses this to give its own filler, which may depend on `tokens`)."""
        return self.text.stream(rng) if self.text else builtin_sentences(rng)

    def supply(self, model: ModelAdapter, seed: int, tokens: int) -> Supply:
        """Sentences from a stream seeded by `seed`, counted, until they hold more than a prompt of
        `tokens` tokens can use (a fit reaches past its target by a sentence at most)."""
        stream = self.sentences(random.Random(seed), tokens)
        return gather_supply(stream, self.tokens_for(model), tokens * 1.02 + 256)


def check_lengths(model: ModelAdapter, lengths: Sequence[int], answer_budget: int) -> None:
    """Refuse, before a run, a length the model cannot hold or one with no room beside the answer."""
    if max(lengths) > model.max_context:
        raise UserError(f"length {max(lengths)} exceeds {model.name}'s maximum context of {model.max_context} "
                        "tokens (-M max_context=N overrides)")
    if min(lengths) <= answer_budget:
        raise UserError(f"length {min(lengths)} leaves no room for a prompt beside the answer budget of "
                        f"{answer_budget} tokens")


@dataclass(frozen=True)
class Built:
    prompt: str
    placement: Placement
    facts: dict[str, Any]  # for the record: see the module's docstring


def build_prompt(model: ModelAdapter, haystack: Haystack, *, tokens: int, depth: float, item: str,
                 others: Sequence[tuple[float, str]] = (), render: Callable[[str], str], seed: int) -> Built:
    """The longest prompt of at most `tokens` tokens (`render(haystack text)`, e.g. a Layout's) with
    `item` at `depth` of the haystack's tokens and each (relative position in [0, 1], text) of
    `others` at a sentence boundary; the haystack's sentences come from a stream seeded by `seed`."""
    supply = haystack.supply(model, seed, tokens)
    placed = place_at_depth(tokens, depth, supply, item, list(others), render, model.count_tokens)
    if placed.tokens < tokens - max(1.0, 0.01 * tokens):  # 1%, and a token at a seam on short prompts
        raise UserError(f"haystack {haystack.source} is too short to reach {tokens} tokens (got {placed.tokens})")
    facts = {"prompt_tokens": placed.tokens, "haystack_sentences": placed.sentences, "answer_boundary": placed.answer,
             **measured_depth(placed, model)}
    return Built(placed.prompt, placed, facts)


def measured_depth(placed: Placement, model: ModelAdapter) -> dict[str, Any]:
    """Where the item landed, in tokens: its offset in the prompt, and the share of the haystack's
    other tokens (other items and fragments included) that come before it. Counts of the prompt cut
    at the haystack's ends and around the item were mostly taken while it was built (`marks`)."""
    prompt, item = placed.prompt, placed.haystack[placed.answer]
    text = " ".join(placed.haystack)
    start = prompt.index(text)
    end = start + len(text)
    at = start + len(" ".join(placed.haystack[: placed.answer])) + (1 if placed.answer else 0)
    known: Mapping[int, int] = placed.marks

    def count(upto: int) -> int:  # a trailing space cut: it belongs to the next word's token
        return known[upto] if upto in known else model.count_tokens(prompt[:upto].rstrip(" "))

    before = count(at) - count(start)
    after = count(end) - count(at + len(item))
    return {"answer_token": count(at), "haystack_tokens": before + after,
            "measured_depth": round(before / max(1, before + after), 4)}
