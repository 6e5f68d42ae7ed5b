"""The built-in haystack of the nolima task: the task kit's filler with people in it.

NoLiMa's haystacks are passages of novels, so the needle's character is one name among many. The
built-in story does the same with generated sentences: the kit's filler ("The farmer carried a
wooden basket near the river."), and among it sentences whose subject is a person of the cast
(cast.txt), most of them at a place with a proper name of its own ("Greta repaired the green door
at the Crown Inn."; invented, never a landmark, a city or a country), as each needle names a
landmark or a venue. Each person is named once a prompt (the cast is shuffled per prompt and drawn
without repeats), and the share of sentences that name someone shrinks as the prompt grows, so that
a long prompt does not run out of people and name them twice. So neither "the only name", nor "the
name mentioned least", nor "the name beside a proper noun" singles out the needle's character
(blind.py measures each).

The words are the filler's and a few short place names, so that a prompt fitted to an exact token
count can close its gap a word at a time even with a small vocabulary (the toy models'); a name is
always a sentence's first word, which the fit's fragments (a sentence's tail) never hold, and a draw
whose gap falls at a name is drawn again (task.py, `Nolima._fit`). No named sentence shares a content word with
a built-in question or holds a question's key (tests/test_nolima.py checks), and a run drops any
sentence that names one of its needle set's terms all the same (haystack.py).

    story_sentences(rng, cast, tokens)   an endless, seeded stream for a prompt of `tokens` tokens
    cast_names()                          the cast as shipped
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from functools import cache
from importlib import resources

from evalsuite.tasks.kit.filler import builtin_sentences, index_draws, person_sentence

# the sizing of the named share: a filler sentence takes some 12 tokens, a prompt names a person in
# at most 60% of its sentences and uses, by that estimate, at most 80% of the cast (a prompt that
# needs more people than that reshuffles the cast, and only then is a person named twice)
SENTENCE_TOKENS = 12
NAMED_SHARE = 0.6
CAST_USE = 0.8
PLACE_NAMED = 9  # of 10 named sentences put the person at a place with a proper name, as needles name one

NAMED_PLACES = (  # invented, of short words: no landmark, city or country
    "along Mill Road", "outside the Silver Bell", "by the Old Well", "on Honey Hill", "at the Red Lion",
    "behind the Long Barn", "near Apple Row", "at the Crown Inn", "along River Lane", "in Little Market",
    "at Oak Yard", "by the Star Inn", "near the Swan Inn", "on Ash Row", "at the Sun Inn", "along West Row",
    "past the Stone Well", "on Rose Lane", "behind the High Mill", "near Wind Hill",
)


@cache
def cast_names() -> tuple[str, ...]:
    """The people of the story (cast.txt), in the file's order."""
    text = resources.files(__package__).joinpath("cast.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def named_share(cast_size: int, tokens: int) -> float:
    """The share of sentences that name a person in a prompt of `tokens` tokens."""
    return min(NAMED_SHARE, CAST_USE * cast_size * SENTENCE_TOKENS / max(1, tokens))


def story_sentences(rng: random.Random, cast: Sequence[str], tokens: int) -> Iterator[str]:
    """An endless, seeded stream of story sentences for a prompt of `tokens` tokens: a share of
    them (`named_share`) each name a person of `cast`, every person once before any is named again."""
    below = index_draws(rng)
    filler = builtin_sentences(rng)
    share = named_share(len(cast), tokens) if cast else 0.0
    people = _people(rng, cast)
    while True:
        if rng.random() >= share:
            yield next(filler)
            continue
        place = NAMED_PLACES[below(len(NAMED_PLACES))] if below(10) < PLACE_NAMED else None
        yield person_sentence(below, next(people), place)


def _people(rng: random.Random, cast: Sequence[str]) -> Iterator[str]:
    """The cast in a seeded order, reshuffled when every person has been named."""
    order = list(cast)
    while order:
        rng.shuffle(order)
        yield from order
