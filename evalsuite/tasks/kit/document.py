"""Fitting a long document into the model's context: only the document is cut, on whole
words (by default in the middle, keeping its start and end), measured in the model's own
tokens, so the instruction and the question always stay whole."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evalsuite.errors import UserError

CUT_MARK = " [...] "


@dataclass(frozen=True)
class Fitted:
    prompt: str
    tokens: int  # prompt tokens, as the model counts them
    cut_tokens: int  # tokens the cut removed from the prompt (0 when the document fits)
    keep: tuple[int, int]  # words kept from the start and from the end of the document
    words: int  # words in the whole document


def _words(document: str) -> list[str]:
    return re.findall(r"\S+\s*", document)


def kept_document(document: str, keep: Sequence[int]) -> str:
    """The document as the model saw it: the first keep[0] and last keep[1] words."""
    return _kept(document, _words(document), keep)


def _kept(document: str, words: list[str], keep: Sequence[int]) -> str:
    head, tail = keep
    if head + tail >= len(words):
        return document
    text = "".join(words[:head]).rstrip()
    return text + CUT_MARK + "".join(words[len(words) - tail :]).rstrip() if tail else text


def fit_document(document: str, render: Callable[[str], str], count_tokens: Callable[[str], int],
                 budget: int, mode: str = "middle") -> Fitted:
    """The prompt with as much of the document as fits in `budget` tokens. Only the document
    is cut (a search on whole words): the instruction and question always stay whole."""
    words = _words(document)
    full = render(document)
    full_tokens = count_tokens(full)
    if full_tokens <= budget:
        return Fitted(full, full_tokens, 0, (len(words), 0), len(words))

    def keep_for(k: int) -> tuple[int, int]:
        return (k, 0) if mode == "end" else ((k + 1) // 2, k // 2)

    counted: dict[int, int] = {}

    def tokens_for(k: int) -> int:
        if k not in counted:
            counted[k] = count_tokens(render(_kept(document, words, keep_for(k))))
        return counted[k]

    if tokens_for(0) > budget:
        raise UserError(f"the instruction and question alone take {tokens_for(0)} tokens, more than the "
                        f"{budget} the model's context leaves after the answer's new tokens")
    low = largest_fitting(tokens_for, budget, (0, tokens_for(0)), (len(words), full_tokens))
    prompt, tokens = render(_kept(document, words, keep_for(low))), tokens_for(low)
    return Fitted(prompt, tokens, full_tokens - tokens, keep_for(low), len(words))


def largest_fitting(tokens_for: Callable[[int], int], budget: int, fits: tuple[int, int],
                    overflows: tuple[int, int]) -> int:
    """The largest k with tokens_for(k) <= budget, between `fits` and `overflows` (each a
    (k, tokens) pair, tokens rising with k): the same k a binary search finds, in fewer counts
    of the long prompt. Each guess is where the line through the two bounds crosses the
    budget (tokens grow almost in step with words); when a guess fails to halve the range,
    the next one is its middle, so the search never takes more than twice a bisection's steps."""
    (low, low_tokens), (high, high_tokens) = fits, overflows
    halve = False
    while high - low > 1:
        if halve:
            guess = (low + high) // 2
        else:
            guess = low + (budget - low_tokens) * (high - low) // max(1, high_tokens - low_tokens)
            guess = min(max(guess, low + 1), high - 1)
        width = high - low
        tokens = tokens_for(guess)
        if tokens <= budget:
            low, low_tokens = guess, tokens
        else:
            high, high_tokens = guess, tokens
        halve = not halve and high - low > width // 2
    return low
