"""Number answers, as the needle task scores them: which number the output gives each queried
name (a city, a key), `grade` strict per query, `substring_hits` the lenient public rule.

The output continues the prompt's "The magic number of <first city> is", so a
number written first, with no city named before it, answers the first city.
Beyond that, a number belongs to a city the output names next to it:

- before it: "Rome: 7654321", "for Rome it is 7654321", "Rome's is 7654321",
  "the magic number of Rome? 7654321";
- after it: "7654321 is the magic number of Rome", "7654321 for Rome",
  "7654321 (Rome)", "7654321 is Rome's", "7654321 - wait, that's Rome's";
- by order, in a sentence that lists cities and numbers as two lists
  ("The magic numbers of Paris and Rome are 1234567 and 7654321",
  "1234567 and 7654321 are Paris's and Rome's") or says "respectively"
  (with no city in the sentence, the order is the question's);
- a list of exactly R numbers and no city at all answers the R cities in the
  question's order, by their labels when each has one ("1st: 1234567, 2nd:
  7654321"); the list may say its order in words ("first 1234567, then
  7654321").

A city in parentheses names the number before it only when it stands there
alone ("7654321 (Rome)", "(for Rome)", "(Rome's)"): "3906417 (Kyoto: 5550123)"
is an aside about Kyoto. A number none of these rules places is one more
answer for the city being answered at that point (the last one a number was
placed with, the first city before any): "1234567 2345678 3456789" offers
three numbers for one city. A query offered several distinct numbers is wrong
and marked ambiguous, so a list of every needle number is never credited
whatever its order.

How a number is written (digit groups, other digit systems, footnote marks,
signs) is `digits.py`'s; a number of fewer than five digits is not an answer.
What the output takes back is `rejected.py`'s: a negated, contrasted
("not X but Y"), rejected or disowned number is no answer, and a queried city
the output says it does not know is not credited.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .digits import Item, normalise
from .digits import numbers as numbers  # read beside the attribution by the tests
from .rejected import OWNED_BY, answers, declined, without_contrasts

_TERMINATOR = re.compile(r"[.!?;](?=\s|$)|\n")
_LIST_GAP = re.compile(r"^\s*(?:,\s*)?(?:(?:and|&)\s+)?$", re.I)  # between two items of one list
# between the numbers of a bare list of answers: punctuation, "and", or the order in words ("then")
_BARE_GAP = re.compile(r"^[\s,;.&]*(?:(?:and\s+)?then\b|and\b|next\b|followed\s+by\b)?[\s,;.&]*$", re.I)
_BEFORE_GAP = re.compile(r"^[^.!?;]*\??\s*$")  # a city and the number after it: one sentence, or "Rome? 7654321"
_AFTER_GAP = re.compile(  # a number and the city named after it: "is the magic number of", "for"
    r"^\s*(?:,\s*which\s+)?(?:(?:is|was|being|would\s+be)\s+)?(?:the\s+|a\s+)?(?:(?:special|magic|secret)\s+)*"
    r"(?:number\s+)?(?:of|for|in|from|belongs\s+to)\s+$", re.I)
_PAREN_GAP = re.compile(r"^\s*\(\s*(?:for\s+|of\s+)?$", re.I)  # "7654321 (Rome)", "7654321 (for Rome)"
# after that city, for the parenthesis to name the number's city: its close, at most a comment before it
_PAREN_CLOSE = re.compile(r"^(?:'s)?(?:\s+(?:magic\s+)?number)?\s*(?:,[^():\d]*)?\)", re.I)
_ARROW_GAP = re.compile(r"^\s*(?:\u2192|->|=>|\u21d2)\s*$")  # "7654321 → Rome": the arrow points at the city
# the label of an answer given by position: "1st: 1234567", "second one = 7654321", "firstly, 1234567"
_ORDINAL_LABEL = re.compile(
    r"(?:\b(?P<digit>[1-9])(?:st|nd|rd|th)|\b(?P<word>first|second|third|fourth|fifth|sixth)(?:ly)?)\b"
    r"(?:\s+(?:one|city|query|question|number|answer))?\s*(?:[:=),\-\u2013\u2192]|\bis)?\s*$", re.I)
_ORDINAL_WORDS = ("first", "second", "third", "fourth", "fifth", "sixth")


@dataclass(frozen=True)
class Grade:
    """Per queried city: the distinct numbers the output offers for it, and the verdicts."""

    offered: tuple[tuple[str, ...], ...]
    hits: tuple[bool, ...]
    ambiguous: tuple[bool, ...]  # several distinct numbers offered for the query
    declined: tuple[bool, ...] = ()  # the output says it does not know the query's number


def city_pattern(cities: Sequence[str]) -> re.Pattern[str]:
    """Any of `cities` as a whole word, the longest first, case-insensitive."""
    return re.compile(r"\b(" + "|".join(re.escape(c) for c in sorted(set(cities), key=len, reverse=True))
                      + r")\b", re.I)


def items(text: str, cities: Sequence[str]) -> list[Item]:
    """The answers (`rejected.answers`) and the city names of `text`, in the order written."""
    canonical = {c.lower(): c for c in cities}
    named = [Item("city", canonical[m.group(1).lower()], m.start(), m.end())
             for m in city_pattern(cities).finditer(text)]
    return sorted(answers(text, cities) + named, key=lambda item: item.start)


def _sentences(text: str, found: list[Item]) -> list[tuple[list[int], str]]:
    """`found`'s indices grouped by sentence, with the sentence's text (a full stop inside a
    number does not end a sentence)."""
    spans = [(i.start, i.end) for i in found if i.kind == "number"]
    ends = [m.start() for m in _TERMINATOR.finditer(text) if not any(s <= m.start() < e for s, e in spans)]
    bounds = list(zip([0] + [e + 1 for e in ends], ends + [len(text)]))
    groups = []
    for start, end in bounds:
        inside = [i for i, item in enumerate(found) if start <= item.start < end]
        if inside:
            groups.append((inside, text[start:end]))
    return groups


def _is_list(text: str, found: list[Item], indices: list[int]) -> bool:
    return all(_LIST_GAP.match(text[found[a].end:found[b].start]) for a, b in zip(indices, indices[1:]))


def _ordered(text: str, found: list[Item], sentence: list[int], words: str, queried: Sequence[str]
             ) -> tuple[dict[int, str], list[int]]:
    """Numbers placed by order in one sentence, and the city mentions that placed them: two
    lists of equal length (cities then numbers, or numbers then cities), or equal counts with
    "respectively" (no city in the sentence: the question's order)."""
    cities = [i for i in sentence if found[i].kind == "city"]
    nums = [i for i in sentence if found[i].kind == "number"]
    if re.search(r"\brespectively\b", words, re.I) and len(nums) >= 2:
        if len(cities) == len(nums):
            return {n: found[c].value for n, c in zip(nums, cities)}, cities
        if not cities and len(nums) == len(queried):
            return dict(zip(nums, queried)), []
    kinds = [found[i].kind for i in sentence]
    k = len(cities)
    two_lists = k >= 2 and len(nums) == k and kinds in (["city"] * k + ["number"] * k, ["number"] * k + ["city"] * k)
    if two_lists and _is_list(text, found, cities) and _is_list(text, found, nums):
        return {n: found[c].value for n, c in zip(nums, cities)}, cities
    return {}, []


def _names_city_after(gap: str, after_city: str) -> bool:
    """Does the city after a number name it, given the text between them and the text after the city?"""
    if _PAREN_GAP.match(gap):
        return _PAREN_CLOSE.match(after_city) is not None
    return bool(_AFTER_GAP.match(gap) or _ARROW_GAP.match(gap) or (OWNED_BY.match(gap) and after_city[:2] == "'s"))


def _adjacent(text: str, found: list[Item], placed: dict[int, str], taken: set[int]) -> None:
    """Numbers placed by a city named right after them, then by one named before them."""
    for i, item in enumerate(found):
        if item.kind != "number" or i in placed or i + 1 >= len(found) or found[i + 1].kind != "city":
            continue
        if _names_city_after(text[item.end:found[i + 1].start], text[found[i + 1].end:]):
            placed[i] = found[i + 1].value
            taken.add(i + 1)  # a city that names the number before it is not also the next one's
    for i, item in enumerate(found):
        if item.kind != "number" or i in placed or i == 0 or found[i - 1].kind != "city" or i - 1 in taken:
            continue
        gap = text[found[i - 1].end:item.start]
        if _BEFORE_GAP.match(gap) and "\n\n" not in gap:
            placed[i] = found[i - 1].value


def attribute(text: str, queried: Sequence[str], cities: Sequence[str]) -> list[tuple[str, str]]:
    """(city, number) for every answer of a normalised `text`, in order (see the module's rules)."""
    found = items(text, [*cities, *queried])
    placed: dict[int, str] = {}
    taken: set[int] = set()
    for sentence, words in _sentences(text, found):
        by_order, used = _ordered(text, found, sentence, words, queried)
        placed.update(by_order)
        taken.update(used)
    _adjacent(text, found, placed, taken)
    nums = [i for i, item in enumerate(found) if item.kind == "number"]
    if not placed:
        placed = _by_ordinal(text, found, nums, queried)
    if not placed and _bare_list(text, found, nums, len(queried)):
        placed = dict(zip(nums, queried))  # exactly R answers and no city: the question's order
    current, pairs = queried[0], []
    for i in nums:
        current = placed.get(i, current)  # an unplaced number answers the city being answered
        pairs.append((current, found[i].value))
    return pairs


def _bare_list(text: str, found: list[Item], nums: list[int], queries: int) -> bool:
    """A list of exactly `queries` (at least two) numbers, no city named, nothing but
    punctuation, "and" or "then" between them ("1234567 or 2345678" is two answers for one city)."""
    return (2 <= len(nums) == queries and not any(item.kind == "city" for item in found)
            and all(_BARE_GAP.match(text[found[a].end:found[b].start]) for a, b in zip(nums, nums[1:])))


def _by_ordinal(text: str, found: list[Item], nums: list[int], queried: Sequence[str]) -> dict[int, str]:
    """Exactly R (at least two) numbers, no city named, each labelled by a distinct position
    1..R ("1st: 1234567, 2nd: 7654321"): each answers the queried city of its label."""
    if not 2 <= len(nums) == len(queried) or any(item.kind == "city" for item in found):
        return {}
    positions = []
    for k, i in enumerate(nums):
        label = _ORDINAL_LABEL.search(text[found[nums[k - 1]].end if k else 0:found[i].start])
        if label is None:
            return {}
        word = label.group("word")
        positions.append(_ORDINAL_WORDS.index(word.lower()) if word else int(label.group("digit")) - 1)
    if sorted(positions) != list(range(len(queried))):
        return {}
    return {i: queried[p] for i, p in zip(nums, positions)}


def grade(output: str, queried: Sequence[str], targets: Sequence[str], cities: Sequence[str]) -> Grade:
    """Each queried city is right when the output offers exactly one distinct number for it, the
    needle's, and does not say it does not know that city's number."""
    text = normalise(output)
    known = [*cities, *queried]
    unknown = declined(text, queried, city_pattern(known))  # read before "not ... but" is cut out
    pairs = attribute(without_contrasts(text, city_pattern(known)), queried, cities)
    offered = [tuple(dict.fromkeys(number for city, number in pairs if city == q)) for q in queried]
    hits = tuple(o == (t,) and not no for o, t, no in zip(offered, targets, unknown))
    return Grade(offered=tuple(offered), hits=hits, ambiguous=tuple(len(o) > 1 for o in offered), declined=unknown)


def substring_hits(output: str, targets: Sequence[str]) -> list[bool]:
    """The public needle code's rule: the needle's digits appear anywhere in the output, as a
    substring (so "12345678" and "-1234567" count, and "1,234,567" does not)."""
    return [target in output for target in targets]
