"""String-match scores of RULER-style tasks: are the reference strings in the output?

The output is cleaned as lm-eval's RULER code cleans a prediction (stripped, every control
character made a newline, stripped again) and references are looked for case-insensitively:

- `string_match_all(outputs, references)`: per prediction, the share of its references found,
  averaged over predictions (lm-eval's `string_match_all`; one prediction per sample gives the
  sample's share);
- `string_match_part(outputs, references)`: lm-eval's `string_match_part`, the best prediction's
  share divided by the number of predictions. With the one prediction a sample has, it equals the
  share, not RULER's own "any reference" rule, which `any_reference` is;
- `all_references(output, references)` / `any_reference(...)`: pass/fail forms (every reference
  found; at least one), what a paired test and a gate count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f]")


def cleaned(output: str) -> str:
    """A prediction as lm-eval's RULER `postprocess_pred` leaves it."""
    return _CONTROL.sub("\n", output.strip()).strip()


def found(output: str, references: Sequence[str]) -> list[bool]:
    """Per reference: does the cleaned output contain it, case-insensitively?"""
    text = cleaned(output).lower()
    return [reference.lower() in text for reference in references]


def share_found(output: str, references: Sequence[str]) -> float:
    hits = found(output, references)
    if not hits:  # lm-eval divides by the number of references: a sample has at least one
        raise ValueError("no reference answer to look for")
    return sum(hits) / len(hits)


def string_match_all(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over predictions of the share of their references found."""
    return sum(share_found(o, r) for o, r in zip(outputs, references, strict=True)) / len(outputs)


def string_match_part(outputs: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """The best prediction's share of references found, divided by the number of predictions."""
    return max(share_found(o, r) for o, r in zip(outputs, references, strict=True)) / len(outputs)


def all_references(output: str, references: Sequence[str]) -> bool:
    return share_found(output, references) == 1.0


def any_reference(output: str, references: Sequence[str]) -> bool:
    return share_found(output, references) > 0.0
