"""The one registry: tasks and named models.

Tasks register with `@register_task`; outside packages add theirs through the
`evalsuite.tasks` entry-point group (the entry point names a module to import,
whose decorators then register). Named models (`toy-diff`, `smollm2`...) map a
short name to a function that returns a backend spec string.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .errors import unknown

TASKS: dict[str, type] = {}
MODELS: dict[str, tuple[Callable[[], str], str]] = {}

_BUILTIN_TASK_MODULES = (
    "evalsuite.tasks.needle",
    "evalsuite.tasks.icl",
    "evalsuite.tasks.hallucination",
    "evalsuite.tasks.zeroshot",
    "evalsuite.tasks.outliers",
)
_loaded = False


def register_task(cls: type) -> type:
    """Class decorator: a frozen dataclass of parameters with a `name`."""
    assert cls.name not in TASKS, f"task {cls.name} registered twice"
    TASKS[cls.name] = cls
    return cls


def register_model(name: str, description: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Decorator for a function that resolves a named model to a backend spec."""

    def wrap(resolve: Callable[[], str]) -> Callable[[], str]:
        MODELS[name] = (resolve, description)
        return resolve

    return wrap


def load_all() -> None:
    """Import built-in task modules and entry-point plugins, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_TASK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a missing task module is fine, a broken import is not
                raise
    importlib.import_module("evalsuite.models")
    for ep in entry_points(group="evalsuite.tasks"):
        importlib.import_module(ep.value)


def get_task(name: str) -> type:
    load_all()
    if name not in TASKS:
        raise unknown("task", name, TASKS)
    return TASKS[name]


def resolve_model_name(name: str) -> str | None:
    """The backend spec of a named model, or None when `name` is not one."""
    load_all()
    entry = MODELS.get(name)
    return entry[0]() if entry else None


def describe() -> dict[str, Any]:
    load_all()
    return {
        "tasks": {n: (t.__doc__ or "").strip().splitlines()[0] for n, t in sorted(TASKS.items())},
        "models": {n: d for n, (_, d) in sorted(MODELS.items())},
        "presets": {n: sorted(getattr(t, "presets", {})) for n, t in sorted(TASKS.items())},
    }
