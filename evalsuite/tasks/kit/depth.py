"""An item at a depth measured in tokens: a haystack in two parts around it, each fitted to its
share of the budget, so that the item sits at a requested share of the haystack's tokens (not of
its sentence count). Other items sit at sentence boundaries at relative positions. Every candidate
prompt is tokenized whole; `ledger.place_at_depth` builds the same prompts from counts taken once,
and falls back on `fit_at_depth`.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from evalsuite.errors import UserError

from .fit import Fitted, fit_to_budget, fragment_of, insert_at_boundaries, used


@dataclass(frozen=True)
class Placement:
    prompt: str
    tokens: int
    haystack: tuple[str, ...]  # the haystack's pieces in order: sentences, fragments, needles
    answer: int  # index of the answer needle in `haystack`
    sentences: int  # whole filler sentences used
    # tokens of the prompt cut at some character offsets (trailing spaces cut), where known
    marks: Mapping[int, int] = dataclasses.field(default_factory=dict)


Render = Callable[[str], str]  # haystack text -> finished prompt
SLACK = (0, 1, 2, 4, 8, 16, 32)  # tokens given up before the needle when the parts overrun the budget


def fit_at_depth(target: int, depth: float, supply: list[str], needle: str, others: list[tuple[float, str]],
                 render: Render, count: Callable[[str], int]) -> Placement:
    """The longest prompt of at most `target` tokens whose haystack has `depth` of its tokens
    (the answer needle's own excluded, distractor needles and fragments included) before
    `needle`: a part fitted to that many tokens (whole sentences, then the tail of the next
    one), the needle, then a part that fills the rest of the budget. Distractors, given as
    (relative position in [0, 1), text), sit at sentence boundaries in the part their
    position falls in, or in the other part when theirs cannot hold them."""
    empty = count("")

    def text_tokens(text: str) -> int:
        return count(text) - empty

    filler = target - count(render(needle))  # the haystack's tokens besides the answer needle
    sizes = [text_tokens(text) for _, text in others]
    whole = " ".join(supply)
    ratio = text_tokens(whole) / max(1, len(whole))  # tokens per character: where to start searching
    failure = UserError(f"the prompt without any haystack is already longer than {target} tokens")
    for slack in SLACK:  # pieces counted apart add up to the whole only within a token or two
        share = max(0, round(depth * (filler - slack)))
        early, late = split_distractors(others, sizes, depth, share, filler - share)
        try:
            return _two_parts(target, share, supply, needle, (early, late), render, count,
                              lambda part, room: _estimate(part, ratio, room))
        except UserError as exc:
            failure = exc
    raise failure


def _estimate(supply: list[str], ratio: float, room: float) -> int:
    """How many sentences of `supply` about `room` tokens hold, at `ratio` tokens per character."""
    return bisect.bisect_right(list(itertools.accumulate((len(s) + 1) * ratio for s in supply)), room)


def _two_parts(target: int, share: int, supply: list[str], needle: str,
               distractors: tuple[list[tuple[float, str]], list[tuple[float, str]]],
               render: Render, count: Callable[[str], int], estimate: Callable[[list[str], float], int]
               ) -> Placement:
    """`share` tokens of haystack, the needle, then haystack up to `target` tokens of prompt."""
    early, late = distractors
    empty = count("")

    def size(texts: list[tuple[float, str]]) -> int:
        return count(" ".join(text for _, text in texts)) - empty if texts else 0

    def fit_before(tokens: int) -> Fitted:
        return fit_to_budget(tokens, supply, lambda whole, part: " ".join(_pieces(whole, part, early)),
                             lambda text: count(text) - empty, tolerance=0.0, hint=estimate(supply, tokens - size(early)))

    before = fit_before(share)
    if before.tokens < share:  # the nearest fit may lie above: the part after the needle absorbs it
        above = fit_before(2 * share - before.tokens)
        before = above if share - before.tokens > above.tokens - share else before
    head = _pieces(supply[: before.sentences], _fragment(supply, before), early)
    rest = supply[used(before):]

    def build(whole: list[str], part: str) -> str:
        return render(" ".join([*head, needle, *_pieces(whole, part, late)]))

    room = target - count(render(needle)) - before.tokens - size(late)  # short texts: cheap to count
    after = fit_to_budget(target, rest, build, count, tolerance=0.0, hint=estimate(rest, room))
    tail = _pieces(rest[: after.sentences], _fragment(rest, after), late)
    return Placement(after.prompt, after.tokens, (*head, needle, *tail), len(head), before.sentences + after.sentences)


def _fragment(supply: list[str], fitted: Fitted) -> str:
    return fragment_of(supply[fitted.sentences], fitted.extra_words) if fitted.extra_words else ""


def _pieces(whole: list[str], fragment: str, inserts: list[tuple[float, str]]) -> list[str]:
    """Sentences, then the fragment, with each (relative position, text) at the nearest boundary."""
    units = list(whole) + ([fragment] if fragment else [])
    return insert_at_boundaries(units, [(round(u * len(units)), text) for u, text in inserts])


def split_distractors(others: list[tuple[float, str]], sizes: list[int], depth: float, early_room: int, late_room: int
           ) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """Distractors before the answer needle (position below `depth`) and after it, positions
    made relative to their part; a part too small for its distractors hands the ones nearest
    the answer needle to the other part."""
    order = sorted(range(len(others)), key=lambda i: others[i][0])
    early = [i for i in order if others[i][0] < depth]
    late = [i for i in order if others[i][0] >= depth]
    while early and sum(sizes[i] for i in early) > early_room:
        late.insert(0, early.pop())
    while late and sum(sizes[i] for i in late) > late_room and sum(sizes[i] for i in early) + sizes[late[0]] <= early_room:
        early.append(late.pop(0))

    def relative(i: int, low: float, high: float) -> float:
        return min(1.0, max(0.0, (others[i][0] - low) / (high - low))) if high > low else 1.0

    return ([(relative(i, 0.0, depth), others[i][1]) for i in early],
            [(relative(i, depth, 1.0), others[i][1]) for i in late])
