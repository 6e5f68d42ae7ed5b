"""Backends behind the model adapter, chosen by the model spec.

    toy-diff, smollm2 ...     a named model from the registry
    fake[:behaviour]          the scripted fake model (tests, demos)
    gguf:PATH                 a GGUF file, loaded through transformers
    hf:PATH_OR_ID / PATH      any transformers causal LM (local folder or hub id)
    NAME:REST                 any backend registered as NAME (entry point group evalsuite.backends)

A spec without a registered backend prefix is a path or hub id for `hf`. Named models are
resolved in one place, `resolve_spec`, which every backend that takes a model spec
(`--model`, `vllm:NAME`, the server backend's `-M tokenizer=NAME`) goes through.
Backends are imported only when a spec picks them, so heavy imports (torch,
transformers, vLLM) happen only for the backend in use.

`check_model` is what can refuse a model without loading its weights (the spec, the `-M`
options, the checkpoint's files and config): a run of several models checks the ones after
the first this way before the first loads (whose own load checks the same before its work), so
a damaged second checkpoint fails in seconds, not after the first model's whole run. Every
loader, built-in or plugin, offers it the same way: a `check(rest, options)` attribute
(`checked_by`, `checked_by_loading`); a loader without one is not checked ahead.

What an adapter offers beyond generate and loglikelihood is what it implements
(`contracts.capabilities_of`); tests/test_backend_conformance.py holds every backend that loads
without downloading weights to the contract and to each capability's protocol.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from evalsuite.contracts import ModelAdapter, missing_capabilities, validate_adapter
from evalsuite.errors import UserError, did_you_mean
from evalsuite.registry import backend_names, get_backend, resolve_model_name

DEFAULT_BACKEND = "hf"
Check = Callable[[str, Mapping[str, str]], None]  # a loader's check(rest, options)
Loader = TypeVar("Loader", bound=Callable[..., Any])


def split_spec(spec: str) -> tuple[str, str]:
    """'vllm:/path' -> ('vllm', '/path'); 'fake' -> ('fake', ''); '/path' -> ('hf', '/path')."""
    kind, sep, rest = spec.partition(":")
    names = backend_names()
    if sep and kind in names:
        return kind, rest
    if not sep and spec in names:
        return spec, ""
    if sep and _BACKEND_WORD.fullmatch(kind) and not Path(spec).expanduser().exists():
        raise UserError(f"model {spec!r}: no backend is named {kind!r}{did_you_mean(kind, names)}; "
                        f"backends: {', '.join(names)}")
    return DEFAULT_BACKEND, spec


# what a backend prefix looks like: a word of two or more characters (a Windows drive letter is one)
_BACKEND_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]+")


def resolve_spec(spec: str) -> tuple[str, str, str | None]:
    """(backend, rest, label) of a model spec: a named model ('toy-diff') becomes the spec it
    stands for ('hf', its folder) labelled with its name; any other spec is split as it is,
    without a label ('gguf:/m/x.gguf' -> ('gguf', '/m/x.gguf', None))."""
    resolved = resolve_model_name(spec)
    kind, rest = split_spec(resolved or spec)
    return kind, rest, spec if resolved else None


def load_model(spec: str, options: Mapping[str, str], device: str = "auto", batch_size: int = 8) -> ModelAdapter:
    """The adapter a model spec names, loaded by its backend with the `-M` options, and checked
    against the adapter contract (`validate_adapter`) before anything uses it."""
    kind, rest, label = resolve_spec(spec)
    model = get_backend(kind)(rest, options, device=device, batch_size=batch_size, label=label)
    validate_adapter(model, kind)
    return model


def check_model(spec: str, options: Mapping[str, str]) -> None:
    """Refuse, in one line, a model that cannot load, without loading its weights (see above):
    the `check` its backend's loader carries, built-in or plugin alike (none: nothing to check)."""
    kind, rest, _ = resolve_spec(spec)
    check: Check | None = getattr(get_backend(kind), "check", None)
    if check is not None:
        check(rest, options)


def checked_by(check: Check) -> Callable[[Loader], Loader]:
    """Decorator: give a backend loader its `check(rest, options)` (registry.BackendLoader), which
    refuses without loading weights what the load would refuse."""

    def attach(loader: Loader) -> Loader:
        setattr(loader, "check", check)  # noqa: B010 (a function's attribute, which mypy cannot declare)
        return loader

    return attach


def checked_by_loading(loader: Loader) -> Loader:
    """Decorator for a backend with no weights to read, which loads in an instant (fake) or just
    asks a server (server): loading it is its check."""

    def check(rest: str, options: Mapping[str, str]) -> None:
        loader(rest, options, device="cpu", batch_size=1, label=None)

    return checked_by(check)(loader)


def require_capabilities(model: ModelAdapter, needed: Sequence[str], task: str) -> None:
    """One line naming the task, the backend and what it lacks, before anything runs."""
    missing = missing_capabilities(model, needed)
    if missing:
        raise UserError(f"task {task} needs {', '.join(missing)}, which model {model.name} "
                        f"({model.fingerprint().get('backend', '?')} backend) does not offer")
