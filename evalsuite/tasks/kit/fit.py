"""Fitting a haystack to a token budget: the most whole sentences (then words of the next one)
that keep a finished prompt, template and special tokens included, within a token count as the
model's own tokenizer measures it. Every candidate prompt is tokenized whole.

    fit_to_budget(target, supply, build, count)   the longest prompt of at most `target` tokens
    insert_at_boundaries(sentences, inserts)      texts inserted before given sentences
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from evalsuite.errors import UserError


@dataclass(frozen=True)
class Fitted:
    prompt: str
    tokens: int
    sentences: int  # whole sentences used
    extra_words: int  # words of the next sentence appended to close the gap


Builder = Callable[[list[str], str], str]  # (whole sentences, trailing fragment) -> finished prompt


def fit_to_budget(
    target: int,
    supply: list[str],
    build: Builder,
    count: Callable[[str], int],
    tolerance: float = 0.01,
    hint: int | None = None,
) -> Fitted:
    """The longest prompt from `supply` whose token count does not exceed `target`.

    Search over whole sentences (starting from `hint`, an estimate of their number, when
    given: a good one costs two counts instead of a dozen at 64K), then over the words of
    the next sentence when the gap is still above `tolerance` (a fraction of `target`).
    """
    seen: dict[tuple[int, int], tuple[str, int]] = {}

    def tokens_with(k: int, words: int = 0) -> tuple[str, int]:
        if (k, words) not in seen:
            prompt = build(list(supply[:k]), fragment_of(supply[k], words) if words else "")
            seen[k, words] = prompt, count(prompt)
        return seen[k, words]

    if tokens_with(0)[1] > target:
        raise UserError(f"the prompt without any haystack is already longer than {target} tokens")
    lo, hi = bracket(lambda k: tokens_with(k)[1] <= target, len(supply), hint)
    while lo < hi:  # invariant: sentences lo fit, the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        if tokens_with(mid)[1] <= target:
            lo = mid
        else:
            hi = mid - 1
    prompt, tokens = tokens_with(lo)
    words = 0
    if target - tokens > tolerance * target and lo < len(supply):
        size = len(supply[lo].split()) - 1
        whole_next = seen.get((lo + 1, 0))  # usually counted already: it tells a word's tokens
        guess = None if whole_next is None else (target - tokens) * (size + 1) // max(1, whole_next[1] - tokens)
        w_lo, w_hi = bracket(lambda w: tokens_with(lo, w)[1] <= target, size, guess)
        while w_lo < w_hi:
            mid = (w_lo + w_hi + 1) // 2
            if tokens_with(lo, mid)[1] <= target:
                w_lo = mid
            else:
                w_hi = mid - 1
        if w_lo:
            words = w_lo
            prompt, tokens = tokens_with(lo, words)
    return Fitted(prompt=prompt, tokens=tokens, sentences=lo, extra_words=words)


def bracket(fits: Callable[[int], bool], size: int, hint: int | None) -> tuple[int, int]:
    """(lo, hi) with fits(lo) and the largest k that fits in [lo, hi]: steps doubling away from
    `hint` (0 fits already; without a hint, the whole range)."""
    if hint is None:
        return 0, size
    at = min(max(hint, 0), size)
    step = 1
    if fits(at):
        while at + step <= size and fits(at + step):
            at, step = at + step, step * 2
        return at, min(size, at + step - 1)
    while at - step > 0 and not fits(at - step):
        at, step = at - step, step * 2
    return max(0, at - step), at - 1


def fragment_of(sentence: str, words: int) -> str:
    """The last `words` words of `sentence`: a sentence's tail keeps its full stop, so a needle
    placed after a fragment still starts a sentence."""
    return " ".join(sentence.split()[-words:]) if words else ""


def used(fitted: Fitted) -> int:
    """How many sentences of the supply a fit consumed (a fragment's sentence included)."""
    return fitted.sentences + (1 if fitted.extra_words else 0)


def insert_at_boundaries(sentences: list[str], inserts: list[tuple[int, str]]) -> list[str]:
    """Sentences with each (boundary, text) inserted before sentence `boundary`
    (boundary == len(sentences) appends); ties keep the order given."""
    out: list[str] = []
    ordered = sorted(enumerate(inserts), key=lambda item: (item[1][0], item[0]))
    j = 0
    for i, sentence in enumerate(sentences):
        while j < len(ordered) and ordered[j][1][0] <= i:
            out.append(ordered[j][1][1])
            j += 1
        out.append(sentence)
    out.extend(text for _, (_, text) in ordered[j:])
    return out
