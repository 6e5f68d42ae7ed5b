"""The contracts every task and backend is written against, built-in or not.

    task.py      Task (plan / requests / score), TaskBase's hook defaults, TaskView, RunStep
    adapter.py   ModelAdapter, the capabilities beyond it and their protocols, the check at load
"""

from .adapter import (
    ACTIVATION_PROBE,
    ATTENTION_ALLOCATION,
    ATTENTION_QUANTIZATION,
    BATCH_LIMITS,
    CAPABILITIES,
    PREFIX_CACHE,
    PROTOCOLS,
    SCRIPTED_ANSWERS,
    TOKEN_IDS,
    TOKEN_LOGLIKELIHOOD,
    TOKEN_NLL,
    ActivationObserver,
    ActivationProbe,
    AttentionAllocation,
    BatchLimits,
    ContractError,
    ModelAdapter,
    PrefixCaching,
    ProbeRequest,
    QuantizedAttention,
    ScriptedAnswers,
    TokenIds,
    TokenLoglikelihood,
    TokenNLL,
    capabilities_of,
    missing_capabilities,
    offers,
    tell_expected_answers,
    validate_adapter,
)
from .task import RunStep, Task, TaskBase, TaskView, validate_task

__all__ = [
    "ACTIVATION_PROBE", "ATTENTION_ALLOCATION", "ATTENTION_QUANTIZATION", "ActivationObserver", "ActivationProbe",
    "AttentionAllocation", "BATCH_LIMITS", "BatchLimits", "CAPABILITIES", "ContractError", "ModelAdapter", "PREFIX_CACHE",
    "PROTOCOLS", "PrefixCaching", "ProbeRequest", "QuantizedAttention", "RunStep", "SCRIPTED_ANSWERS", "ScriptedAnswers",
    "TOKEN_IDS", "TOKEN_LOGLIKELIHOOD", "TOKEN_NLL", "Task", "TaskBase", "TaskView", "TokenIds", "TokenLoglikelihood",
    "TokenNLL", "capabilities_of", "missing_capabilities", "offers", "tell_expected_answers", "validate_adapter",
    "validate_task"
]
