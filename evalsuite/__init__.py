"""evalsuite: evaluation harness for long-context language models (DIFF vs baseline).

The public API: the contract types a task or backend is written against, the
registration decorators, and the functions the command line calls (`run`,
`load`, `run_suite`, `score`, `report`, `compare`, `check`; see docs/python-api.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evalsuite.runs.records import Record

from .contracts import (
    CAPABILITIES,
    ContractError,
    ModelAdapter,
    ProbeRequest,
    RunStep,
    Task,
    TaskBase,
    TaskView,
)
from .errors import UserError
from .modeling.auto_classes import install as _install_auto_classes
from .registry import register_backend, register_model, register_task
from .types import GenerationRequest, Loglikelihood, LoglikelihoodRequest, Sample
from .version import __version__

# DIFF V2 folders load through transformers' Auto classes after `import evalsuite`; the
# registration waits for transformers' Auto model module (auto_classes.py), so this stays light
_install_auto_classes()

if TYPE_CHECKING:
    from .api import Results, check, compare, load, report, run, run_suite, score
    from .modeling.diffllama_v2 import DiffLlamaV2Config, DiffLlamaV2ForCausalLM

# run, load, ...: the API's functions, imported when first asked for, so `import evalsuite` stays light
API = ("Results", "check", "compare", "load", "report", "run", "run_suite", "score")
# the DIFF V2 model classes: they import torch and transformers, so they too load on first use
MODEL_CLASSES = ("DiffLlamaV2Config", "DiffLlamaV2ForCausalLM")

__all__ = [
    "CAPABILITIES", "ContractError", "GenerationRequest", "Loglikelihood", "LoglikelihoodRequest", "ModelAdapter",
    "ProbeRequest", "Record", "RunStep", "Sample", "Task", "TaskBase", "TaskView", "UserError",
    "register_backend", "register_model", "register_task", "__version__",
    "Results", "check", "compare", "load", "report", "run", "run_suite", "score",
    "DiffLlamaV2Config", "DiffLlamaV2ForCausalLM",
]


def __getattr__(name: str) -> Any:
    if name in API:
        from . import api

        return getattr(api, name)
    if name in MODEL_CLASSES:
        from .modeling import diffllama_v2

        return getattr(diffllama_v2, name)
    raise AttributeError(f"module 'evalsuite' has no attribute {name!r}")
