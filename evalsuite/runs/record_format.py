"""What a record line must hold to be read as one of a run's records.

Each line on its own: `id`, `task`, `model` and `run` (the run's hash) are
non-empty strings; `axes`, `scores`, `info` and `prompt` are objects; an axis
value is text, a number, true/false or null (axes are grouped and sorted);
`target` is a list of strings; `outputs` a list; `error` text or null.

The lines together: a field of `axes` or `scores` holds one kind of value
across the run. Where most records hold a number (or true/false) there, a line
holding text, a list or an object there is damaged, and the other way round;
null fits any kind. The rule needs no knowledge of the task, so it holds for a
plugin's records too.

Where the run's task is installed, a line must also fit what the task declares
(`check_declared`): its axes hold at least one of the task's axes, and each of
the task's metrics it holds is a number, true/false or null. A run of one
record, or one whose records are all damaged alike, has no majority to be
measured against, and this rule still catches it.

config.json's fields that readers take apart (`check_config`): `params` and
`model` are objects, `checkpoint` an object or null with a whole-number step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Fields(Protocol):
    """What the one-kind-per-field rule reads of a record."""

    @property
    def axes(self) -> Mapping[str, Any]: ...

    @property
    def scores(self) -> Mapping[str, Any]: ...


SCALAR = (str, int, float, bool, type(None))  # what an axis value may be
NUMBER = "a number"  # the kind of value of a field that holds numbers or true/false


def check_fields(values: Mapping[str, Any]) -> None:
    """ValueError naming the first field that breaks the record format."""
    for key in ("id", "task", "model", "run"):  # a record without its run's hash belongs to no run
        if not isinstance(values.get(key), str) or not values[key]:
            raise ValueError(f"{key!r} is not a non-empty string")
    for key in ("axes", "info", "scores", "prompt"):
        if not isinstance(values.get(key), Mapping):
            raise ValueError(f"{key!r} is not an object")
    for axis, value in values["axes"].items():
        if not isinstance(value, SCALAR):  # axes are grouped and sorted: a list or object cannot be
            raise ValueError(f"axis {axis!r} is not text, a number, true/false or null")
    target = values.get("target")
    if not isinstance(target, (list, tuple)) or not all(isinstance(t, str) for t in target):
        raise ValueError("'target' is not a list of strings")
    if not isinstance(values.get("outputs"), (list, tuple)):
        raise ValueError("'outputs' is not a list")
    if not isinstance(values.get("error"), (str, type(None))):
        raise ValueError("'error' is neither text nor null")


def check_declared(fields: Fields, axes: Sequence[str], metrics: Sequence[str]) -> str | None:
    """Why a record does not fit its task's declared axes and metrics (None: it fits). Only some
    of the axes need be there (zeroshot names `bits` only when it sweeps them), and a record
    without scores is a sample the task skipped on purpose."""
    if axes and not any(axis in fields.axes for axis in axes):
        return f"'axes' holds none of the task's axes ({', '.join(axes)})"
    for metric in metrics:
        kind = _kind(fields.scores.get(metric))
        if kind not in (None, NUMBER):
            return f"scores {metric!r} is {kind}, not a number or true/false"
    return None


def check_config(config: Mapping[str, Any]) -> None:
    """ValueError naming the first field of config.json that readers cannot take apart."""
    for key in ("params", "model"):
        if key in config and not isinstance(config[key], Mapping):
            raise ValueError(f"{key!r} is not an object")
    checkpoint = config.get("checkpoint")
    if checkpoint is None:
        return
    if not isinstance(checkpoint, Mapping):
        raise ValueError("'checkpoint' is neither an object nor null")
    step = checkpoint.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError("'checkpoint' step is not a whole number of training steps")


def _kind(value: Any) -> str | None:
    """The kind of value a field holds, for the one-kind-per-field rule; null is any kind."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        return NUMBER
    return "text" if isinstance(value, str) else "a list or object"


def odd_kinds(records: Sequence[Fields]) -> dict[int, str]:
    """Index -> why, for the records that hold, in a field of `axes` or `scores`, another kind of
    value than most of the run's records hold there (a number where the rest hold text is damage,
    and text or a list where the rest hold numbers). A tie counts for numbers: a two-record run
    with 1024 and "abc" keeps the number."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for record in records:
        for section, fields in (("axes", record.axes), ("scores", record.scores)):
            for key, value in fields.items():
                kind = _kind(value)
                if kind is not None:
                    tally = counts.setdefault((section, key), {})
                    tally[kind] = tally.get(kind, 0) + 1
    expected = {where: max(tally, key=lambda kind: (tally[kind], kind == NUMBER))
                for where, tally in counts.items() if len(tally) > 1}
    odd: dict[int, str] = {}
    for index, record in enumerate(records):
        for (section, key), kind in expected.items():
            found = _kind((record.axes if section == "axes" else record.scores).get(key))
            if found not in (None, kind):
                odd[index] = f"{section} {key!r} is {found} where the run's other records hold {kind}"
                break
    return odd
