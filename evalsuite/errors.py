"""The one user-facing error type.

Bad input (unknown task, missing checkpoint, a length the model cannot hold...)
raises `UserError`; the CLI prints its message on one line and exits 2.
Internal invariants use `assert`; per-sample failures are recorded in records.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from the user: shown as one line, exit code 2, no traceback."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown(kind: str, word: str, choices: Iterable[str]) -> UserError:
    choices = sorted(choices)
    return UserError(f"unknown {kind} {word!r}{did_you_mean(word, choices)}; known: {', '.join(choices)}")


def first_line(exc: BaseException) -> str:
    """An exception as one line of an error message: its text's first line, or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
