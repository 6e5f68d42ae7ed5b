"""Long prompts in the HTML report: the items a task hid marked in the text, and for a prompt too
long to show whole, excerpts around each item and the end (the question).

    mark(text, items)            HTML with every occurrence of each item inside <mark>
    marked_prompt(text, items)   the whole prompt marked, or marked excerpts of a long one
"""

from __future__ import annotations

from collections.abc import Sequence

PROMPT_LIMIT = 12_000  # characters of a logged prompt shown whole; longer ones as excerpts
WINDOW = 400  # characters of context either side of an item in an excerpt


def mark(text: str, items: Sequence[str]) -> str:
    """`text` as HTML with every occurrence of each item inside <mark>."""
    from evalsuite.analysis.html import esc

    spans = sorted((start, start + len(n)) for n in set(items) if n
                   for start in _occurrences(text, n))
    out, at = [], 0
    for start, end in spans:
        if start < at:
            continue
        out += [esc(text[at:start]), f"<mark>{esc(text[start:end])}</mark>"]
        at = end
    out.append(esc(text[at:]))
    return "".join(out)


def _occurrences(text: str, item: str) -> list[int]:
    found, start = [], text.find(item)
    while start >= 0:
        found.append(start)
        start = text.find(item, start + len(item))
    return found


def marked_prompt(text: str, items: Sequence[str]) -> str:
    """The whole prompt with items marked, or for a long one excerpts around each
    item and the end of the prompt (the question), so a 64K run stays readable."""
    if len(text) <= PROMPT_LIMIT:
        return mark(text, items)
    windows = [(max(0, s - WINDOW), s + len(n) + WINDOW) for n in items for s in _occurrences(text, n)]
    windows.append((max(0, len(text) - 3 * WINDOW // 2), len(text)))
    merged: list[list[int]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    parts = [mark(text[s:e], items) for s, e in merged]
    lead = "[…] " if merged[0][0] > 0 else ""
    return lead + " <b>[…]</b> ".join(parts)
