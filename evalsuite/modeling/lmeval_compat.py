"""Every use of lm-evaluation-harness below its public entry points, in one module.

evalsuite runs lm-eval's own code where a number carries lm-eval's name: RULER's generators and
their YAML files (tasks/ruler/), the zero-shot task definitions with their filters and metric
registry (tasks/zeroshot/), its rolling windows and its command line (integrations/lmeval.py). Each
thing reached is a function here, stating the releases it was checked on; the rest of the package
calls them and names no lm-eval module, so an upstream change breaks one file, and
tests/test_lmeval_compat.py (one check per function, run in CI at both ends of the range) says which.
The one exception is lm-eval's documented way to add a model (`lm_eval.api.model.LM` and
`lm_eval.api.registry.register_model`), which integrations/lmeval.py subclasses and calls itself.

The tested range is `compat.TESTED["lm-eval"]` (pyproject's `[tool.evalsuite.tested]`). Each function
imports lm-eval when called: importing this module costs nothing, and a process that never calls one
(a run whose RULER samples come from the generated-data cache) never imports lm-eval's task code.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .compat import TESTED

LOW, HIGH = TESTED["lm-eval"]
PACKAGE = "lm_eval"  # the import name (the distribution is lm-eval)
RULER_PACKAGE = f"{PACKAGE}.tasks.ruler"


def installed() -> bool:
    """Whether lm-eval can be imported (without importing it)."""
    return importlib.util.find_spec(PACKAGE) is not None


# ---- RULER (lm_eval/tasks/ruler/): 0.4.12, 0.4.13 --------------------------------------------------------


def ruler_yaml(name: str) -> dict[str, Any]:
    """The YAML of RULER sub-task `name` as lm-eval reads it: its `include` followed, the functions it
    names left as text. Private in 0.4.12 and 0.4.13 (`lm_eval.tasks._yaml_loader.load_yaml`)."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    return dict(load_yaml(Path(lm_eval.tasks.__file__).parent / "ruler" / f"{name}.yaml", resolve_func=False))


def ruler_module(name: str) -> ModuleType:
    """RULER's module `name` (niah_utils, cwe_utils...), whose functions make the samples and whose
    module-level names (`get_tokenizer`, `download_json`, `RNG`...) the task replaces while they run."""
    return importlib.import_module(f"{RULER_PACKAGE}.{name}")


# A fresh lm-eval process imports its command line and evaluator, seeds Python's and numpy's random,
# then imports the RULER modules its YAML files name (0.4.12, 0.4.13): this script does the same and
# prints how many 32-bit draws those imports took from each generator after the seed.
SEED_DRAWS_SCRIPT = f"""
import json, random
import numpy as np
import {PACKAGE}.__main__, {PACKAGE}.evaluator
random.seed(0)
np.random.seed(0)
before = random.getstate(), np.random.get_state()
import nltk, wonderwords
import {RULER_PACKAGE}.common_utils, {RULER_PACKAGE}.cwe_utils, {RULER_PACKAGE}.fwe_utils
import {RULER_PACKAGE}.qa_utils, {RULER_PACKAGE}.vt_utils
python, numpy = random.Random(), np.random.RandomState()
python.setstate(before[0])
numpy.set_state(before[1])
counts = [0, 0]
while python.getstate()[1] != random.getstate()[1] and counts[0] < 1 << 16:
    python.getrandbits(32)
    counts[0] += 1
while str(numpy.get_state()) != str(np.random.get_state()) and counts[1] < 1 << 16:
    numpy.bytes(4)
    counts[1] += 1
print(json.dumps(counts))
"""


def requires_delimiter(text: str, gen_prefix: str) -> bool:
    """Whether lm-eval puts a task's target delimiter between a prompt and its gen_prefix (neither
    side has whitespace at the join): `lm_eval.api.utils.requires_delimiter`, 0.4.12 and 0.4.13."""
    from lm_eval.api.utils import requires_delimiter as requires

    return bool(requires(text, gen_prefix))


# ---- task definitions and metrics (the zeroshot task): 0.4.12, 0.4.13 -----------------------------------


def task_manager(folders: Sequence[str] | None = None) -> Any:
    """lm-eval's task index: of the given folders of its own task catalogue (relative to
    lm_eval/tasks/), or of the whole catalogue (None)."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    if folders is None:
        return TaskManager()
    root = Path(lm_eval.tasks.__file__).parent
    return TaskManager(include_defaults=False, include_path=[str(root / folder) for folder in folders])


def load_tasks(manager: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The tasks a group spec names, as a tree of dicts: `TaskManager.load` (0.4.10 on: flat dicts of
    tasks and groups), else `get_task_dict`."""
    if hasattr(manager, "load"):
        return dict(manager.load([spec])["tasks"])
    from lm_eval.tasks import get_task_dict

    return dict(get_task_dict([spec], manager))


def task_class() -> Any:  # Any: lm-eval's Task, whose members mypy does not see
    """The class of one evaluable lm-eval task (groups are not one): `lm_eval.api.task.Task`."""
    from lm_eval.api.task import Task

    return Task


def task_filters(task: Any) -> list[Any]:
    """A task's filter ensembles, in the order lm-eval applies them (its `_filters`, 0.4.12 and 0.4.13)."""
    return list(getattr(task, "_filters", None) or [])


def metric_aggregation(metric: str) -> Callable[[list[float]], float]:
    """The aggregation lm-eval's metric registry gives `metric` (`get_metric_aggregation`); the mean
    for a metric it does not register."""
    from lm_eval.api.metrics import mean
    from lm_eval.api.registry import get_metric_aggregation

    try:
        return get_metric_aggregation(metric) or mean
    except (KeyError, ValueError):  # 0.4.12 and 0.4.13 raise or return None for an unknown name
        return mean


def stderr_function(aggregate: Callable[[list[float]], float], bootstrap_iters: int
                    ) -> Callable[[list[float]], float] | None:
    """lm-eval's standard error of an aggregation (`stderr_for_metric`): closed form where it has one,
    else its bootstrap; None where it has neither."""
    from lm_eval.api.metrics import stderr_for_metric

    found = stderr_for_metric(metric=aggregate, bootstrap_iters=bootstrap_iters)
    return found if callable(found) else None


def hash_text(text: str) -> str:
    """lm-eval's hash of a logged text (`lm_eval.utils.hash_string`: sha256, hex)."""
    from lm_eval.utils import hash_string

    return str(hash_string(text))


def json_default(value: Any) -> Any:
    """What lm-eval writes for a value JSON cannot hold (`lm_eval.utils.handle_non_serializable`)."""
    from lm_eval.utils import handle_non_serializable

    return handle_non_serializable(value)


# ---- the model bridge (integrations/lmeval.py): 0.4.12, 0.4.13 -------------------------------------------


def load_model_registry() -> None:
    """Fill lm-eval's model registry with its own models. It fills it lazily, only while it is
    empty: registering evalsuite's model first would hide `hf` and the rest."""
    importlib.import_module(f"{PACKAGE}.models")


def rolling_token_windows(tokens: list[int], prefix_token: int, max_seq_len: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's rolling windows over a text's tokens as its hf backend makes them (context of 1:
    every token predicted once), each made disjoint (`get_rolling_token_windows`,
    `make_disjoint_window` of lm_eval.utils)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    return [make_disjoint_window(window) for window in get_rolling_token_windows(
        token_list=tokens, prefix_token=prefix_token, max_seq_len=max_seq_len, context_len=1)]


def command_line() -> Callable[[], None]:
    """lm-eval's command line, reading sys.argv (the `lm-eval` console script's function)."""
    from lm_eval.__main__ import cli_evaluate

    return cli_evaluate
