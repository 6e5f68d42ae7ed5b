"""Reading a NoLiMa needle-set file (the JSON of the NoLiMa benchmark's `needlesets` folder), and
choosing between it and the built-in set (`load_pairs`).

The file is a JSON list of needle entries. Of each entry this reads:

- `id`: the entry's name (a pair's id is `<id>-<test id>`);
- `needle`: the needle sentence, with `{CHAR}` where the character goes and `{1}`, `{2}`...
  where a test's arguments go;
- `questions`: question templates by kind (`onehop`, `twohop`...), with the same `{N}` fields;
  the kind is what `-T hops` selects;
- `character_set`: the names the answer is drawn from;
- `tests`: test id -> `{"input_args": [...]}`, the values of `{1}`, `{2}`... in order;
- `distractors` (when present): distractor templates by question kind, filled like the questions.

Everything else (its prompt template, system prompt, reasoning type...) is left alone: the
prompt is evalsuite's own. A needle without `{CHAR}` has no character to ask for and is refused.
NoLiMa's two-hop questions reach the needle through two steps of world knowledge, so its pairs
place no bridge fact (the built-in set's two hops place one: needles.py). A test's arguments are
its pair's terms (no haystack sentence may name one), and the entry is its group: the control's
mismatched question comes from another entry whose tests share no argument with it (whether the
two topics are related in the world, as Dresden and Saxony are, a file does not say).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError

from .needles import CHAR, HOPS, Pair, builtin_pairs

FIELDS = ("id", "needle", "questions", "character_set", "tests")


def fill(template: str, args: Sequence[Any]) -> str:
    """`template` with `{1}`, `{2}`... replaced by the test's arguments (1-based); `{CHAR}` kept."""
    def value(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if not 1 <= index <= len(args):
            raise ValueError(f"{{{index}}} but the test gives {len(args)} argument(s)")
        return str(args[index - 1])

    return re.sub(r"\{(\d+)\}", value, template)


def load_pairs(spec: str, hops: Sequence[str]) -> dict[str, list[Pair]]:
    """The pairs of each hop kind asked for: `builtin` (needles.py), or a NoLiMa needle-set file."""
    if spec == "builtin":
        wrong = [h for h in hops if h not in HOPS]
        if wrong:
            raise UserError(f"-T hops: the built-in set has {' and '.join(HOPS)}, not {', '.join(wrong)}")
        return {h: builtin_pairs(h) for h in hops}
    found = read_needle_set(spec)
    missing = [h for h in hops if not found.get(h)]
    if missing:
        raise UserError(f"needle set {spec} has no {', '.join(missing)} questions; it has {', '.join(sorted(found))} "
                        "(-T hops=...)")
    return {h: found[h] for h in hops}


def read_needle_set(spec: str) -> dict[str, list[Pair]]:
    """The pairs of a NoLiMa needle-set file, by question kind; one-line errors for a bad file."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(f"needle set not found: {spec} (-T needle_set=builtin, or a NoLiMa needle-set JSON file)")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read needle set {spec}: {exc}") from None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"needle set {spec} must be a JSON list of needle entries (NoLiMa's format)")
    found: dict[str, list[Pair]] = {}
    for number, entry in enumerate(entries, 1):
        try:
            for pair in entry_pairs(entry):
                found.setdefault(pair.hops, []).append(pair)
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"needle set {spec}, entry #{number}: {exc}") from None
    return found


def entry_pairs(entry: Any) -> list[Pair]:
    """One entry's pairs: every question kind with every test."""
    if not isinstance(entry, Mapping):
        raise TypeError("an entry must be a JSON object")
    missing = [name for name in FIELDS if name not in entry]
    if missing:
        raise KeyError(f"no {', '.join(missing)} (an entry needs {', '.join(FIELDS)})")
    needle, questions, tests = entry["needle"], entry["questions"], entry["tests"]
    characters = entry["character_set"]
    if not isinstance(needle, str) or CHAR not in needle:
        raise ValueError(f"the needle must be a text holding {CHAR}, the character asked for")
    if not (isinstance(questions, Mapping) and isinstance(tests, Mapping) and questions and tests):
        raise TypeError("questions and tests must be non-empty objects")
    if not (isinstance(characters, list) and characters and all(isinstance(c, str) and c for c in characters)):
        raise TypeError("character_set must be a list of names")
    distractors = entry.get("distractors", {})
    pairs = []
    for test_id, test in tests.items():
        args = test.get("input_args") if isinstance(test, Mapping) else None
        if not isinstance(args, list):
            raise TypeError(f"test {test_id!r} needs input_args, a list")
        for kind, question in questions.items():
            extra = distractors.get(kind) if isinstance(distractors, Mapping) else None
            pairs.append(Pair(f"{entry['id']}-{test_id}", str(kind), fill(needle, args), fill(str(question), args),
                              tuple(characters), "", (fill(extra, args),) if isinstance(extra, str) else (),
                              terms=tuple(str(a) for a in args), group=str(entry["id"])))
    return pairs
