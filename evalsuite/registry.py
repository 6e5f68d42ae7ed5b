"""The one registry: tasks, backends and named models.

evalsuite's own tasks are declared in their folders: each `evalsuite/tasks/<family>/__init__.py`
names its tasks as `TASKS = {"needle": "evalsuite.tasks.needle.task:Needle"}`, read without
importing the task modules, so a task added to the tree is known with no reinstall. Outside packages
declare entry points in one of three groups, which evalsuite reads the first time it needs the
registry:

    [project.entry-points."evalsuite.tasks"]       name = "pkg.module:TaskClass"
    [project.entry-points."evalsuite.backends"]    name = "pkg.module:load_function"
    [project.entry-points."evalsuite.models"]      name = "pkg.module"   (registers named models)

A task, from its folder or an entry point, is imported by one loading function when first asked
for (`get_task`; `load_all` for every one), and one that is declared but cannot be loaded is one line
naming where it is declared and what to fix. An entry point may name a module (its decorators
register) or an object (a task class or backend loader, registered under the entry point's name if
its module did not register it already). A backend's entry point is loaded only when a model spec
picks it, so `evalsuite list` never imports torch or vLLM. evalsuite's own backends and named models
are declared in its pyproject.toml like a plugin's.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
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


@dataclass(frozen=True)
class Declared:
    """A task declared but not yet imported: its object as `module:Name`, and where it is declared."""

    spec: str
    origin: str  # its folder's __init__.py, or "the entry point kv (evalsuite.tasks) of evalsuite-kv"
    fix: str  # what to do when it cannot be loaded


TASK_PACKAGE = "evalsuite.tasks"  # every folder in it that holds a task.py declares its TASKS
TASKS: dict[str, type[Any]] = {}  # loaded
_DECLARED_TASKS: dict[str, Declared] = {}  # declared, imported when first asked for
BACKENDS: dict[str, BackendLoader] = {}
_PENDING_BACKENDS: dict[str, EntryPoint] = {}  # declared, not imported until chosen
MODELS: dict[str, NamedModel] = {}
_declared = False

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


def declare_all() -> None:
    """Read, once, what the task folders and the entry points of the three groups declare; named
    models' modules are loaded (they are light), tasks and backends when first asked for."""
    global _declared
    if _declared:
        return
    _DECLARED_TASKS.update(folder_tasks(TASK_PACKAGE))  # a folder declared wrong stops here, every time
    _declared = True
    for group in GROUPS:
        for ep in sorted(entry_points(group=group), key=lambda e: e.name):
            if group == "evalsuite.tasks" and ep.dist is not None and ep.dist.name == "evalsuite":
                continue  # metadata of an install older than the task folders' tables: the folders hold
            if group == "evalsuite.tasks":
                _declare_plugin_task(ep)
            elif group == "evalsuite.backends":
                _PENDING_BACKENDS.setdefault(ep.name, ep)
            else:
                _load_entry_point(group, ep)


def load_all() -> None:
    """Declare everything, then load every declared task."""
    declare_all()
    for name in sorted(_DECLARED_TASKS):
        _load_task(name)


def folder_tasks(package: str) -> dict[str, Declared]:
    """The tasks that the folders of `package` declare in their `__init__.py` as `TASKS`. A folder
    that holds a task.py and declares none is an error naming the line to add."""
    found: dict[str, Declared] = {}
    root = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(root.__path__, f"{package}."), key=lambda i: i.name):
        if not info.ispkg:
            continue
        family = importlib.import_module(info.name)
        init = Path(family.__file__ or Path(next(iter(family.__path__))) / "__init__.py")
        table = getattr(family, "TASKS", None)
        if table is None:
            if (init.parent / "task.py").is_file():
                short = info.name.rpartition(".")[2]
                raise UserError(f"{init.parent}/ holds a task.py but declares no task: add "
                                f"TASKS = {{\"{short}\": \"{info.name}.task:<TaskClass>\"}} to its __init__.py")
            continue
        if not (isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, str) and ":" in v
                                                for k, v in table.items())):
            raise UserError(f"{init}: TASKS must map task names to \"module:Class\" strings, got {table!r}")
        fix = "correct its entry in TASKS there, or the module it names"
        found.update({name: Declared(spec, str(init), fix) for name, spec in table.items()})
    return found


def _declare_plugin_task(ep: EntryPoint) -> None:
    dist = ep.dist.name if ep.dist is not None else "an installed package"
    declared = Declared(ep.value, f"the entry point {ep.name} (evalsuite.tasks) of {dist}",
                        "reinstall that package as it is now, or correct its entry point")
    before = _DECLARED_TASKS.get(ep.name)
    if before is not None and before.spec != ep.value:
        raise UserError(f"task {ep.name!r} is declared twice: in {before.origin} ({before.spec}) and in "
                        f"{declared.origin} ({ep.value}); rename one")
    _DECLARED_TASKS.setdefault(ep.name, declared)


def _load_task(name: str) -> None:
    """The one loading function of a declared task: import its object, register it (the contract's check)."""
    declared = _DECLARED_TASKS[name]
    module, _, attribute = declared.spec.partition(":")
    try:
        obj = functools.reduce(getattr, filter(None, attribute.split(".")), importlib.import_module(module))
        if isinstance(obj, type) and obj not in TASKS.values():
            register_task(obj)
    except ContractError as exc:
        raise ContractError(f"task {name} ({declared.origin}): {exc}") from None
    except Exception as exc:  # whatever importing it raises, the user gets one line saying where to look
        raise UserError(f"task {name} is declared in {declared.origin} as {declared.spec!r} but cannot be "
                        f"loaded ({type(exc).__name__}: {exc}): {declared.fix}") from None
    if name not in TASKS:
        raise UserError(f"task {name} is declared in {declared.origin} as {declared.spec!r}, which registers "
                        f"no task named {name!r}: {declared.fix}")


def _load_entry_point(group: str, ep: EntryPoint) -> None:
    try:
        obj = ep.load()
    except ContractError as exc:
        raise ContractError(f"plugin {ep.value}: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise UserError(f"plugin {ep.name} ({group} = {ep.value}) cannot be loaded: {exc}") from None
    if inspect.ismodule(obj):
        return  # its decorators registered what it offers
    if group == "evalsuite.backends" and ep.name not in BACKENDS:
        register_backend(ep.name)(obj)


def task_names() -> list[str]:
    """Every task declared or registered, none imported for it."""
    declare_all()
    return sorted(set(TASKS) | set(_DECLARED_TASKS))


def get_task(name: str) -> type[Any]:
    declare_all()
    if name not in TASKS and name in _DECLARED_TASKS:
        _load_task(name)
    if name not in TASKS:
        raise unknown("task", name, task_names())
    return TASKS[name]


def backend_names() -> list[str]:
    declare_all()
    return sorted(set(BACKENDS) | set(_PENDING_BACKENDS))


def get_backend(name: str) -> BackendLoader:
    declare_all()
    if name not in BACKENDS and name in _PENDING_BACKENDS:
        _load_entry_point("evalsuite.backends", _PENDING_BACKENDS.pop(name))
    if name not in BACKENDS:
        raise unknown("backend", name, backend_names())
    return BACKENDS[name]


def resolve_model_name(name: str) -> str | None:
    """The backend spec of a named model, or None when `name` is not one."""
    declare_all()
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
    declare_all()
    return get_task(name) if name in TASKS or name in _DECLARED_TASKS else None


def declared_fields(task: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """An installed task's axes and metrics, which its records must fit (None: not installed here)."""
    cls = installed_task_class(task)
    return None if cls is None else (tuple(cls.group_by), tuple(cls.metrics))


declare_fields(declared_fields)  # every reader of records, resume included, checks them against their task
