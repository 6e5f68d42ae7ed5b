"""How a number is written: the numbers of an output as a reader reads them (`numbers.py`
then decides which city each answers).

Numbers are read after normalisation: NFKC (fullwidth digits, no-break
spaces), every decimal digit as its ASCII digit (Arabic-Indic, Devanagari),
the typographic apostrophe and the Arabic separators as their ASCII
counterparts, accents dropped so that "Zürich" names Zurich, and five or more
digit words in a row ("four eight three one nine zero two") as digits. A
superscript or subscript digit written against a word or a number is a
footnote mark, not a digit: "3906417¹" reads 3906417 (NFKC alone would read
39064171); a number written wholly in superscripts reads as its digits. Digit
groups are joined: "1,234,567", "1 234 567", "1.234.567", "1'234'567",
"123-4567", the Indian "12,34,567" and digits one by one ("1 2 3 4 5 6 7")
all read 1234567. A minus sign written against the digits ("-1234567") makes
a different number, as does a decimal part.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

MIN_DIGITS = 5  # the needles have 7 digits; shorter numbers are counts and references, not answers
# digit runs joined by one repeated separator character; whether they form one number is decided below
_RUN = re.compile(r"\d+(?:([ ,.'_-])\d+(?:\1\d+)*)?")
_MINUS = "-\u2212"
_SIGN_BEFORE = " \t\n(:=[,"  # what may precede a minus sign that belongs to the number
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# five or more digit words in a row write a number digit by digit; fewer are counts ("one or two")
_WORD = "(?:" + "|".join(_DIGIT_WORDS) + ")"
_SPELLED = re.compile(rf"\b{_WORD}(?:[\s,-]+{_WORD}){{{MIN_DIGITS - 1},}}\b", re.I)
# separators NFKC leaves alone: the typographic apostrophe (Swiss grouping), the Arabic thousands and decimal signs
_SEPARATORS = str.maketrans({"\u2019": "'", "\u066c": ",", "\u066b": "."})
# superscript and subscript digits and parentheses; against the text before them they mark a footnote
_RAISED = "\u00b2\u00b3\u00b9\u2070\u2074-\u2079\u207d\u207e\u2080-\u2089\u208d\u208e"
_FOOTNOTE = re.compile(rf"(?<=[^\s{_RAISED}])[{_RAISED}]+")


@dataclass(frozen=True)
class Item:
    """A number or a city name found in the normalised output."""

    kind: str  # "number" or "city"
    value: str  # the number's digits (with "-" and a decimal part when written), or the city
    start: int
    end: int


def normalise(text: str) -> str:
    """Footnote marks dropped, then NFKC (fullwidth digits, no-break and thin spaces become plain
    ones), every decimal digit as ASCII, ASCII separators, accents dropped and spelled-out digit
    runs as digits."""
    text = unicodedata.normalize("NFKC", _FOOTNOTE.sub("", text)).translate(_SEPARATORS)
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


def answer_sized(item: Item) -> bool:
    """A number long enough to be an answer (its integer part has MIN_DIGITS digits or more)."""
    return len(item.value.lstrip("-").split(".")[0]) >= MIN_DIGITS


def _signed(text: str, start: int, end: int, digits: str) -> Item:
    """A minus written against the digits, after a space or punctuation, makes the number negative."""
    negative = start >= 1 and text[start - 1] in _MINUS and (start == 1 or text[start - 2] in _SIGN_BEFORE)
    if negative:
        return Item("number", "-" + digits, start - 1, end)
    return Item("number", digits, start, end)
