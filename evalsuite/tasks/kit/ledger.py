"""Item placement at tokenizer speed: the prompts of `depth.fit_at_depth`, counted once.

`fit_at_depth` sizes a prompt by tokenizing every candidate whole, a dozen full-length
tokenizations per prompt. Here the haystack is counted once, word by word (each distinct
word tokenized once a run, after a full stop and a space, as it sits in a prompt), into
cumulative counts over its sentences, and a candidate's count is added up from its pieces:
tokenizers split text at the space before a word, so a prompt's count is the sum of its
words' plus its two seams (the text before the haystack meeting its first piece, its last
piece meeting the text after it), which are counted exactly on short texts. The search
takes the same decisions as `fit_at_depth`, on the same counts, so it lands on the same
prompt. The finished prompt is then tokenized once; should that count differ from the
added-up one (a tokenizer that merges across a space), the prompt is built the exact way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evalsuite.errors import UserError

from .depth import SLACK, Placement, Render, fit_at_depth, split_distractors
from .fit import bracket, fragment_of, insert_at_boundaries

ANCHOR = "."  # what a word follows when its tokens are counted: the full stop of a sentence
MARK = "HAYSTACKGOESHERE"  # stands for the haystack when the text around it is found


class PieceTokens:
    """Tokens text adds where it follows a full stop and a space, as the sum of its words':
    tokenizers split text at the space before a word, so each word is counted once, cached,
    and a sentence costs a few dictionary lookups instead of a call to the tokenizer."""

    def __init__(self, count: Callable[[str], int]):
        self.count = count
        self.anchor = count(ANCHOR)
        self.empty = count("")  # the special tokens every count includes
        self.words: dict[str, int] = {}

    def of(self, piece: str) -> int:
        words, total = self.words, 0
        for word in piece.split():
            tokens = words.get(word)
            if tokens is None:
                tokens = words[word] = self.count(f"{ANCHOR} {word}") - self.anchor
            total += tokens
        return total


@dataclass(frozen=True)
class Supply:
    """Haystack sentences with their cumulative token counts."""

    sentences: list[str]
    cumulative: list[int]  # cumulative[k]: tokens of sentences[:k]
    tokens: PieceTokens

    def between(self, start: int, end: int) -> int:
        return self.cumulative[end] - self.cumulative[start]


def gather_supply(stream: Iterable[str], tokens: PieceTokens, limit: float) -> Supply:
    """Sentences from `stream` until they hold more than `limit` tokens (or the stream ends)."""
    sentences: list[str] = []
    cumulative = [0]
    for sentence in stream:
        sentences.append(sentence)
        cumulative.append(cumulative[-1] + tokens.of(sentence))
        if cumulative[-1] > limit:
            break
    return Supply(sentences, cumulative, tokens)


class Frame:
    """The prompt around the haystack: `before` + haystack + `after`, and its seams' counts."""

    def __init__(self, before: str, after: str, tokens: PieceTokens):
        self.before, self.after, self.tokens, self.count = before, after, tokens, tokens.count
        self.closings: dict[str, int] = {}

    @classmethod
    def of(cls, render: Render, tokens: PieceTokens) -> Frame | None:
        """None when `render` does more than put text around the haystack."""
        before, *after = render(MARK).split(MARK)
        return cls(before, after[0], tokens) if len(after) == 1 else None

    def opening(self, first: str) -> int:
        """Tokens of the text before the haystack and its first piece."""
        return self.count(self.before + first)

    def closing(self, last: str) -> int:
        """Tokens the text after the haystack adds behind its last piece (only its last word
        meets that text, so the count is kept per last word)."""
        word = last.split()[-1] if last.strip() else last
        if word not in self.closings:
            alone = self.tokens.anchor + self.tokens.of(word)  # the count of f"{ANCHOR} {word}"
            self.closings[word] = self.count(f"{ANCHOR} {word}{self.after}") - alone
        return self.closings[word]


@dataclass(frozen=True)
class Part:
    """A run of the supply (from sentence `start`) with distractors at relative positions."""

    supply: Supply
    start: int
    inserts: list[tuple[float, str]]

    def units(self, k: int, words: int) -> list[str]:
        fragment = fragment_of(self.supply.sentences[self.start + k], words) if words else ""
        return self.supply.sentences[self.start:self.start + k] + ([fragment] if fragment else [])

    def pieces(self, k: int, words: int) -> list[str]:
        return self._ordered(self.units(k, words))

    def _ordered(self, units: list[str]) -> list[str]:
        return insert_at_boundaries(units, [(round(u * len(units)), text) for u, text in self.inserts])

    def tokens(self, k: int, words: int) -> int:
        """Tokens of all its pieces, each as it counts after a full stop and a space."""
        pieces = self.supply.tokens
        fragment = pieces.of(fragment_of(self.supply.sentences[self.start + k], words)) if words else 0
        return self.supply.between(self.start, self.start + k) + fragment + sum(pieces.of(t) for _, t in self.inserts)

    def ends(self, k: int, words: int) -> tuple[str, str] | None:
        """Its first and last pieces (None when it has none), as `pieces` orders them."""
        units = k + (1 if words else 0)
        order = sorted((round(u * units), i) for i, (u, _) in enumerate(self.inserts))
        if not units:
            return (self.inserts[order[0][1]][1], self.inserts[order[-1][1]][1]) if order else None
        sentences = self.supply.sentences
        fragment = fragment_of(sentences[self.start + k], words) if words else ""
        first = self.inserts[order[0][1]][1] if order and order[0][0] == 0 else (
            sentences[self.start] if k else fragment)
        last = self.inserts[order[-1][1]][1] if order and order[-1][0] >= units else (
            fragment or sentences[self.start + k - 1])
        return first, last


@dataclass(frozen=True)
class Fit:
    sentences: int
    words: int
    tokens: int


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest k in [low, high] with fits(k), given fits(low) and fits falling with k."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _largest_near(fits: Callable[[int], bool], roughly_fits: Callable[[int], bool], high: int) -> int:
    """The largest k in [0, high] with fits(k), given fits(0) and fits falling with k: found
    with `roughly_fits`, a cheaper test off by a token or two, then settled with `fits` in
    steps doubling away from that (two tests of `fits` when the rough answer is right)."""
    lo, hi = bracket(fits, high, _largest(roughly_fits, 0, high) if roughly_fits(0) else 0)
    return _largest(fits, lo, hi)


def fit_part(target: int, part: Part, total: Callable[[int, int], int],
             rough: Callable[[int, int], int] | None = None) -> Fit:
    """What `fit.fit_to_budget` (tolerance 0) finds, on counts from `total(k, words)`:
    the most whole sentences of `part`, then the most words of the next one, within `target`.
    `rough`: counts off by a token or two, cheaper than `total`'s, to search with."""
    if total(0, 0) > target:
        raise UserError(f"the prompt without any haystack is already longer than {target} tokens")
    rough = rough or total
    size = len(part.supply.sentences) - part.start
    k = _largest_near(lambda k: total(k, 0) <= target, lambda k: rough(k, 0) <= target, size)
    tokens, words = total(k, 0), 0
    if target - tokens > 0 and k < size:
        longest = len(part.supply.sentences[part.start + k].split()) - 1
        w = _largest_near(lambda w: total(k, w) <= target, lambda w: rough(k, w) <= target, longest)
        if w:
            tokens, words = total(k, w), w
    return Fit(k, words, tokens)


def place_at_depth(target: int, depth: float, supply: Supply, needle: str, others: list[tuple[float, str]],
                   render: Render, count: Callable[[str], int]) -> Placement:
    """`depth.fit_at_depth`'s prompt for the same arguments (`supply.sentences` as its
    supply), its count checked by one tokenization of the finished prompt."""
    frame = Frame.of(render, supply.tokens)
    placed = _place(target, depth, supply, needle, others, render, frame) if frame else None
    if placed is None or count(placed.prompt) != placed.tokens:
        return fit_at_depth(target, depth, supply.sentences, needle, others, render, count)
    return placed


def _place(target: int, depth: float, supply: Supply, needle: str, others: list[tuple[float, str]],
           render: Render, frame: Frame) -> Placement | None:
    count, empty = frame.count, supply.tokens.empty
    filler = target - count(frame.before + needle + frame.after)  # render(needle), checked with the prompt
    sizes = [count(text) - empty for _, text in others]
    failure = UserError(f"the prompt without any haystack is already longer than {target} tokens")
    for slack in SLACK:  # as in fit_at_depth: pieces counted apart add up only within a token or two
        share = max(0, round(depth * (filler - slack)))
        early, late = split_distractors(others, sizes, depth, share, filler - share)
        try:
            return _two_parts(target, share, supply, needle, (early, late), render, frame)
        except UserError as exc:
            failure = exc
    raise failure


def _two_parts(target: int, share: int, supply: Supply, needle: str,
               distractors: tuple[list[tuple[float, str]], list[tuple[float, str]]],
               render: Render, frame: Frame) -> Placement | None:
    """fit_at_depth's two parts around the needle, on added-up counts; None when the text
    around the haystack is not what `render` makes of it."""
    early, late = distractors
    count, tokens = frame.count, supply.tokens
    empty = tokens.empty
    alone_first: dict[str, int] = {}
    lead = Part(supply, 0, early)

    def alone(k: int, words: int) -> int:  # the part's text on its own, as fit_at_depth counts it
        ends = lead.ends(k, words)
        if ends is None:
            return 0
        if ends[0] not in alone_first:
            alone_first[ends[0]] = count(ends[0]) - empty - tokens.of(ends[0])
        return alone_first[ends[0]] + lead.tokens(k, words)

    before = fit_part(share, lead, alone)
    if before.tokens < share:  # as fit_at_depth: the nearest fit may lie above
        above = fit_part(2 * share - before.tokens, lead, alone)
        before = above if share - before.tokens > above.tokens - share else before
    head = lead.pieces(before.sentences, before.words)
    trail = Part(supply, before.sentences + (1 if before.words else 0), late)
    first = head[0] if head else needle
    # tokens of the prompt up to the end of the head and of the needle
    to_head = frame.opening(first) - tokens.of(first) + (lead.tokens(before.sentences, before.words) if head else 0)
    to_needle = to_head + tokens.of(needle)

    def whole(k: int, words: int) -> int:
        ends = trail.ends(k, words)
        return to_needle + trail.tokens(k, words) + frame.closing(needle if ends is None else ends[1])

    def rough(k: int, words: int) -> int:  # the needle's closing for every last piece: one count
        return to_needle + trail.tokens(k, words) + frame.closing(needle)

    after = fit_part(target, trail, whole, rough)
    haystack = (*head, needle, *trail.pieces(after.sentences, after.words))
    text = " ".join(haystack)
    prompt = render(text)
    if prompt != frame.before + text + frame.after:
        return None
    at = len(frame.before) + (len(" ".join(head)) + 1 if head else 0)
    marks = {len(frame.before): count(frame.before.rstrip(" ")), at + len(needle): to_needle,
             len(frame.before) + len(text): to_needle + trail.tokens(after.sentences, after.words)}
    marks[at] = to_head if head else marks[len(frame.before)]
    return Placement(prompt, after.tokens, haystack, len(head), before.sentences + after.sentences, marks)
