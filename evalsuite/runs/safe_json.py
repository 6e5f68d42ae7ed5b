"""Reading JSON that a file on disk holds, whatever a damaged or crafted file puts in it.

The files a run leaves (config.json, samples.jsonl, summary.json, a judge's verdicts, the
watcher's ledger) are read back by every analysis command and by a resumed run. Whatever a
line or file holds (bytes that are not UTF-8, text that is not JSON, a number of 100,000
digits, arrays nested 100,000 deep that would exhaust Python's recursion), reading it here
raises `DamagedJSON`, a ValueError saying why in a few words, and nothing else: a reader
quarantines the line or refuses the file with one line, never a traceback.

Nesting is capped at MAX_DEPTH, far beyond what this project writes, so a value that parses
cannot exhaust the recursion of code that walks it afterwards (record checks, pandas, json.dumps).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_DEPTH = 64  # levels of arrays and objects; a record, a config or a summary uses fewer than ten


class DamagedJSON(ValueError):
    """A line or file that is not JSON this project can read; the message says why."""


def loads(data: bytes | str) -> Any:
    """The JSON value of `data`, or DamagedJSON: not UTF-8, not JSON, a number too long to
    convert, or nested deeper than MAX_DEPTH."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise DamagedJSON("not UTF-8 text") from None
    try:
        value = json.loads(data)
    except RecursionError:  # the decoder's own guard, far past MAX_DEPTH
        raise DamagedJSON(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise DamagedJSON(f"not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # an integer longer than Python converts
        raise DamagedJSON(f"not readable JSON ({exc})") from None
    # Each level opens a bracket: with no more brackets than levels allowed, no walk is needed.
    if data.count("[") + data.count("{") > MAX_DEPTH and _too_deep(value):
        raise DamagedJSON(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _too_deep(value: Any) -> bool:
    """Whether `value` nests arrays and objects past MAX_DEPTH (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def holds(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a parsed value is of one of `kinds`; true and false are not numbers here."""
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def read_json(path: Path) -> Any:
    """The JSON value a whole file holds: OSError when it cannot be read, DamagedJSON when
    what it holds is not readable JSON."""
    return loads(path.read_bytes())


@dataclass(frozen=True)
class Line:
    """One line of a JSON-lines file: its bytes, and its value or why it has none."""

    raw: bytes
    value: Any = None
    damage: str | None = None  # why the line is not readable JSON; None when it is
    torn: bool = False  # the file's last line, without its newline: a write cut short

    @property
    def text(self) -> bytes:
        """The line as kept aside in a rejected-lines file: newline-terminated."""
        return self.raw if self.raw.endswith(b"\n") else self.raw + b"\n"


def json_lines(raw: bytes) -> Iterator[Line]:
    """Each non-blank line of a JSON-lines file's bytes, parsed; a torn last line is given
    (marked, not parsed) so that the reader decides whether it is a killed write or damage."""
    lines = raw.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if index == len(lines) - 1 and not line.endswith(b"\n"):
            yield Line(line, damage="the file's last line is cut short", torn=True)
        elif line.strip():
            try:
                yield Line(line, value=loads(line))
            except DamagedJSON as exc:
                yield Line(line, damage=str(exc))
