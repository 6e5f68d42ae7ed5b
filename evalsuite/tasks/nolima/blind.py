"""Question-blind rules: what a reader who never reads the question would answer, from a prompt's
haystack alone. With a haystack that names nobody but the needle's character, "answer the one name"
scores every sample; the built-in story (story.py) names other people so that it cannot.

Each rule picks the names it would answer among the haystack's names (the reader is granted an exact
list of them: the characters and the story's cast) and draws one, so its score on a prompt is 1/k when
the answer is one of its k picks, else 0; a function of the prompt, no model, no draw:

- `chance`: any name of the haystack;
- `fewest mentions`: the names mentioned least often (the issue's "unfamiliar name": the needle's
  character is named once);
- `beside a proper noun`: the names whose sentence holds another capitalised word past its first
  (the needles name a landmark or a venue), or every name when no sentence does.

The rules see names only: that the needle names a famous landmark remains a cue, and the mismatched
question (task.py) is what tells a model that reads the question from one that does not.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

WORD = re.compile(r"[^\W\d_][\w'-]*")


def blind_scores(pieces: Sequence[str], names: Collection[str], answer: str) -> dict[str, float | int]:
    """The rules' scores on a haystack given as its pieces (sentences, fragments and the needle), and
    how many names it holds. The names are matched as whole words, in their case."""
    counts: Counter[str] = Counter()
    beside: set[str] = set()
    for piece in pieces:
        found = [w.removesuffix("'s") for w in WORD.findall(piece) if w.removesuffix("'s") in names]
        counts.update(found)
        if found and _other_proper_noun(piece, names):
            beside.update(found)
    fewest = min(counts.values(), default=0)
    return {"names_in_prompt": len(counts), "blind_chance": _score(list(counts), answer),
            "blind_fewest_mentions": _score([n for n, c in counts.items() if c == fewest], answer),
            "blind_beside_proper_noun": _score(sorted(beside) or list(counts), answer)}


def _other_proper_noun(piece: str, names: Collection[str]) -> bool:
    words = WORD.findall(piece)[1:]  # the first word is capitalised by position
    return any(w[0].isupper() and w != "I" and w.removesuffix("'s") not in names for w in words)


def _score(picks: Sequence[str], answer: str) -> float:
    return 1 / len(picks) if answer in picks else 0.0
