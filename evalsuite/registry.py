"""The one registry: tasks, backends and named models.

Everything registers the same way, built-in or not. A package declares entry
points in one of three groups, and evalsuite loads them (`EntryPoint.load()`)
the first time it needs the registry:

    [project.entry-points."evalsuite.tasks"]       name = "pkg.module:TaskClass"
    [project.entry-points."evalsuite.backends"]    name = "pkg.module:load_function"
    [project.entry-points."evalsuite.models"]      name = "pkg.module"   (registers named models)

An entry point may name a module (its decorators register) or an object (a
task class or backend loader, registered under the entry point's name if its
module did not register it already). A backend's entry point is loaded only
when a model spec picks it, so `evalsuite list` never imports torch or vLLM.
evalsuite's own tasks and backends are declared in its pyproject.toml exactly
like this.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from evalsuite.runs.records import declare_fields

from .contracts import ContractError, validate_task
from .errors import UserError, unknown

if TYPE_CHECKING:
    from .contracts import ModelAdapter

GROUPS = ("evalsuite.tasks", "evalsuite.backends", "evalsuite.models")


class BackendLoader(Protocol):
    """Loads a model for `<backend>:<rest>` specs (`rest` is what follows the colon). A loader may
    also carry a `check(rest, options)` attribute that refuses, without loading weights, what the
    load would refuse: a run of several models calls it for every model after the first before the
    first loads (`evalsuite.backends.check_model`)."""

    def __call__(self, rest: str, options: Mapping[str, str], *, device: str, batch_size: int,
                 label: str | None) -> ModelAdapter: ...


@dataclass(frozen=True)
class NamedModel:
    resolve: Callable[[], str]  # -> a backend spec, e.g. "hf:/path/to/toy-diff"
    description: str


TASKS: dict[str, type[Any]] = {}
BACKENDS: dict[str, BackendLoader] = {}
_PENDING_BACKENDS: dict[str, EntryPoint] = {}  # declared, not imported until chosen
MODELS: dict[str, NamedModel] = {}
_loaded = False

T = TypeVar("T", bound=type)


def register_task(cls: T) -> T:
    """Class decorator for a task: a frozen dataclass meeting `contracts.Task`."""
    validate_task(cls)
    existing = TASKS.get(cls.name)  # type: ignore[attr-defined]
    if existing is not None and existing is not cls:
        raise ContractError(f"task {cls.name!r} is registered twice ({existing.__module__} and "  # type: ignore[attr-defined]
                            f"{cls.__module__})")
    TASKS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def register_backend(name: str) -> Callable[[Any], Any]:
    """Decorator for a backend loader, selected by model specs `name:...`."""

    def wrap(loader: Any) -> Any:
        if not callable(loader):
            raise ContractError(f"backend {name!r} must be a callable loader")
        existing = BACKENDS.get(name)
        if existing is not None and existing is not loader:
            raise ContractError(f"backend {name!r} is registered twice")
        BACKENDS[name] = loader
        return loader

    return wrap


def register_model(name: str, description: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Decorator for a function that resolves a named model to a backend spec."""

    def wrap(resolve: Callable[[], str]) -> Callable[[], str]:
        MODELS[name] = NamedModel(resolve, description)
        return resolve

    return wrap


def load_all() -> None:
    """Load every entry point of the three groups, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for group in GROUPS:
        for ep in sorted(entry_points(group=group), key=lambda e: (not e.value.startswith("evalsuite."), e.name)):
            if group == "evalsuite.backends":
                _PENDING_BACKENDS.setdefault(ep.name, ep)
            else:
                _load_entry_point(group, ep)


def _load_entry_point(group: str, ep: EntryPoint) -> None:
    try:
        obj = ep.load()
    except ContractError as exc:
        raise ContractError(f"plugin {ep.value}: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise UserError(f"plugin {ep.name} ({group} = {ep.value}) cannot be loaded: {exc}") from None
    if inspect.ismodule(obj):
        return  # its decorators registered what it offers
    if group == "evalsuite.tasks" and isinstance(obj, type) and obj not in TASKS.values():
        register_task(obj)
    elif group == "evalsuite.backends" and ep.name not in BACKENDS:
        register_backend(ep.name)(obj)


def get_task(name: str) -> type[Any]:
    load_all()
    if name not in TASKS:
        raise unknown("task", name, TASKS)
    return TASKS[name]


def backend_names() -> list[str]:
    load_all()
    return sorted(set(BACKENDS) | set(_PENDING_BACKENDS))


def get_backend(name: str) -> BackendLoader:
    load_all()
    if name not in BACKENDS and name in _PENDING_BACKENDS:
        _load_entry_point("evalsuite.backends", _PENDING_BACKENDS.pop(name))
    if name not in BACKENDS:
        raise unknown("backend", name, backend_names())
    return BACKENDS[name]


def resolve_model_name(name: str) -> str | None:
    """The backend spec of a named model, or None when `name` is not one."""
    load_all()
    entry = MODELS.get(name)
    return entry.resolve() if entry else None


def describe() -> dict[str, Any]:
    load_all()
    return {
        "tasks": {n: (t.__doc__ or "").strip().splitlines()[0] for n, t in sorted(TASKS.items())},
        "backends": backend_names(),
        "models": {n: m.description for n, m in sorted(MODELS.items())},
        "presets": {n: sorted(t.presets) for n, t in sorted(TASKS.items())},
    }


def installed_task_class(name: str) -> type[Any] | None:
    """The task class registered under `name`, or None when no installed package offers it."""
    load_all()
    return TASKS.get(name)


def declared_fields(task: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """An installed task's axes and metrics, which its records must fit (None: not installed here)."""
    cls = installed_task_class(task)
    return None if cls is None else (tuple(cls.group_by), tuple(cls.metrics))


declare_fields(declared_fields)  # every reader of records, resume included, checks them against their task
