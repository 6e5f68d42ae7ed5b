"""Name answers, as the nolima task scores them: `named` strict (the needle task's rule for numbers,
read for names), `contains` NoLiMa's own rule, and `says_none` for the mismatched question.

The strict reader finds every name it knows in the output (the characters of the needle set and the
people of the built-in story, whole words in any case, accents dropped) and keeps the ones the
output offers as its answer. A mention is not offered when it is

- negated: after "not", "n't", "never", "rather than", "instead of", "except", "other than"
  ("Not Tobias.", "It isn't Hana, it's Tobias.");
- retracted: followed by punctuation and "no", "wait", "actually", "sorry", "not sure", "I don't
  know" ("Tobias? No, I don't know.", "Anneke? No — Kofi."), or by "is not it", "is wrong";
- asked: followed by a question mark and nothing that confirms it ("Tobias?");
- a possessive ("Hana's neighbour, Tobias." offers Tobias).

The output names the needle's character (`named`) when the one name it offers is that character,
and it neither hedges nor declines:

- two or more distinct names offered are a list, never credited ("Either Tobias or Hana.", eight
  names in a row);
- a name joined to "or", "either" or "/" is an alternative ("Tobias or someone else"), and
  "maybe", "perhaps", "possibly", "might", "could be", "not sure", "no idea", "I don't know"
  anywhere are hedges; "I think", "probably" and "likely" commit to the answer and are kept;
- an output that starts by declining ("None.", "None, but Tobias lives near...") gives no name;
  "no one but Tobias" does not decline.

`says_none` is the mismatched question's right answer: the output declines ("none", "no one",
"nobody", "no character", "not mentioned", "does not say", "I don't know", "unknown"...) and offers
no name. NoLiMa's `contains` is its evaluation's own rule: the name as a case-sensitive substring of
the output, so "Not Tobias." and "Tobiasz" count, "tobias" does not.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

_NEGATED = re.compile(
    r"(?:\bnot|n't|\bnever|\brather\s+than|\binstead\s+of|\bexcept(?:\s+for)?|\bother\s+than)\s+"
    r"(?:(?:the\s+)?(?:character|answer|person)\s+)?(?:(?:is|was)\s+)?$", re.I)
_RETRACTED = re.compile(
    r"^\s*(?:[?!.,;:\u2014\u2013-]+\s*(?:no\b(?!\s+(?:one|doubt)\b)|nope\b|wait\b|actually\b|sorry\b|scratch\s+that"
    r"|not\s+sure|i\s*(?:am|'m)\s+not\s+sure|i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|tell|say|remember))"
    r"|(?:is|was)(?:\s+not|n't)\s+(?:it|right|correct|the\s+(?:right\s+|correct\s+)?(?:answer|one|character))\b"
    r"|(?:is|was)\s+(?:wrong|incorrect)\b)", re.I)
_ASKED = re.compile(r"^\s*\?")
_CONFIRMED = re.compile(r"^\s*\?\s*(?:yes|yeah|indeed|correct|right)\b", re.I)
_POSSESSIVE = re.compile(r"^'s\b", re.I)
_ALTERNATIVE_AFTER = re.compile(r"^\s*(?:,\s*)?(?:or\b|and/or\b|/)", re.I)
_ALTERNATIVE_BEFORE = re.compile(r"(?:\bor|\beither|/)\s*$", re.I)
_HEDGE = re.compile(r"\b(?:maybe|perhaps|possibly|might|could\s+be|either|not\s+sure|unsure|no\s+idea"
                    r"|i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|tell|say|remember))\b", re.I)
_DECLINE = (r"none|nobody|no\s+one|no-one|no\s+(?:such\s+)?(?:character|person)|neither|unknown"
            r"|not\s+(?:mentioned|stated|said|given)|(?:does\s+not|doesn't|did\s+not|didn't)\s+(?:say|mention|state)"
            r"|(?:cannot|can't)\s+(?:be\s+determined|tell|say)|i\s+(?:do\s+not|don't)\s+know|there\s+is\s+no")
_ONLY = r"(?!\s+(?:but|except|else|other\s+than)\b)"  # "no one but Tobias" names Tobias
_DECLINES_FIRST = re.compile(r"^\W*(?:(?:the\s+)?answer(?:\s+is)?\s*:?\s*)?(?:" + _DECLINE + r")\b" + _ONLY, re.I)
_DECLINES = re.compile(r"\b(?:" + _DECLINE + r")\b" + _ONLY, re.I)


@dataclass(frozen=True)
class Reading:
    """What an output answers: the distinct names it offers (in order), and whether it hedges or declines."""

    offered: tuple[str, ...]
    hedged: bool
    declined: bool


def normalise(text: str) -> str:
    """NFKC, the typographic apostrophe as ASCII, accents dropped ("Joaquín" names Joaquin)."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    bare = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare)


@lru_cache(maxsize=64)
def _pattern(names: frozenset[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w'-])({alternatives})(?![\w-])", re.I)


def read(output: str, names: Collection[str]) -> Reading:
    """The names `output` offers among `names` (see the module's rules), and its hedges."""
    text = normalise(output)
    canonical = {normalise(n).lower(): n for n in names}
    offered: list[str] = []
    alternative = False
    for match in _pattern(frozenset(canonical)).finditer(text):
        before, after = text[: match.start()], text[match.end():]
        if _NEGATED.search(before) or _RETRACTED.match(after) or _POSSESSIVE.match(after):
            continue
        if _ASKED.match(after) and not _CONFIRMED.match(after):
            continue
        alternative = alternative or bool(_ALTERNATIVE_AFTER.match(after) or _ALTERNATIVE_BEFORE.search(before))
        name = canonical[match.group(1).lower()]
        if name not in offered:
            offered.append(name)
    return Reading(tuple(offered), hedged=alternative or bool(_HEDGE.search(text)),
                   declined=bool(_DECLINES_FIRST.match(text)))


def named(output: str, answer: str, names: Collection[str]) -> bool:
    """Does `output` answer `answer` and nothing else, without hedging or declining? (`names`: every
    name the reader knows; `answer` is one of them.)"""
    reading = read(output, {*names, answer})
    return reading.offered == (answer,) and not reading.hedged and not reading.declined


def says_none(output: str, names: Collection[str]) -> bool:
    """Does `output` decline to name anyone (the right answer to a question no character fits)?"""
    return bool(_DECLINES.search(normalise(output))) and not read(output, names).offered


def contains(output: str, answer: str) -> bool:
    """NoLiMa's `contains` metric: the answer is a substring of the output, case and all."""
    return answer in output
