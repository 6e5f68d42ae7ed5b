"""The one place that calls lm-evaluation-harness's RULER code (lm_eval/tasks/ruler/), reached through
the seam for lm-eval's internals (modeling/lmeval_compat.py); stored.py calls it only where the
generated-data cache holds no samples yet.

A sub-task is one of lm-eval's YAML files there. Its `custom_dataset` function makes the samples,
called as lm-eval calls it when it builds that one task in a fresh process: with `max_seq_lengths`,
after `random.seed(seed)` and `np.random.seed(numpy_seed)` (lm-eval's `--seed`, by default 0 and
1234) and the draws lm-eval's imports make after its seed (calling.py), with module-level generators
(cwe's word shuffler) as at import (the module is reloaded). While the call lasts, the generator's
module sees three names replaced (stand_ins.py): `get_tokenizer` (the model's own count sizes the
prompts, where lm-eval loads a tokenizer by name), and the `datasets` of its essay haystack and its
`download_json` (local files for what lm-eval downloads).

lm-eval 0.4.12 and 0.4.13 differ in how the tokenizer reaches the generators (0.4.12's cwe and fwe
load it by name inside `get_dataset`); both call `get_tokenizer` from the sub-task's own module, the
name replaced, so one call serves both.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError, first_line
from evalsuite.modeling import lmeval_compat

from .calling import quiet, replaced, seeded
from .stand_ins import LocalData, Tokenizer, essay_haystack, punkt, qa_documents, refuse_unfit_vt


@dataclass(frozen=True)
class Setting:
    """What lm-eval's YAML says of a sub-task beyond its samples."""

    module: str  # niah_utils: the RULER module holding it
    function: str  # niah_single_1: its custom_dataset function
    max_new_tokens: int  # generation_kwargs.max_gen_toks
    delimiter: str  # target_delimiter: between the input and gen_prefix in a plain prompt
    rule: str  # process_results: process_results (all references) or process_results_part


def setting(name: str) -> Setting:
    """The sub-task's YAML as lm-eval reads it (its `include` followed, its functions not imported)."""
    if not lmeval_compat.installed():
        raise UserError("the ruler task runs lm-eval's RULER code: pip install 'evalsuite[lmeval]'")
    config = lmeval_compat.ruler_yaml(name)
    module, _, function = Path(str(config["custom_dataset"])).name.partition(".")
    generation = config.get("generation_kwargs", {})
    return Setting(module=module, function=function,
                   max_new_tokens=int(generation.get("max_gen_toks", 256)),
                   delimiter=str(config.get("target_delimiter", " ")), rule=Path(str(config["process_results"])).name)


def prompt(model: Any, text: str, gen_prefix: str, delimiter: str) -> str:
    """lm-eval's prompt: the input as the user's turn and gen_prefix starting the answer; without a
    chat template, the YAML's delimiter between them where neither side has a space at the join."""
    if model.chat_template:
        return str(model.format_user_turn(text, gen_prefix))
    joint = delimiter if lmeval_compat.requires_delimiter(text, gen_prefix) else ""
    return str(model.format_user_turn(text + joint, gen_prefix))


def generate(name: str, found: Setting, lengths: Sequence[int], seeds: tuple[int, int], count: Callable[[str], int],
             data: LocalData, split_sentences: bool) -> list[dict[str, Any]]:
    """lm-eval's samples of sub-task `name` (its YAML's `found` settings) at `lengths` (in that order,
    as one lm-eval command makes them), sized by `count`."""
    punkt(split_sentences)
    module = lmeval_compat.ruler_module(found.module)
    if isinstance(getattr(module, "RNG", None), random.Random):  # cwe's word shuffler, drawn from at each sample:
        module = importlib.reload(module)  # as a fresh lm-eval process has it
    names: dict[str, Any] = {"get_tokenizer": lambda *args, **kwargs: Tokenizer(count)}
    if hasattr(module, "get_haystack"):  # the niah module: essays through lm-eval's own get_haystack
        names["get_haystack"] = essay_haystack(module.get_haystack, data)
    if hasattr(module, "download_json"):
        names["download_json"] = qa_documents(module, data, name)
    if name == "vt":
        refuse_unfit_vt(module, lengths, count)
    try:
        with replaced(module, names), seeded(seeds), quiet():
            made = getattr(module, found.function)(max_seq_lengths=list(lengths))
    except (ValueError, LookupError) as exc:  # lm-eval's refusals (no sample fits), NLTK's missing model
        if isinstance(exc, (KeyError, IndexError)):
            raise
        raise UserError(f"lm-eval's RULER {name} at lengths {list(lengths)}: {first_line(exc)}") from None
    return [dict(row) for row in made["test"]]
