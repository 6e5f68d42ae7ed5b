"""Haystack text: the built-in filler (generated sentences, no download, no digits, no city names),
or the sentences of a text file, a folder of them or a dataset column, read on from a seeded start.

    builtin_sentences(rng)       an endless, seeded stream of filler sentences
    person_sentence(below, person, place)   one with a person as its subject (nolima's story)
    load_haystack(spec, field)   None for `builtin`; else a TextHaystack of the spec's sentences
    TextHaystack.stream(rng)     a sample's sentences: one pass over the text from a seeded start
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError

from .data import load_texts

# ---- the built-in filler -------------------------------------------------------------------

_SUBJECTS = (
    "the farmer", "a young painter", "the old sailor", "my neighbour", "the teacher", "a quiet child",
    "the baker", "our guide", "the gardener", "a tired traveller", "the librarian", "the shepherd",
    "a clever fox", "the miller", "the weaver", "a wandering poet", "the carpenter", "the fisherman",
)
_VERBS = (
    "carried", "painted", "found", "watched", "repaired", "described", "forgot", "remembered",
    "cleaned", "opened", "followed", "admired", "borrowed", "measured", "sketched", "wrapped",
)
_OBJECTS = (
    "a wooden basket", "the green door", "an old map", "the silver bell", "a woollen coat",
    "the narrow bridge", "a bundle of letters", "the broken lantern", "a jar of honey", "the tall ladder",
    "a small boat", "the heavy curtain", "a basket of apples", "the painted fence", "a loaf of bread",
)
_PLACES = (
    "near the river", "in the valley", "behind the mill", "on the hill", "at the market",
    "by the harbour", "under the bridge", "in the orchard", "beside the well", "along the coast",
    "in the forest", "across the meadow", "at the edge of the village", "inside the barn",
)
_TIMES = (
    "in the morning", "before sunset", "after the storm", "during the festival", "late at night",
    "at dawn", "in early spring", "on a windy afternoon", "when the snow melted", "after supper",
)
_REMARKS = (
    "The sky was grey and the wind was cold.", "Nobody spoke for a long while.",
    "The road was longer than anyone expected.", "Birds circled slowly above the roofs.",
    "It was an ordinary day, like many others.", "The smell of rain hung in the air.",
    "Somewhere a dog barked twice and then fell silent.", "The lamps were lit one by one.",
    "Everyone agreed that it had been a good year.", "The river ran high after the rains.",
)


def index_draws(rng: random.Random) -> Callable[[int], int]:
    """`rng.randrange(n)` (and the index `rng.choice` draws from n items), by the same draws
    as the random module makes (bits of n's length until one is below n) without its per-call
    checks: the filler of a 64K-token prompt takes some 30,000 draws."""
    getrandbits = rng.getrandbits

    def below(n: int) -> int:
        bits = n.bit_length()
        drawn = getrandbits(bits)
        while drawn >= n:
            drawn = getrandbits(bits)
        return drawn

    return below


def _builtin_sentence(below: Callable[[int], int]) -> str:
    shape = below(4)
    if shape == 3:
        return _REMARKS[below(len(_REMARKS))]
    subject, verb, obj = _SUBJECTS[below(len(_SUBJECTS))], _VERBS[below(len(_VERBS))], _OBJECTS[below(len(_OBJECTS))]
    place, time = _PLACES[below(len(_PLACES))], _TIMES[below(len(_TIMES))]
    if shape == 0:
        sentence = f"{subject} {verb} {obj} {place}."
    elif shape == 1:
        sentence = f"{time.capitalize()}, {subject} {verb} {obj}."
    else:
        sentence = f"{subject} {verb} {obj} {place} {time}."
    return sentence[0].upper() + sentence[1:]


def builtin_sentences(rng: random.Random) -> Iterator[str]:
    """An endless, seeded stream of generated filler sentences."""
    below = index_draws(rng)
    while True:
        yield _builtin_sentence(below)


def person_sentence(below: Callable[[int], int], person: str, place: str | None = None) -> str:
    """A filler sentence whose subject is `person` (written first), at `place` or at one of the
    filler's places: the filler's own verbs, objects and times, for a haystack that names people
    (the nolima task's story; the needle task's filler never calls this)."""
    verb, obj = _VERBS[below(len(_VERBS))], _OBJECTS[below(len(_OBJECTS))]
    where = place if place is not None else _PLACES[below(len(_PLACES))]
    if below(2):
        return f"{person} {verb} {obj} {where}."
    return f"{person} {verb} {obj} {where} {_TIMES[below(len(_TIMES))]}."


# ---- haystacks from text files and datasets -------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]


@dataclass(frozen=True)
class TextHaystack:
    """Sentences of a real text; each sample reads on from a seeded starting sentence."""

    source: str
    sentences: tuple[str, ...]

    def stream(self, rng: random.Random) -> Iterator[str]:
        start = rng.randrange(len(self.sentences))
        # one pass over the text at most, wrapping around once: never repeat a sentence
        for i in range(len(self.sentences)):
            yield self.sentences[(start + i) % len(self.sentences)]


def load_haystack(spec: str, field: str = "text") -> TextHaystack | None:
    """None for the built-in filler; else the sentences of a text file, of a folder's .txt files
    (in name order) or of a dataset column.

    `spec` is `builtin`, a path to a text file or a folder of them, or `dataset:NAME[:SPLIT]` where
    NAME is anything `datasets.load_dataset` accepts (a hub name, or a local folder of files).
    """
    if spec == "builtin":
        return None
    if not spec.startswith("dataset:") and not Path(spec).expanduser().exists():
        raise UserError(f"haystack file not found: {spec} (use builtin, a text file, a folder of them, "
                        "or dataset:NAME)")
    texts = load_texts(spec, "haystack", field)
    sentences = [s for text in texts for s in split_sentences(text.text)]
    if not sentences:
        raise UserError(f"haystack {spec} has no text" + (f" in column {field!r}" if spec.startswith("dataset:") else ""))
    return TextHaystack(spec, tuple(sentences))
