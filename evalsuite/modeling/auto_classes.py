"""DIFF V2 folders through transformers' Auto classes after a plain `import evalsuite`.

`transformers.AutoModelForCausalLM.from_pretrained(V2_FOLDER)` needs `diffllama_v2`
registered with `AutoConfig` and `AutoModelForCausalLM`. Registering means importing
the model classes, and so torch and transformers, which `import evalsuite` must not
do. So registration waits for transformers' Auto model module
(`transformers.models.auto.modeling_auto`, which imports torch itself): an import
hook on `sys.meta_path` runs it right after that module is executed, or at once
when it was imported before evalsuite. `AutoConfig` alone, without the Auto model
classes, does not trigger it (`import evalsuite.modeling.diffllama_v2` does).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType

AUTO_MODELS = "transformers.models.auto.modeling_auto"
# evalsuite's own model classes; each module registers its classes when imported
MODEL_MODULES = ("evalsuite.modeling.diffllama_v2", "evalsuite.modeling.motif", "evalsuite.modeling.phi4flash")


def register_v2() -> None:
    """The model module registers its classes when imported (`diffllama_v2.register`)."""
    try:
        for module in MODEL_MODULES:
            importlib.import_module(module)
    except ImportError as exc:
        if "partially initialized module" in str(exc):  # inside transformers' own imports: when they are done
            sys.meta_path.insert(0, _Retry())
            return
        warnings.warn(f"evalsuite could not register diffllama_v2 with transformers: {exc}", stacklevel=2)
    except Exception as exc:  # a transformers without Llama's classes must still import
        warnings.warn(f"evalsuite could not register diffllama_v2 with transformers: {exc}", stacklevel=2)


class _Retry(importlib.abc.MetaPathFinder):
    """Finds nothing: at the next import after the Auto module came in half-way through another of
    transformers' modules, registers, once that module is whole."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        layers = sys.modules.get("transformers.modeling_layers")
        if layers is None or getattr(getattr(layers, "__spec__", None), "_initializing", False):
            return None
        sys.meta_path.remove(self)
        register_v2()
        return None


class _ThenRun(importlib.abc.Loader):
    """A loader that executes the module with its own loader, then runs `after`."""

    def __init__(self, inner: importlib.abc.Loader, after: Callable[[], None]) -> None:
        self.inner, self.after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the spec the other finders give `name`, once."""

    def __init__(self, name: str, after: Callable[[], None]) -> None:
        self.name, self.after = name, after

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the module is imported once per process
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRun(spec.loader, self.after)
                return spec
        return None


def install() -> None:
    """Register now if transformers' Auto model classes are loaded, else when they are."""
    if AUTO_MODELS in sys.modules:
        register_v2()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(AUTO_MODELS, register_v2))
