"""One check per lm-eval internal that evalsuite uses (evalsuite/modeling/lmeval_compat.py), and a scan
that no other module of the package names one. CI runs this file at both ends of the tested range
(.ci/run's lowest tier installs lm-eval 0.4.12): when a release changes something the seam reaches,
the test named after it fails."""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

import pytest
import scipy.stats

from evalsuite.modeling import lmeval_compat
from evalsuite.modeling.compat import TESTED, installed_version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalsuite"
SEAM = PACKAGE / "modeling" / "lmeval_compat.py"
HELLASWAG = PACKAGE / "suites" / "data" / "zeroshot"
# lm-eval's documented way to add a model (its model guide): the bridge subclasses `LM` and registers
# itself with `register_model`. Those two names are lm-eval's public interface for a model backend,
# so the bridge names them itself rather than through the seam.
ALLOWED = {("evalsuite/integrations/lmeval.py", "lm_eval.api.model", "LM"),
           ("evalsuite/integrations/lmeval.py", "lm_eval.api.registry", "register_model")}
NAMED = re.compile(r"\blm_eval\.\w")  # a module named as text, for importlib


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def lmeval_uses(path: Path, relative: str) -> list[str]:
    """Each place a module imports lm-eval, or names one of its modules in a string, outside ALLOWED."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{relative}:{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "lm_eval"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "lm_eval":
            found += [f"{relative}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if (relative, node.module, a.name) not in ALLOWED]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            if NAMED.search(node.value):
                found.append(f"{relative}:{node.lineno}: names {node.value[:60]!r}")
    return found


def test_no_module_outside_the_seam_names_an_lmeval_internal():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != SEAM:
            outside += lmeval_uses(path, str(path.relative_to(ROOT)))
    assert not outside, "reach lm-eval through evalsuite/modeling/lmeval_compat.py:\n" + "\n".join(outside)


def test_the_scan_finds_imports_and_module_names_and_lets_the_model_interface_through(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""lm_eval.tasks in a docstring is prose."""\nimport lm_eval.tasks\n'
                      'from lm_eval.api.model import LM\nfrom lm_eval.tasks._yaml_loader import load_yaml\n'
                      'import importlib\nimportlib.import_module("lm_eval.tasks.ruler.niah_utils")\n')
    found = lmeval_uses(module, "evalsuite/integrations/lmeval.py")
    assert [line.split(": ", 1)[1] for line in found] == [
        "import lm_eval.tasks", "from lm_eval.tasks._yaml_loader import load_yaml",
        "names 'lm_eval.tasks.ruler.niah_utils'"]
    assert len(lmeval_uses(module, "evalsuite/tasks/x.py")) == 4  # LM is allowed to the bridge only


def test_the_installed_release_is_inside_the_tested_range():
    version = installed_version("lm-eval")
    assert version is not None and (lmeval_compat.LOW, lmeval_compat.HIGH) == TESTED["lm-eval"]
    from evalsuite.modeling.compat import untested

    assert "lm-eval" not in untested({"lm-eval": version}), version


# ---- RULER ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "function", "max_gen_toks"), [
    ("niah_single_1", "niah_utils.niah_single_1", 128), ("cwe", "cwe_utils.get_cw_dataset", 120),
    ("qa_squad", "qa_utils.get_squad", 32)])
def test_ruler_yaml_follows_includes_and_leaves_functions_as_names(name, function, max_gen_toks):
    config = lmeval_compat.ruler_yaml(name)
    assert str(config["custom_dataset"]).endswith(function)  # a name, not an imported function
    assert config["generation_kwargs"]["max_gen_toks"] == max_gen_toks
    assert str(config["process_results"]).rpartition(".")[2] in ("process_results", "process_results_part")


def test_ruler_modules_hold_the_names_the_task_replaces_and_calls():
    common = lmeval_compat.ruler_module("common_utils")
    assert callable(common.process_results) and callable(common.process_results_part)
    qa = lmeval_compat.ruler_module("qa_utils")
    for name in ("download_json", "read_squad", "read_hotpotqa", "get_squad", "get_hotpotqa"):
        assert callable(getattr(qa, name)), name
    assert hasattr(qa.read_squad, "cache_clear")  # the task clears lm-eval's cache of the documents


def test_the_seed_draws_script_imports_every_ruler_module_a_yaml_names():
    named = {Path(str(lmeval_compat.ruler_yaml(n)["custom_dataset"])).name.partition(".")[0]
             for n in ("niah_single_1", "vt", "cwe", "fwe", "qa_squad")}
    script = lmeval_compat.SEED_DRAWS_SCRIPT
    assert all(f"{lmeval_compat.RULER_PACKAGE}.{module}" in script for module in named - {"niah_utils"})
    assert "import nltk" in script  # what niah_utils imports after the seed (its YAML is every one's base)


@pytest.mark.parametrize(("text", "prefix", "expected"), [
    ("Question: what?", "Answer:", True), ("Question: what? ", "Answer:", False), ("Q", " A", False),
    ("", "Answer:", False)])
def test_requires_delimiter_is_true_only_without_whitespace_at_the_join(text, prefix, expected):
    assert lmeval_compat.requires_delimiter(text, prefix) is expected


# ---- task definitions and metrics -------------------------------------------------------------------------


def test_a_task_loads_from_its_folder_with_local_data_and_its_filters():
    manager = lmeval_compat.task_manager(["hellaswag"])
    assert "hellaswag" in manager.all_subtasks and "arc_easy" not in manager.all_subtasks
    files = {"data_files": {"validation": str(HELLASWAG / "hellaswag.jsonl")}}
    spec = {"group": "evalsuite_hellaswag", "task": [{"task": "hellaswag", "dataset_path": "json",
                                                      "dataset_name": None, "dataset_kwargs": files,
                                                      "training_split": None, "fewshot_split": None}]}
    tree = lmeval_compat.load_tasks(manager, spec)
    leaves, stack = [], [tree]
    while stack:
        for value in stack.pop().values():
            (stack if isinstance(value, dict) else leaves).append(value)
    (task,) = [leaf for leaf in leaves if isinstance(leaf, lmeval_compat.task_class())]
    assert task.config.task == "hellaswag" and len(task.eval_docs) == 20
    assert [f.name for f in lmeval_compat.task_filters(task)] == ["none"]


def test_metric_aggregation_and_stderr_are_the_mean_and_its_standard_error():
    values = [1.0, 0.0, 1.0, 1.0, 0.0]
    aggregate = lmeval_compat.metric_aggregation("acc")
    assert aggregate(values) == pytest.approx(0.6)
    assert lmeval_compat.metric_aggregation("no_such_metric")(values) == pytest.approx(0.6)
    stderr = lmeval_compat.stderr_function(aggregate, 1000)
    assert stderr is not None and stderr(values) == pytest.approx(scipy.stats.sem(values))


def test_logged_texts_hash_as_sha256_and_odd_values_serialize():
    import numpy as np

    assert lmeval_compat.hash_text("abc") == hashlib.sha256(b"abc").hexdigest()
    assert lmeval_compat.json_default(np.int64(3)) == 3 and sorted(lmeval_compat.json_default({2, 1})) == [1, 2]


# ---- the model bridge -------------------------------------------------------------------------------------


def test_the_model_registry_holds_lmevals_own_models_once_filled():
    from lm_eval.api.registry import get_model

    lmeval_compat.load_model_registry()
    assert get_model("hf").__name__ == "HFLM"


def test_rolling_windows_predict_every_token_once():
    tokens = list(range(10, 35))
    windows = lmeval_compat.rolling_token_windows(tokens, prefix_token=1, max_seq_len=8)
    assert [t for _, predicted in windows for t in predicted] == tokens
    assert windows[0][0] == [1] and all(len(c) + len(p) <= 8 + 1 for c, p in windows)


def test_the_command_line_is_lmevals_console_script():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "lm_eval"]
    assert lmeval_compat.command_line() is script.load()
