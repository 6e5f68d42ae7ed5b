"""What stands in, while lm-eval's RULER generators run, for what lm-eval would load or fetch.

- a tokenizer: the generators read only `len(tokenizer(text).input_ids)`; the model's count answers;
- the essays: lm-eval's own `get_haystack` runs, with its `datasets.load_dataset` answering the texts
  read locally (lm-eval joins them with a space and splits at whitespace, as it does the dataset's);
- SQuAD and HotpotQA: `download_json` answers the local file's JSON (lm-eval's readers cached it by
  URL: their caches are cleared so that each call reads this run's file);
- NLTK's punkt_tab: lm-eval asks for it when its module is imported and downloads it when missing.
  Sub-tasks that never split sentences get an empty placeholder, so nothing is downloaded; the essay
  sub-tasks need the real model (`python -m nltk.downloader punkt_tab`).

Variable tracking (vt) loops forever in lm-eval where the first size it tries does not fit, so a
length too short for it with this tokenizer is refused before the call.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from evalsuite.errors import UserError

from .calling import replaced, seeded

PUNKT = "tokenizers/punkt_tab"
VT_EXAMPLE = (500, 5)  # vt_utils.get_dataset: its in-context example's tokens, and the noise lines it tries first
_placeholder: list[tempfile.TemporaryDirectory[str]] = []  # kept while the process lives: nltk.data.path names it


@dataclass(frozen=True)
class LocalData:
    """The texts lm-eval downloads, read from local files: essay texts, a QA set's JSON."""

    essays: tuple[str, ...] = ()
    qa_json: Any = None


class Tokenizer:
    """What lm-eval's generators read of a tokenizer: `len(tokenizer(text).input_ids)`."""

    def __init__(self, count: Callable[[str], int]):
        self.count = count

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=range(self.count(text)))


def essay_haystack(original: Callable[[str], Any], data: LocalData) -> Callable[[str], Any]:
    """lm-eval's get_haystack, past its cache, with the essays' `datasets` answering the local texts."""
    rows = SimpleNamespace(load_dataset=lambda *args, **kwargs: {"text": list(_given(data.essays, "the essays"))})

    def haystack(type_haystack: str) -> Any:
        with replaced(importlib.import_module(original.__module__), {"datasets": rows}):
            return original.__wrapped__(type_haystack)  # type: ignore[attr-defined]

    return haystack


def qa_documents(module: ModuleType, data: LocalData, name: str) -> Callable[[str], Any]:
    for cached in (module.read_squad, module.read_hotpotqa):
        cached.cache_clear()
    return lambda url: _given(data.qa_json, f"{name}'s documents")


def _given(value: Any, what: str) -> Any:
    if not value:  # data.py knows which sub-tasks need data; this catches one that lm-eval changed
        raise UserError(f"lm-eval's RULER code asked for {what}, which were not given (-T essays, squad, hotpotqa)")
    return value


def punkt(split_sentences: bool) -> None:
    """NLTK's sentence model for the essay sub-tasks; for the others, a placeholder that keeps lm-eval's
    import from downloading it."""
    import nltk

    with contextlib.suppress(LookupError):
        nltk.data.find(f"{PUNKT}/english/")
        return
    if split_sentences:
        raise UserError("lm-eval's RULER splits the essays into sentences with NLTK's punkt_tab, which is not "
                        "installed: python -m nltk.downloader punkt_tab (or set NLTK_DATA to a folder holding it)")
    if not _placeholder:
        _placeholder.append(tempfile.TemporaryDirectory(prefix="evalsuite-nltk-"))
        (Path(_placeholder[0].name) / PUNKT).mkdir(parents=True)
        nltk.data.path.append(_placeholder[0].name)


def refuse_unfit_vt(module: ModuleType, lengths: Sequence[int], count: Callable[[str], int]) -> None:
    """Where vt's first sizes do not fit (its in-context example's, then its samples' beside that
    example), lm-eval would never finish: one line instead."""
    step = {k: p.default for k, p in inspect.signature(module.sys_vartrack_w_noise_random).parameters.items()}
    with seeded((0, 0)):
        example = module.generate_input_output(VT_EXAMPLE[1], step["num_chains"], step["num_hops"], is_icl=True)
        smallest = module.generate_input_output(step["incremental"], step["num_chains"], step["num_hops"])
    sized = [count(f"{text} {answer}") + step["tokens_to_generate"] for text, answer in (example, smallest)]
    if sized[0] > VT_EXAMPLE[0]:
        raise UserError(f"lm-eval's RULER vt cannot fit its in-context example in {VT_EXAMPLE[0]} tokens with this "
                        "tokenizer (it would never finish): run vt with a model whose tokenizer packs more text")
    if min(lengths) < VT_EXAMPLE[0] + sized[1]:
        raise UserError(f"lm-eval's RULER vt cannot fit a sample in {min(lengths)} tokens with this tokenizer (it "
                        f"would never finish): give lengths of at least {VT_EXAMPLE[0] + sized[1]}")
