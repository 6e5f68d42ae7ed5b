"""Needle sets of the nolima task: the built-in pairs, a NoLiMa file, and what "shares no word" means.

A `Pair` is one needle and its question, ready to place: the needle holds `{CHAR}`, the
character who is the answer; a two-hop pair adds a bridge fact, placed elsewhere in the
haystack, without which the needle does not answer the question. The built-in set
(`pairs.json`, written for evalsuite) holds one-hop pairs whose question reaches the needle
through world knowledge only ("lives next to the Atomium" / "has been to Brussels"); a pair
with a landmark also runs two hops: its needle names an invented venue instead, and the
bridge puts that venue next to the landmark. Its distractors repeat the question's key words
and name no character. `conflicts` lists pairs whose needle may answer another's question (the
Sistine Chapel is in Rome): the mismatched-question control never asks one of them for the other.
A pair's `terms` (its key, landmark and venue; a NoLiMa test's arguments) are what no haystack
sentence may name (haystack.py). `content_words` is the overlap check's side of it: lower-cased
words, the shipped stop words left out, each passed through a stemmer the caller gives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

CHAR = "{CHAR}"
HOPS = ("onehop", "twohop")


@dataclass(frozen=True)
class Pair:
    """A needle (with `{CHAR}`), its question, the characters to draw the answer from, and
    the texts placed elsewhere: a bridge fact (two hops) and literal-match distractors. `terms`
    are the words no haystack sentence may name; `group` the pairs of one topic (a NoLiMa entry's
    tests) and `conflicts` the ids of pairs whose question its needle may answer: the control's
    mismatched question comes from neither."""

    id: str
    hops: str
    needle: str
    question: str
    characters: tuple[str, ...]
    bridge: str = ""
    distractors: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    group: str = ""
    conflicts: tuple[str, ...] = ()

    def unrelated(self, other: Pair) -> bool:
        """Can `other`'s question serve as this pair's mismatched question (no character fits it)?"""
        shared = {t.lower() for t in self.terms} & {t.lower() for t in other.terms}
        return (other.group != self.group and other.id not in self.conflicts and self.id not in other.conflicts
                and other.question != self.question and not shared)


def _text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def stop_words() -> frozenset[str]:
    """The shipped stop-word list (stopwords.txt)."""
    lines = (line.strip() for line in _text("stopwords.txt").splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def content_words(text: str, stem: Callable[[str], str] = lambda word: word) -> set[str]:
    """The stems of `text`'s words that are not stop words (lower-cased, letters and digits,
    `{CHAR}` and one-letter pieces such as a possessive's s left out)."""
    words = re.findall(r"[^\W_]+", text.replace(CHAR, " ").lower())
    return {stem(word) for word in words if len(word) > 1 and word not in stop_words()}


def _fill(template: str, **values: str) -> str:
    """`template` with its {NAME} fields filled, the first letter made upper case."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    return template[0].upper() + template[1:]


@cache
def builtin_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_text("pairs.json"))
    return data


def builtin_pairs(hops: str) -> list[Pair]:
    """The built-in pairs of one kind: every pair for one hop, those with a landmark for two."""
    data = builtin_data()
    characters = tuple(data["characters"])
    conflicts = [set(group) for group in data["conflicts"]]
    out = []
    for index, item in enumerate(data["pairs"]):
        distractors = tuple(_fill(t, KEY=item["key"]) for t in data["distractors"])
        terms = (item["key"], *([item["landmark"]] if "landmark" in item else []))
        related = tuple(sorted(set().union(*[g for g in conflicts if item["id"] in g]) - {item["id"]}))
        common = {"terms": terms, "group": item["id"], "conflicts": related}
        if hops == "onehop":
            out.append(Pair(item["id"], hops, item["needle"], item["question"], characters, "", distractors, **common))
        elif hops == "twohop" and "landmark" in item:
            venue = data["venues"][index % len(data["venues"])]  # one venue per pair: a fixed chain
            needle = item["needle"].replace(item["landmark"], venue)
            bridge = _fill(data["bridge"], VENUE=venue, LANDMARK=item["landmark"])
            out.append(Pair(item["id"], hops, needle, item["question"], characters, bridge, distractors,
                            **{**common, "terms": (*terms, venue)}))
    return out

