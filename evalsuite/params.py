"""`key=value` options (-T for tasks, -M for models) parsed into typed values.

Task parameters are the fields of a frozen dataclass; each value is converted
to the field's annotated type so that `-T samples=two` fails with a clear
message instead of deep inside a run. Numbers are ASCII digits only (Python's
int() also reads full-width and other Unicode digits). Two str types normalise
what they hold, so that two spellings of one configuration hash alike (one run
folder): `PathText` (a file or folder, made absolute) and `CountList` (counts,
sorted, each once).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from .errors import UserError, unknown


def split_pairs(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """['a=1', 'b=x'] -> {'a': '1', 'b': 'x'}; later keys win."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{flag} expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


class PathText(str):
    """A parameter naming a file or folder. One that exists is held as its absolute path, so that
    `data=x.jsonl` and `data=/abs/x.jsonl` are one configuration; other text (a keyword such as
    `builtin`, `dataset:NAME`, a missing file that the task reports) is held as given."""

    __slots__ = ()
    keywords: ClassVar[tuple[str, ...]] = ()  # words that name no file even when a file of that name exists

    def __new__(cls, text: str = "") -> PathText:
        path = Path(text).expanduser()
        if text and text not in cls.keywords and path.exists():
            text = str(path.resolve())
        return super().__new__(cls, text)


class CountList(str):
    """A comma list of positive counts (or a keyword such as `auto`), held sorted with each count
    once: `4,1,1` and `1,4` plan the same samples, so they are one configuration."""

    __slots__ = ()

    def __new__(cls, text: str = "") -> CountList:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not all(part.isascii() for part in parts):
            raise ValueError("counts are written with the digits 0-9")
        if parts and all(part.isdigit() for part in parts):
            text = ",".join(str(n) for n in sorted({int(part) for part in parts}))
        return super().__new__(cls, text)


def convert(value: str, tp: Any, key: str) -> Any:
    """Convert a command-line string to `tp` (bool, int, float, str, tuple[...])."""
    tp = _strip_optional(tp)
    try:
        if tp is bool:
            lowered = value.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if tp in (int, float):
            if not value.isascii():  # int("１２") is 12: a number is written with the digits 0-9
                raise ValueError(value)
            return tp(value)
        if isinstance(tp, type) and issubclass(tp, str):  # a str type may normalise, or refuse with its reason
            return _text(tp, value, key)
        if typing.get_origin(tp) is tuple:
            item_type = typing.get_args(tp)[0]
            return tuple(convert(v, item_type, key) for v in value.split(",") if v.strip())
    except ValueError:
        name = getattr(tp, "__name__", str(tp))
        raise UserError(f"bad value for {key}: {value!r} is not a valid {name}") from None
    raise AssertionError(f"unsupported parameter type {tp!r} for {key}")


def _text(tp: type, value: str, key: str) -> Any:
    try:
        return tp(value)
    except ValueError as exc:
        if tp is str or not str(exc):
            raise
        raise UserError(f"bad value for {key}: {value!r}: {exc}") from None


def build_params(cls: type, raw: Mapping[str, str], flag: str = "-T") -> Any:
    """Instantiate the frozen dataclass `cls` from string options."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise unknown(f"{flag} key for {getattr(cls, 'name', cls.__name__)}", key, fields)
        values[key] = convert(value, hints[key], f"{flag} {key}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


def option_text(value: Any) -> str:
    """A Python value as the `key=value` text the command line would give (the API's keywords)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(v) for v in value)
    return str(value)


def to_jsonable(params: Any) -> dict[str, Any]:
    """A task's parameters as plain JSON (tuples become lists). A parameter the task lists in
    `quiet_defaults` (a member of the task contract, `contracts.TaskBase`: parameters added after
    runs were recorded) is left out while at the value that keeps those runs' samples, so they keep
    their identity and hash and pair with new runs. Any other dataclass has none."""
    quiet = getattr(type(params), "quiet_defaults", {})
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(params).items()
            if not (k in quiet and v == quiet[k])}
