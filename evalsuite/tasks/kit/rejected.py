"""What an output takes back, as a reader reads it: the numbers that are no answer, and the
queried cities the output says it cannot answer (`numbers.py` places the numbers left).

- negated: a number after "not", "never", "neither", "nor", "rather than" or "instead of",
  and one joined to a negated number by "or" ("not 7654321 or 2345678");
- contrasted: in "not X but Y" whatever stands between "not" and "but" is no answer, numbers
  and city names alike ("not 7654321 but 1234567", "not, as it seemed, 7654321, but
  1234567", "7654321 is not Rome's but Paris's"); "not only X but also Y" gives both;
- rejected after it is written: "7209415 is not it", "7209415 is wrong", "7209415 - wait,
  that's wrong", "7209415. Sorry, that was not right";
- disowned: a number the output says belongs to a name that is none of the prompt's cities
  ("3906417 - wait, that's Malmo's", "3906417 is Malmo's") answers no query; said to belong
  to a city, it answers that city (`OWNED_BY`, read by numbers.py);
- declined: a queried city the output says it does not know ("I don't know Lisbon's",
  "I cannot find the number for Lisbon") is not credited, whatever number it offered for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .digits import Item, answer_sized, numbers

_NEGATED = re.compile(r"(?:\bnot|\bisn't|\brather than|\binstead of|\bnever|\bneither|\bnor)\s*"
                      r"(?:the\s+number\s+)?$", re.I)
_OR_GAP = re.compile(r"^\s*,?\s*(?:or|nor)\s+$", re.I)  # "not 7654321 or 2345678": the "not" covers both
# "not ... but", within one clause; "not only/just ... but" adds rather than replaces
_CONTRAST = re.compile(r"(?:\bnot\b|n't\b)(?!\s+(?:only|just|merely|simply)\b)"
                       r"(?P<scope>(?:(?![.!?;:](?:\s|$)|\n).)*?)\bbut\b(?:\s+rather\b)?", re.I)
_INTERJECTION = r"(?:wait|no|sorry|oops|actually|hmm|oh)\b"
# what may stand between a number and what the output then says of it: "7209415 is", ", which is",
# " - wait, that's", ". Sorry, that was" (a sentence end only before such a word)
_LEAD = (rf"^\s*(?:[,;:\u2013\u2014-]+\s*|[.!?]\s*(?={_INTERJECTION}))?(?:{_INTERJECTION}[\s,.!:;\u2013\u2014-]*)*"
         r"(?:(?:that|it|this|which)(?:'s|\s+(?:is|was))|is|was)")
_REJECTED_AFTER = re.compile(
    _LEAD + r"(?:\s*(?:not|n't)\s+(?:it|right|correct|the\s+(?:right\s+|correct\s+)?(?:answer|one))\b"
    r"|\s+(?:wrong|incorrect)\b)", re.I)
# "that's Malmo's", "it is the number of Malmo": the name the number is said to belong to
_OWNER = re.compile(_LEAD + r"\s+(?:(?P<possessor>(?-i:[A-Z])[\w-]*)'s\b|(?:the\s+(?:(?:magic|special|secret)\s+)?"
                    r"number\s+(?:of|for)|for)\s+(?P<named>(?-i:[A-Z])[\w-]*))", re.I)
OWNED_BY = re.compile(_LEAD + r"\s+$", re.I)  # the gap before a city named as the number's owner: "is Rome's"
_DECLINED = re.compile(
    r"\b(?:don't|do\s+not|doesn't|does\s+not|didn't|did\s+not|can't|cannot|can\s+not|couldn't|could\s+not)\s+"
    r"(?:know|find|recall|remember|see|tell|determine)\s+(?:what\s+)?(?:the\s+)?(?:(?:special|magic|secret)\s+)*"
    r"(?:(?:number|one)\s+)?(?:(?:of|for)\s+)?$", re.I)


def without_contrasts(text: str, cities: re.Pattern[str]) -> str:
    """`text` with each "not ... but" that sets aside a number or a city cut out, so that what
    follows "but" stands where the rejected part stood ("7654321 is not Rome's but Paris's"
    reads "7654321 is Paris's"); one that sets aside neither ("not sure, but") is kept."""
    def cut(match: re.Match[str]) -> str:
        scope = match.group("scope")
        sets_aside = any(answer_sized(n) for n in numbers(scope)) or cities.search(scope) is not None
        return " " if sets_aside else match.group(0)

    return _CONTRAST.sub(cut, text)


def answers(text: str, cities: Sequence[str]) -> list[Item]:
    """The answer-sized numbers of `text` that the output neither negates, rejects nor gives to a
    name that is none of `cities`."""
    known = {c.lower() for c in cities}
    kept, negated_before, previous = [], False, None
    for item in (n for n in numbers(text) if answer_sized(n)):
        joined = negated_before and previous is not None and _OR_GAP.match(text[previous.end:item.start])
        negated_before = bool(_NEGATED.search(text[: item.start]) or joined)
        previous = item
        if negated_before or _REJECTED_AFTER.match(text[item.end:]) or _disowned(text[item.end:], known):
            continue
        kept.append(item)
    return kept


def _disowned(after: str, known: set[str]) -> bool:
    """Is the number just written said to belong to a name that is none of the prompt's cities?"""
    owner = _OWNER.match(after)
    if owner is None:
        return False
    return (owner.group("possessor") or owner.group("named")).lower() not in known


def declined(text: str, queried: Sequence[str], cities: re.Pattern[str]) -> tuple[bool, ...]:
    """Per queried city: does the output say it does not know that city's number?"""
    said = {m.group(1).lower() for m in cities.finditer(text) if _DECLINED.search(text[: m.start()])}
    return tuple(q.lower() in said for q in queried)
