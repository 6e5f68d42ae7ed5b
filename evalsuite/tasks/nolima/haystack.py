"""The nolima task's haystack: the built-in story (story.py), or a user's text with every sentence
that names a character, a question's key or a landmark left out.

NoLiMa filters its books the same way: it redacts the passages that hold a word of its needles or
questions, or one close to them, so that nothing but the needle answers a question. A user's text
(`-T haystack=FILE`, a folder or `dataset:NAME`) is filtered rather than refused: a book that
mentions Paris once, or a person who shares a name with a character, is still a usable haystack once
that sentence is gone, and refusing would rule out nearly every novel. The sentences dropped are
counted in each record (`haystack_dropped`); a text left too short for the longest prompt is refused
as any short text is (`Haystack.check`).

A term matches a word that starts with it, in any case ("Rome" drops "Romeo", "Berlin" drops
"Berliner"), and a term of several words matches them in a row; a lower-case plural matches its
singular too ("aeroplanes" drops "aeroplane"). This errs on the side of dropping a harmless sentence.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from evalsuite.errors import UserError
from evalsuite.tasks.kit import Haystack

from .story import story_sentences

MAX_DROPPED_IN_A_ROW = 1000


@dataclass(frozen=True)
class StoryHaystack(Haystack):
    """A nolima haystack: a user's text (filtered), or, when `text` is None, the built-in story with
    `cast` as its people; `terms` are what no sentence may name, `dropped` the text's sentences left out."""

    cast: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    dropped: int = 0

    def sentences(self, rng: random.Random, tokens: int) -> Iterator[str]:
        if self.text is not None:
            return self.text.stream(rng)
        return _kept(story_sentences(rng, self.cast, tokens), term_pattern(self.terms))


def _kept(stream: Iterator[str], pattern: re.Pattern[str] | None) -> Iterator[str]:
    """The story's sentences that name no term; a term that rules out sentence after sentence (a
    needle set whose arguments are common words) is one line, not an endless search."""
    missed = 0
    for sentence in stream:
        if pattern is None or not pattern.search(sentence):
            missed = 0
            yield sentence
            continue
        missed += 1
        if missed == MAX_DROPPED_IN_A_ROW:
            raise UserError(f"the built-in story cannot avoid the needle set's terms ({pattern.pattern[:80]}...): "
                            "use -T haystack=FILE")


def term_pattern(terms: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern that finds any of `terms` as the start of a word (None for no terms); a term of
    fewer than three letters ("a", "2") would match nearly every sentence and is not one."""
    parts = sorted({_term(t) for t in terms if len(re.sub(r"\W", "", t)) >= 3}, key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(parts) + r")", re.IGNORECASE) if parts else None


def _term(term: str) -> str:
    words = term.split()
    if words and words[0].lower() == "the" and len(words) > 1:
        words = words[1:]  # "the Atomium": a text may say "Atomium" alone
    last = words[-1]
    if last.islower() and last.endswith("s") and len(last) > 5:
        last = last[:-1]  # "aeroplanes" also drops "aeroplane"
    return r"\s+".join([*map(re.escape, words[:-1]), re.escape(last)])


def story_haystack(spec: str, field: str, cast: tuple[str, ...], terms: tuple[str, ...]) -> StoryHaystack:
    """The haystack `spec` names: `builtin` (the story of `cast`), or a text with every sentence
    that names one of `terms` left out."""
    base = Haystack.load(spec, field)
    if base.text is None:
        return StoryHaystack(None, spec, cast=cast, terms=terms)
    pattern = term_pattern(terms)
    kept = tuple(s for s in base.text.sentences if pattern is None or not pattern.search(s))
    if not kept:
        raise UserError(f"haystack {spec}: every sentence names a character, a question's key or a landmark "
                        "of the needle set, and NoLiMa's rule leaves such sentences out")
    return StoryHaystack(replace(base.text, sentences=kept), spec, terms=terms,
                         dropped=len(base.text.sentences) - len(kept))
