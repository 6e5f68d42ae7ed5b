"""Number answers, as the needle task scores them: which number the output gives each queried
name (a city, a key), `grade` strict per query, `substring_hits` the lenient public rule.

The output continues the prompt's "The magic number of <first city> is", so a
number written first, with no city named before it, answers the first city.
Beyond that, a number belongs to a city the output names next to it:

- before it: "Rome: 7654321", "for Rome it is 7654321", "Rome's is 7654321",
  "the magic number of Rome? 7654321";
- after it: "7654321 is the magic number of Rome", "7654321 for Rome",
  "7654321 (Rome)", "7654321 is Rome's";
- by order, in a sentence that lists cities and numbers as two lists
  ("The magic numbers of Paris and Rome are 1234567 and 7654321",
  "1234567 and 7654321 are Paris's and Rome's") or says "respectively"
  (with no city in the sentence, the order is the question's);
- a list of exactly R numbers and no city at all answers the R cities in the
  question's order.

A number none of these rules places is one more answer for the city being
answered at that point (the last one a number was placed with, the first city
before any): "1234567 2345678 3456789" offers three numbers for one city. A
query offered several distinct numbers is wrong and marked ambiguous, so a
list of every needle number is never credited whatever its order.

Numbers written in order with ordinal labels and no city ("1st: 1234567,
2nd: 7654321") answer the queried cities by their labels; "1234567 → Rome"
names the city after the number.

Numbers are read after normalisation: NFKC (fullwidth digits, no-break
spaces), every decimal digit as its ASCII digit (Arabic-Indic, Devanagari),
the typographic apostrophe and the Arabic separators as their ASCII
counterparts, accents dropped so that "Zürich" names Zurich, and five or more
digit words in a row ("four eight three one nine zero two") as digits. Digit
groups are joined: "1,234,567", "1 234 567", "1.234.567", "1'234'567",
"123-4567", the Indian "12,34,567" and digits one by one ("1 2 3 4 5 6 7")
all read 1234567. A minus sign written against the digits ("-1234567") makes
a different number, as does a decimal part. A number of fewer than five digits
is not an answer (a count, a paragraph number): it is ignored. Numbers after
"not", "rather than" or "instead of", or followed by "is not it", "is wrong"
and the like, are rejected candidates and ignored too.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

MIN_DIGITS = 5  # the needles have 7 digits; shorter numbers are counts and references, not answers
# digit runs joined by one repeated separator character; whether they form one number is decided below
_RUN = re.compile(r"\d+(?:([ ,.'_-])\d+(?:\1\d+)*)?")
_MINUS = "-\u2212"
_SIGN_BEFORE = " \t\n(:=[,"  # what may precede a minus sign that belongs to the number
_NEGATED = re.compile(r"(?:\bnot|\bisn't|\brather than|\binstead of|\bnever)\s*(?:the\s+number\s+)?$", re.I)
_TERMINATOR = re.compile(r"[.!?;](?=\s|$)|\n")
_LIST_GAP = re.compile(r"^\s*(?:,\s*)?(?:(?:and|&)\s+)?$", re.I)  # between two items of one list
_BARE_GAP = re.compile(r"^[\s,;.&]*(?:and\b)?[\s,;.&]*$", re.I)  # between numbers of a bare list of answers
_BEFORE_GAP = re.compile(r"^[^.!?;]*\??\s*$")  # a city and the number after it: one sentence, or "Rome? 7654321"
_AFTER_GAP = re.compile(  # a number and the city named after it: "is the magic number of", "for", "("
    r"^\s*(?:,\s*which\s+)?(?:(?:is|was|being|would\s+be)\s+)?(?:the\s+|a\s+)?(?:(?:special|magic|secret)\s+)*"
    r"(?:number\s+)?(?:of|for|in|from|belongs\s+to)\s+$|^\s*\(\s*(?:for\s+|of\s+)?$",
    re.I,
)
_POSSESSIVE_GAP = re.compile(r"^\s*(?:,\s*which\s+)?(?:is|was)\s+$", re.I)  # "7654321 is Rome's"
_ARROW_GAP = re.compile(r"^\s*(?:\u2192|->|=>|\u21d2)\s*$")  # "7654321 → Rome": the arrow points at the city
# a number the output itself rejects after writing it: "7209415 is not it; the answer is 4831902"
_REJECTED_AFTER = re.compile(
    r"^\s*(?:(?:is|was)\s*(?:not|n't)\s+(?:it|right|correct|the\s+(?:right\s+|correct\s+)?(?:answer|one))\b"
    r"|(?:is|was)\s+(?:wrong|incorrect)\b)", re.I)
# the label of an answer given by position: "1st: 1234567", "second one = 7654321"
_ORDINAL_LABEL = re.compile(
    r"(?:\b(?P<digit>[1-9])(?:st|nd|rd|th)|\b(?P<word>first|second|third|fourth|fifth|sixth))\b"
    r"(?:\s+(?:one|city|query|question|number|answer))?\s*(?:[:=)\-\u2013\u2192]|\bis)?\s*$", re.I)
_ORDINAL_WORDS = ("first", "second", "third", "fourth", "fifth", "sixth")
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# five or more digit words in a row write a number digit by digit; fewer are counts ("one or two")
_WORD = "(?:" + "|".join(_DIGIT_WORDS) + ")"
_SPELLED = re.compile(rf"\b{_WORD}(?:[\s,-]+{_WORD}){{{MIN_DIGITS - 1},}}\b", re.I)
# separators NFKC leaves alone: the typographic apostrophe (Swiss grouping), the Arabic thousands and decimal signs
_SEPARATORS = str.maketrans({"\u2019": "'", "\u066c": ",", "\u066b": "."})


@dataclass(frozen=True)
class Item:
    """A number or a city name found in the normalised output."""

    kind: str  # "number" or "city"
    value: str  # the number's digits (with "-" and a decimal part when written), or the city
    start: int
    end: int


@dataclass(frozen=True)
class Grade:
    """Per queried city: the distinct numbers the output offers for it, and the verdicts."""

    offered: tuple[tuple[str, ...], ...]
    hits: tuple[bool, ...]
    ambiguous: tuple[bool, ...]  # several distinct numbers offered for the query


def normalise(text: str) -> str:
    """NFKC (fullwidth digits, no-break and thin spaces become plain ones), every decimal digit
    as ASCII, ASCII separators, accents dropped and spelled-out digit runs as digits."""
    text = unicodedata.normalize("NFKC", text).translate(_SEPARATORS)
    text = "".join(str(unicodedata.decimal(c)) if not c.isascii() and c.isdecimal() else c for c in text)
    # the city list is written without accents; a model writing "Zürich" names the same city
    bare = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = unicodedata.normalize("NFC", bare)
    return _SPELLED.sub(_spelled_digits, text)


def _spelled_digits(match: re.Match[str]) -> str:
    return "".join(str(_DIGIT_WORDS.index(w.lower())) for w in re.findall(r"[a-z]+", match.group(0), re.I))


def _grouped(runs: list[str], separator: str) -> bool:
    """Do digit runs joined by `separator` write one number? Thousands groups (1,234,567;
    1 234 567; 1.234.567; 1'234'567), Indian groups (12,34,567), short groups (123-4567,
    12 34 567) or digits one by one (1 2 3 4 5 6 7)."""
    thousands = 1 <= len(runs[0]) <= 3 and all(len(r) == 3 for r in runs[1:]) and separator != "-"
    indian = (separator == "," and len(runs) >= 3 and 1 <= len(runs[0]) <= 2
              and all(len(r) == 2 for r in runs[1:-1]) and len(runs[-1]) == 3)
    short = separator in " -" and all(2 <= len(r) <= 4 for r in runs)
    one_by_one = separator in " -" and len(runs) >= MIN_DIGITS and all(len(r) == 1 for r in runs)
    return thousands or indian or short or one_by_one


def numbers(text: str) -> list[Item]:
    """The numbers of a normalised text in order, digit groups joined, with their sign."""
    found = []
    for match in _RUN.finditer(text):
        separator = match.group(1)
        runs = match.group(0).split(separator) if separator else [match.group(0)]
        if separator and not _grouped(runs, separator):
            if separator == "." and len(runs) == 2:  # a decimal: 1234567.5 is not 1234567
                found.append(_signed(text, match.start(), match.end(), match.group(0)))
                continue
            at = match.start()  # separate numbers that merely sit close: "1234567 2345678"
            for run in runs:
                found.append(_signed(text, at, at + len(run), run))
                at += len(run) + 1
            continue
        found.append(_signed(text, match.start(), match.end(), "".join(runs)))
    return found


def _signed(text: str, start: int, end: int, digits: str) -> Item:
    """A minus written against the digits, after a space or punctuation, makes the number negative."""
    negative = start >= 1 and text[start - 1] in _MINUS and (start == 1 or text[start - 2] in _SIGN_BEFORE)
    if negative:
        return Item("number", "-" + digits, start - 1, end)
    return Item("number", digits, start, end)


def items(text: str, cities: Sequence[str]) -> list[Item]:
    """Answer-sized numbers (not negated) and city names, in the order written."""
    kept = [n for n in numbers(text)
            if len(n.value.lstrip("-").split(".")[0]) >= MIN_DIGITS and not _NEGATED.search(text[: n.start])
            and not _REJECTED_AFTER.match(text[n.end:])]
    pattern = re.compile(r"\b(" + "|".join(re.escape(c) for c in sorted(set(cities), key=len, reverse=True))
                         + r")\b", re.I)
    canonical = {c.lower(): c for c in cities}
    named = [Item("city", canonical[m.group(1).lower()], m.start(), m.end()) for m in pattern.finditer(text)]
    return sorted(kept + named, key=lambda item: item.start)


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


def _adjacent(text: str, found: list[Item], placed: dict[int, str], taken: set[int]) -> None:
    """Numbers placed by a city named right after them, then by one named before them."""
    for i, item in enumerate(found):
        if item.kind != "number" or i in placed or i + 1 >= len(found) or found[i + 1].kind != "city":
            continue
        gap, rest = text[item.end:found[i + 1].start], text[found[i + 1].end:found[i + 1].end + 2]
        if _AFTER_GAP.match(gap) or _ARROW_GAP.match(gap) or (_POSSESSIVE_GAP.match(gap) and rest == "'s"):
            placed[i] = found[i + 1].value
            taken.add(i + 1)  # a city that names the number before it is not also the next one's
    for i, item in enumerate(found):
        if item.kind != "number" or i in placed or i == 0 or found[i - 1].kind != "city" or i - 1 in taken:
            continue
        gap = text[found[i - 1].end:item.start]
        if _BEFORE_GAP.match(gap) and "\n\n" not in gap:
            placed[i] = found[i - 1].value


def attribute(output: str, queried: Sequence[str], cities: Sequence[str]) -> list[tuple[str, str]]:
    """(city, number) for every answer-sized number of `output`, in order (see the module's rules)."""
    text = normalise(output)
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
    punctuation and "and" between them ("1234567 or 2345678" is two answers for one city)."""
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
    """Each queried city is right when the output offers exactly one distinct number for it, the needle's."""
    pairs = attribute(output, queried, cities)
    offered = [tuple(dict.fromkeys(number for city, number in pairs if city == q)) for q in queried]
    hits = tuple(o == (t,) for o, t in zip(offered, targets))
    return Grade(offered=tuple(offered), hits=hits, ambiguous=tuple(len(o) > 1 for o in offered))


def substring_hits(output: str, targets: Sequence[str]) -> list[bool]:
    """The public needle code's rule: the needle's digits appear anywhere in the output, as a
    substring (so "12345678" and "-1234567" count, and "1,234,567" does not)."""
    return [target in output for target in targets]
